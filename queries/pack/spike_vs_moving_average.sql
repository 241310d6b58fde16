-- spike_vs_moving_average.sql: a sudden CPU jump against the host's last five minutes.
--
-- Detects: a sudden spike - a stampede of requests, a runaway query, a GC storm - while
-- it happens, a minute after it starts, however short it is; high_cpu_sustained.sql would
-- only see it after 10 minutes, and only above 90 %.
--
-- Why: baseline is the average of the host's five previous one-minute averages (the OVER
-- frame has to end at the current row, so it is the sum of the last six minus the current
-- one, over 5; rows with fewer than 5 earlier minutes are skipped). 30 CPU points above
-- it within one minute is not organic load growth, which takes many minutes (on the
-- bundled data, apart from the spike, no minute rises more than 21 points above its
-- baseline: batch-02 starting a saturating job, left to high_cpu_sustained.sql). No FOR:
-- a spike is short by nature. RESOLVE WHEN avg_cpu < baseline + 15: resolved once the
-- host is back near its recent level (the baseline itself rises with the spike minutes).
-- A jump down is not a spike; a host that stops working shows in dbscan_outlier.sql.
--
-- Run:    vigil run queries/pack/spike_vs_moving_average.sql
--         vigil run queries/pack/spike_vs_moving_average.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, cpu; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: web-01 jumps from ~36 % to 85-97 % from 10:20:00 to 10:22:30: firing
-- at 10:21 (89.3 % against a baseline of 36.5 %), resolved at 10:23.

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE VIEW cpu_per_minute AS
  SELECT window_start, window_end, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_start, window_end, host;

CREATE OR REPLACE VIEW cpu_vs_recent AS
  SELECT window_end, host, avg_cpu,
         (sum(avg_cpu) OVER last6 - avg_cpu) / 5 AS baseline,
         count(avg_cpu) OVER last6 AS minutes
  FROM cpu_per_minute
  WINDOW last6 AS (PARTITION BY host ORDER BY window_end
                   ROWS BETWEEN 5 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE ALERT cpu_spike AS
  SELECT window_end, host, avg_cpu, baseline
  FROM cpu_vs_recent
  WHERE minutes = 6
ALERT BY host WHEN avg_cpu > baseline + 30 RESOLVE WHEN avg_cpu < baseline + 15
SEVERITY 'warning'
MESSAGE '{host}: CPU jumped to {avg_cpu:.1} % from a 5-minute average of {baseline:.1} %'
RESOLVE MESSAGE '{host}: CPU settled at {avg_cpu:.1} % against a 5-minute average of {baseline:.1} %, spiking since {since}';
