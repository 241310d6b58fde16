CREATE STREAM metrics (
  ts TIMESTAMP, host TEXT, cpu DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (connector = 'file', path = 'metrics.csv', format = 'csv');

SELECT host, cpu
FROM metrics
WHERE cpu > > 50;
