-- high_cpu_rows.sql: a stateless filter.
--
-- Every row of data/metrics.csv whose CPU is strictly above 90 %, passed through as it
-- arrives (no window, no state).
--
-- Run:    vigil run queries/high_cpu_rows.sql
-- Output: 60 rows, those of host web-02 from 09:05:00 to 09:05:59.

CREATE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (connector = 'file', path = 'data/metrics.csv', format = 'csv');

SELECT ts, host, cpu, mem, round(cpu - mem, 1) AS cpu_minus_mem
FROM metrics
WHERE cpu > 90;
