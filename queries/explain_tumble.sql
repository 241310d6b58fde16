-- explain_tumble.sql: show how vigil plans a windowed query, without running it.
--
-- EXPLAIN prints, as text, the logical plan of the query and the graph of streaming
-- operators vigil would run for it, instead of running the query.
--
-- Run:   vigil run queries/explain_tumble.sql

CREATE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (connector = 'file', path = 'data/metrics.csv', format = 'csv');

EXPLAIN
SELECT window_start, window_end, host, avg(cpu) AS avg_cpu
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND)
WHERE cpu > 0
GROUP BY window_start, window_end, host;
