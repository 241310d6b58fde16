-- shift_or_spike.sql: an hour far from the two days before it, a sample far from the four
-- days before it, or a level that has moved since the last shift.
--
-- score: nab
--
-- Input: long format `ts,host,metric,value` (any sampling step of a minute or more); every
-- (host, metric) pair is its own series. Bundled sample: the NAB machine-temperature series,
-- data/nab/machine_temperature_long.csv.
--
-- Two alerts, each scored with `change_score`, the robust distance of the latest value(s)
-- from the values before them (median and MAD, never below the standard deviation):
--   1. `hour_shift`: the hourly mean against the 48 hours before it; fires beyond 4, once
--      there are 48 hours of history. A slow drift or a level change shows here.
--   2. `sample_spike`: each sample (a 1-minute TUMBLE holds one sample at steps of a minute
--      or more), and the median of the last 6, against the 1152 samples before them (4 days
--      at 5-minute steps); fires beyond 8. A minute-scale anomaly that an hourly mean would
--      average away shows here.
--   3. `level_shift`: `cusum` over the hourly means, the self-starting two-sided CUSUM
--      (allowance 2, threshold 10, its reference learnt over 48 hours after each shift): a
--      shift too small for one hour to stand out adds up until it fires, once; the function
--      then learns the new level.
-- They keep firing until their condition has been false for a while (24, 6 and 24 hours),
-- so one incident is one alert, not one per sample.
--
-- The numbers were chosen on NAB's realAWSCloudwatch and realKnownCause series only (the
-- tuning set) with `benches/detection/tune.py` (the cusum's allowance and threshold by the
-- tuning set's standard plus reward-low-FP score over k in {0.5, 1, 2} and h in {10, 16,
-- 25, 40}, scored by `benches/detection/score.py --set tune`), and frozen here; the other
-- 34 NAB series are the test set. The README's "Detection quality" section has both sets' scores.
--
-- Run:    vigil run queries/pack/series/shift_or_spike.sql
--         vigil run queries/pack/series/shift_or_spike.sql --input metrics=my.csv
-- Output: one row per state change (firing, resolved) per alert and (host, metric).
--
-- The watermark waits an hour: the NAB machine-temperature file steps back 55 minutes once.

CREATE OR REPLACE STREAM metrics (
  ts     TIMESTAMP,
  host   TEXT,
  metric TEXT,
  value  DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '1' HOUR
) WITH (path = '../../data/nab/machine_temperature_long.csv');

CREATE OR REPLACE VIEW hours AS
  SELECT window_end, host, metric, avg(value) AS v
  FROM TUMBLE(metrics, ts, INTERVAL '1' HOUR)
  GROUP BY window_end, host, metric;

CREATE OR REPLACE VIEW hours_scored AS
  SELECT window_end, host, metric, v,
         count(v) OVER last_two_days AS n,
         change_score(v, 1) OVER last_two_days AS score
  FROM hours
  WINDOW last_two_days AS (PARTITION BY host, metric ORDER BY window_end
                           ROWS BETWEEN 48 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE ALERT hour_shift AS
  SELECT window_end, host, metric, v, score FROM hours_scored WHERE n = 49
ALERT WHEN abs(score) > 4
  KEEP FIRING FOR INTERVAL '24' HOUR
  SEVERITY 'warning'
  MESSAGE '{host} {metric}: hourly mean {v:.2} is {score:.1} deviations from its last two days'
  RESOLVE MESSAGE '{host} {metric}: hourly mean back within its last two days for a day';

CREATE OR REPLACE VIEW samples AS
  SELECT window_end, host, metric, avg(value) AS v
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_end, host, metric;

CREATE OR REPLACE VIEW samples_scored AS
  SELECT window_end, host, metric, v,
         count(v) OVER last_four_days AS n,
         greatest(abs(change_score(v, 1) OVER last_four_days),
                  abs(change_score(v, 6) OVER last_four_days_before_6)) AS score
  FROM samples
  WINDOW last_four_days AS (PARTITION BY host, metric ORDER BY window_end
                            ROWS BETWEEN 1152 PRECEDING AND CURRENT ROW),
         last_four_days_before_6 AS (PARTITION BY host, metric ORDER BY window_end
                                     ROWS BETWEEN 1157 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE ALERT sample_spike AS
  SELECT window_end, host, metric, v, score FROM samples_scored WHERE n = 1153
ALERT WHEN score > 8
  KEEP FIRING FOR INTERVAL '6' HOUR
  SEVERITY 'warning'
  MESSAGE '{host} {metric}: {v:.2} is {score:.1} deviations from its last four days'
  RESOLVE MESSAGE '{host} {metric}: samples back within their last four days for 6 hours';

CREATE OR REPLACE VIEW hours_cusum AS
  SELECT window_end, host, metric, v,
         cusum(v, 2, 10, 48) OVER (PARTITION BY host, metric ORDER BY window_end) AS c
  FROM hours;

CREATE OR REPLACE ALERT level_shift AS
  SELECT window_end, host, metric, v, c FROM hours_cusum
ALERT WHEN abs(c) > 10
  KEEP FIRING FOR INTERVAL '24' HOUR
  SEVERITY 'warning'
  MESSAGE '{host} {metric}: the hourly mean {v:.2} has moved from its level (cusum {c:.1})'
  RESOLVE MESSAGE '{host} {metric}: no further level shift for a day';
