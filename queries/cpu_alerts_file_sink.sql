-- cpu_alerts_file_sink.sql: the same alert written to a CSV file.
--
-- One row per host and 30-second window whose average CPU is strictly above 80 %, written
-- to out/cpu_alerts.csv. The sink path is relative, so it resolves against the directory of
-- this file: queries/out/cpu_alerts.csv. Nothing is written to stdout.
--
-- Run:   vigil run queries/cpu_alerts_file_sink.sql   (creates queries/out/ if needed)
--        cat queries/out/cpu_alerts.csv

CREATE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (connector = 'file', path = 'data/metrics.csv', format = 'csv');

CREATE SINK cpu_alerts WITH (connector = 'file', path = 'out/cpu_alerts.csv', format = 'csv');

INSERT INTO cpu_alerts
SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, max(mem) AS max_mem
FROM TUMBLE(metrics, ts, INTERVAL '30' SECOND)
GROUP BY window_start, window_end, host
HAVING avg(cpu) > 80;
