-- cpu_alerts_stdout_sink.sql: a windowed alert written through a named sink.
--
-- Declares a sink on standard output in JSON Lines and sends to it one alert per host and
-- 10-second window whose peak CPU is strictly above 90 %. A sink's format is its own: the
-- rows are JSON Lines whatever --format says.
--
-- Run:    vigil run queries/cpu_alerts_stdout_sink.sql
-- Output: 6 rows (JSON Lines), all web-02.

CREATE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (connector = 'file', path = 'data/metrics.csv', format = 'csv');

CREATE SINK alerts WITH (connector = 'stdout', format = 'jsonl');

INSERT INTO alerts
SELECT window_start, window_end, host, max(cpu) AS max_cpu, count(*) AS samples
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND)
GROUP BY window_start, window_end, host
HAVING max(cpu) > 90;
