CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts)
WITH (path = 'metrics.csv');

SELECT window_start, host, sum(cpu) AS total
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND)
GROUP BY window_start, host
EMIT CHANGES;
