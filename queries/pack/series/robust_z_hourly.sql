-- robust_z_hourly.sql: an hourly value far from its own last day (robust z-score).
--
-- score: nab
--
-- Input: one row per sample in long format, `ts,host,metric,value` (any sampling period);
-- every (host, metric) pair is its own series. Bundled sample: the NAB machine-temperature
-- series (a real industrial machine before a failure), data/nab/machine_temperature_long.csv.
--
-- What it does:
--   1. hourly average of each series (hourly smooths single-sample noise, which is what
--      makes the per-sample baseline rule fire thousands of times);
--   2. the hour's robust z-score against the series' last 25 hours (24 before it, plus
--      itself): 0.6745 (v - median) / MAD, or (v - mean) / stddev when the MAD is 0 (a flat
--      series with a few steps);
--   3. an alert when |z| > 3.5 (Iglewicz and Hoaglin's outlier cut-off) once the series
--      has a full day of history; it resolves only when |z| falls below 2, so a value that
--      hovers around the threshold is one episode, not many.
--
-- Run:    vigil run queries/pack/series/robust_z_hourly.sql
--         vigil run queries/pack/series/robust_z_hourly.sql --input metrics=my_metrics.csv
-- Output: one row per state change (firing, resolved) per (host, metric). On the bundled
--         machine-temperature series it fires inside the labelled failure windows.
--
-- The watermark waits an hour: the NAB machine-temperature file steps back 55 minutes once.

CREATE OR REPLACE STREAM metrics (
  ts     TIMESTAMP,
  host   TEXT,
  metric TEXT,
  value  DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '1' HOUR
) WITH (path = '../../data/nab/machine_temperature_long.csv');

CREATE OR REPLACE VIEW hourly AS
  SELECT window_end, host, metric, avg(value) AS v
  FROM TUMBLE(metrics, ts, INTERVAL '1' HOUR)
  GROUP BY window_end, host, metric;

CREATE OR REPLACE VIEW scored AS
  SELECT window_end, host, metric, v,
         count(v) OVER last_day AS n,
         CASE
           WHEN mad(v) OVER last_day > 0
             THEN 0.6745 * (v - median(v) OVER last_day) / mad(v) OVER last_day
           WHEN stddev(v) OVER last_day > 0
             THEN (v - avg(v) OVER last_day) / stddev(v) OVER last_day
         END AS z
  FROM hourly
  WINDOW last_day AS (PARTITION BY host, metric ORDER BY window_end
                      ROWS BETWEEN 24 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE ALERT robust_z_hourly AS
  SELECT window_end, host, metric, v, z FROM scored WHERE n >= 25
ALERT WHEN abs(z) > 3.5
  RESOLVE WHEN abs(z) < 2
  SEVERITY 'warning'
  MESSAGE '{host} {metric}: hourly mean {v:.2} is {z:.1} robust deviations from its last day'
  RESOLVE MESSAGE '{host} {metric}: hourly mean {v:.2} is near its last day again (z {z:.1})';
