-- machine_multi_metric.sql: many metrics of one machine leave their normal range at once.
--
-- score: smd
--
-- Input: long format `ts,host,metric,value` with many metrics per host (cpu, load, memory,
-- disk, network, tcp counters, ...), e.g. the Server Machine Dataset's 38 metrics.
--
-- What it does:
--   1. 5-minute average of every (host, metric);
--   2. each one's robust z-score against its own last day (288 five-minute windows before
--      it), as in robust_z_hourly.sql, once it has half a day of history;
--   3. per host and window, how many metrics are beyond |z| > 5;
--   4. an alert when 6 or more are: one odd metric is noise on a busy server, six moving
--      together is an incident.
--
-- Run:    vigil run queries/pack/series/machine_multi_metric.sql --input metrics=my.csv

CREATE OR REPLACE STREAM metrics (
  ts     TIMESTAMP,
  host   TEXT,
  metric TEXT,
  value  DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE
) WITH (path = '../../data/nab/machine_temperature_long.csv');

CREATE OR REPLACE VIEW per_metric AS
  SELECT window_end, host, metric, avg(value) AS v
  FROM TUMBLE(metrics, ts, INTERVAL '5' MINUTE)
  GROUP BY window_end, host, metric;

CREATE OR REPLACE VIEW scored AS
  SELECT window_end, host, metric,
         count(v) OVER last_day AS n,
         CASE
           WHEN mad(v) OVER last_day > 0
             THEN 0.6745 * (v - median(v) OVER last_day) / mad(v) OVER last_day
           WHEN stddev(v) OVER last_day > 0
             THEN (v - avg(v) OVER last_day) / stddev(v) OVER last_day
         END AS z
  FROM per_metric
  WINDOW last_day AS (PARTITION BY host, metric ORDER BY window_end
                      ROWS BETWEEN 288 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE VIEW per_host AS
  SELECT window_end, host,
         sum(CASE WHEN n >= 144 AND abs(z) > 5 THEN 1 ELSE 0 END) AS metrics_out
  FROM scored
  GROUP BY window_end, host;

CREATE OR REPLACE ALERT machine_multi_metric AS SELECT window_end, host, metrics_out FROM per_host
ALERT WHEN metrics_out >= 6
  SEVERITY 'critical'
  MESSAGE '{host}: {metrics_out} metrics far from their last day at once'
  RESOLVE MESSAGE '{host}: only {metrics_out} metrics far from their last day now';
