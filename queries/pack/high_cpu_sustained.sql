-- high_cpu_sustained.sql: a host whose CPU stays above 90 % for 10 minutes.
--
-- Detects: saturation - a runaway process, a job stuck in a loop, a host too small for
-- its load - as opposed to the short bursts every busy host has.
--
-- Why: one-minute averages (6 samples at a 10 s scrape) smooth single readings. 90 % is
-- where run queues start to build; FOR INTERVAL '10' MINUTE fires when the first hot
-- minute is 10 minutes old (11 hot minutes in a row) and a minute at or below 90 restarts
-- the count, so bursts, deploys and cron jobs stay quiet. RESOLVE WHEN avg_cpu < 80 is
-- the hysteresis: once firing, the alert waits for a clear drop instead of flapping
-- around 90. A minute between 80 and 90 keeps it firing.
--
-- Run:    vigil run queries/pack/high_cpu_sustained.sql
--         vigil run queries/pack/high_cpu_sustained.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, cpu; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: batch-02 (normally ~78 %) runs at 91-97 % from 10:50 to 11:15:
-- firing at 11:01 (since 10:51, the end of its first hot minute), resolved at 11:16.
-- Nothing else: the batch hosts' normal ~77 % never reaches 90 for long.

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE ALERT high_cpu_sustained AS
  SELECT window_end, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_end, host
ALERT BY host WHEN avg_cpu > 90 FOR INTERVAL '10' MINUTE RESOLVE WHEN avg_cpu < 80
SEVERITY 'critical'
MESSAGE '{host}: CPU above 90 % since {since}, now {avg_cpu:.1} %'
RESOLVE MESSAGE '{host}: CPU down to {avg_cpu:.1} % (below 80 %), high since {since}';
