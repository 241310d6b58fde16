CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
WITH (path = 'metrics.csv');
CREATE VIEW per_host AS
  SELECT window_end, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND) GROUP BY window_end, host;
CREATE INVARIANT cpu_range AS SELECT * FROM per_host
  LEARN RANGE OF avg_cpu TRAIN FOR 3 WINDOWS MODE OFFLINE;
CREATE ALERT out_of_range AS SELECT window_end, host, avg_cpu, violation FROM cpu_range
ALERT WHEN violation MESSAGE '{host}: {avg_cpu} outside what was learned';
