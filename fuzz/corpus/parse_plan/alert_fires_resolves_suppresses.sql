CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
WITH (path = 'metrics.csv');
SELECT window_end, host, avg(cpu) AS avg_cpu
FROM TUMBLE(metrics, ts, INTERVAL '10' SECOND) GROUP BY window_end, host
ALERT WHEN avg_cpu > 90 SEVERITY 'critical' MESSAGE 'cpu on {host} is {avg_cpu:.1}';
