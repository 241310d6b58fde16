-- memory_creep.sql: memory that keeps growing - a leak - long before it runs out.
--
-- Detects: a host whose memory use rises steadily: a leaking process, an unbounded cache,
-- a queue that is not drained. Each host is compared with itself 30 minutes earlier, so
-- hosts with very different normal levels need no per-host threshold.
--
-- Why: five-minute averages of mem (a leak is slow; allocation bursts vanish in the
-- average). growth_30m is the current average minus the host's average 30 minutes earlier
-- (lag of 6 five-minute windows of that host), growth_5m the same against the previous
-- window. More than 10 points in half an hour is far beyond the drift of a healthy host
-- (under 3 points on the bundled data) yet early: a leak of 5 %/10 min passes it about 25
-- minutes in. And still growing, by more than 1 point in the last 5 minutes: memory that
-- jumps once and then stays (a cache warming up, a big data set loaded) passes that test
-- for one window only, so it does not fire. FOR 3 WINDOWS: both hold for three windows in
-- a row (15 minutes), which a leak does and noise does not. RESOLVE WHEN growth_30m < 3:
-- it resolves when the growth has stopped or the process was restarted, not as soon as
-- one window grows less. A host's lag counts its own windows: after a gap in its data, "6
-- windows earlier" is more than 30 minutes ago.
--
-- Run:    vigil run queries/pack/memory_creep.sql
--         vigil run queries/pack/memory_creep.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, mem; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: web-03's mem climbs 0.5 point a minute from 11:30 (50 %) to 12:30
-- (80 %), then its process restarts: firing at 12:05 (since 11:55, growth 13.4 points),
-- resolved at 12:35 after the restart.

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE VIEW mem_per_5m AS
  SELECT window_start, window_end, host, avg(mem) AS avg_mem
  FROM TUMBLE(metrics, ts, INTERVAL '5' MINUTE)
  GROUP BY window_start, window_end, host;

CREATE OR REPLACE ALERT memory_creep AS
  SELECT window_end, host, avg_mem,
         avg_mem - lag(avg_mem, 6) OVER history AS growth_30m,
         avg_mem - lag(avg_mem, 1) OVER history AS growth_5m
  FROM mem_per_5m
  WINDOW history AS (PARTITION BY host ORDER BY window_end)
ALERT BY host WHEN growth_30m > 10 AND growth_5m > 1 FOR 3 WINDOWS
  RESOLVE WHEN growth_30m < 3
SEVERITY 'warning'
MESSAGE '{host}: memory {avg_mem:.1} %, {growth_30m:.1} points more than 30 min earlier'
RESOLVE MESSAGE '{host}: memory no longer climbing, {avg_mem:.1} % ({growth_30m:.1} points in 30 min), creeping since {since}';
