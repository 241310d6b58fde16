-- robust_z_or_new_extreme.sql: an hour far from its own last day, or beyond anything the
-- series has ever done.
--
-- score: nab
--
-- Input: long format `ts,host,metric,value`, like robust_z_hourly.sql.
--
-- What it does: the robust z-score of robust_z_hourly.sql with a stricter cut-off
-- (|z| > 4), OR a new extreme: an hourly mean above the highest (below the lowest) hourly
-- mean of every earlier hour, once two days have been seen. A slow failure that never
-- looks odd against the last day still sets new records; a record after two quiet days
-- is a strong signal on its own.
--
-- Run:    vigil run queries/pack/series/robust_z_or_new_extreme.sql --input metrics=my.csv

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

-- Records so far (this hour included), and the robust z over the last day.
CREATE OR REPLACE VIEW history AS
  SELECT window_end, host, metric, v,
         row_number() OVER all_hours AS hours,
         max(v) OVER all_hours AS high,
         min(v) OVER all_hours AS low,
         count(v) OVER last_day AS n,
         CASE
           WHEN mad(v) OVER last_day > 0
             THEN 0.6745 * (v - median(v) OVER last_day) / mad(v) OVER last_day
           WHEN stddev(v) OVER last_day > 0
             THEN (v - avg(v) OVER last_day) / stddev(v) OVER last_day
         END AS z
  FROM hourly
  WINDOW last_day AS (PARTITION BY host, metric ORDER BY window_end
                      ROWS BETWEEN 24 PRECEDING AND CURRENT ROW),
         all_hours AS (PARTITION BY host, metric ORDER BY window_end
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);

-- The records of the hours before this one.
CREATE OR REPLACE VIEW judged AS
  SELECT window_end, host, metric, v, z, n, hours,
         lag(high) OVER by_hour AS previous_high,
         lag(low) OVER by_hour AS previous_low
  FROM history
  WINDOW by_hour AS (PARTITION BY host, metric ORDER BY window_end);

CREATE OR REPLACE ALERT robust_z_or_new_extreme AS
  SELECT window_end, host, metric, v, z,
         (n >= 25 AND abs(z) > 4) AS far_from_last_day,
         (hours > 48 AND (v > previous_high OR v < previous_low)) AS new_extreme
  FROM judged
ALERT WHEN far_from_last_day OR new_extreme
  SEVERITY 'warning'
  MESSAGE '{host} {metric}: hourly mean {v:.2} (z {z:.1}, new extreme: {new_extreme})'
  RESOLVE MESSAGE '{host} {metric}: hourly mean {v:.2} is ordinary again (z {z:.1})';
