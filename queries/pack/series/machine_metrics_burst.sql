-- machine_metrics_burst.sql: two or more metrics of one machine jump far from their last
-- four hours in the same minute.
--
-- score: smd
--
-- Input: long format `ts,host,metric,value` with many metrics per host (cpu, load, memory,
-- disk, network, tcp counters, ...) at a one-minute step, e.g. the Server Machine
-- Dataset's 38 metrics.
--
-- What it does:
--   1. one row per (host, metric) and minute;
--   2. each one's `change_score(v, 1)`: the minute against the 240 minutes before it, once
--      it has two hours of history;
--   3. per host and minute, how many metrics are beyond 16;
--   4. an alert while 2 or more are: one odd metric is noise on a busy server, two jumping
--      that far together is an incident. It resolves the first minute fewer than 2 are, so it marks
--      the moments of the incident, not its whole span (see machine_metrics_episode.sql).
--
-- The numbers were chosen on 8 SMD machines (1-6, 1-7, 2-1, 2-2, 2-7, 2-8, 3-3, 3-4; the
-- tuning set) with `benches/detection/tune.py`, and frozen here; the other 11 machines
-- are the test set. The README's "Detection quality" section has both sets' scores.
--
-- Run:    vigil run queries/pack/series/machine_metrics_burst.sql --input metrics=my.csv

CREATE OR REPLACE STREAM metrics (
  ts     TIMESTAMP,
  host   TEXT,
  metric TEXT,
  value  DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE
) WITH (path = '../../data/nab/machine_temperature_long.csv');

CREATE OR REPLACE VIEW per_metric AS
  SELECT window_end, host, metric, avg(value) AS v
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_end, host, metric;

CREATE OR REPLACE VIEW scored AS
  SELECT window_end, host, metric,
         count(v) OVER last_4h AS n,
         change_score(v, 1) OVER last_4h AS z
  FROM per_metric
  WINDOW last_4h AS (PARTITION BY host, metric ORDER BY window_end
                     ROWS BETWEEN 240 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE VIEW per_host AS
  SELECT window_end, host,
         sum(CASE WHEN n >= 121 AND abs(z) > 16 THEN 1 ELSE 0 END) AS metrics_far
  FROM scored
  GROUP BY window_end, host;

CREATE OR REPLACE ALERT machine_metrics_burst AS
  SELECT window_end, host, metrics_far FROM per_host
ALERT WHEN metrics_far >= 2
  SEVERITY 'critical'
  MESSAGE '{host}: {metrics_far} metrics jumped far from their last 4 hours at once'
  RESOLVE MESSAGE '{host}: only {metrics_far} metrics far from their last 4 hours now';
