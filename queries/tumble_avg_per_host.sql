-- tumble_avg_per_host.sql: the flagship example.
--
-- Average, peak and sample count of CPU per host over 10-second tumbling windows of
-- data/metrics.csv (5 hosts, one row per host per second, 10 minutes; a few rows arrive up
-- to 2 s out of order, which the 2-second watermark delay absorbs: no row is late).
--
-- Run:   vigil run queries/tumble_avg_per_host.sql
--        vigil run queries/tumble_avg_per_host.sql --format csv > per_host.csv
-- Output: one row per (window, host) when the window closes: 60 windows x 5 hosts = 300 rows.
--         web-02 shows max_cpu above 90 from 09:05:00 to 09:06:00 (the CPU spike).

CREATE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (connector = 'file', path = 'data/metrics.csv', format = 'csv');

SELECT
  window_start,
  window_end,
  host,
  avg(cpu) AS avg_cpu,
  max(cpu) AS max_cpu,
  count(*) AS samples
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND)
GROUP BY window_start, window_end, host;
