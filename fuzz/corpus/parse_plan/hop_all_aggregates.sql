CREATE STREAM metrics (
  ts TIMESTAMP, host TEXT, cpu DOUBLE, mem DOUBLE,
  WATERMARK FOR ts AS ts
) WITH (connector = 'file', path = 'metrics.csv', format = 'csv');

SELECT window_start, window_end, host,
  count(*) AS n, count(cpu) AS n_cpu, sum(cpu) AS total, avg(cpu) AS mean,
  min(cpu) AS lo, max(cpu) AS hi, stddev(cpu) AS sd, median(cpu) AS med,
  approx_percentile_cont(mem, 0.5) AS p50_mem
FROM HOP(metrics, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
GROUP BY window_start, window_end, host;
