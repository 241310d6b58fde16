-- learned_range.sql: disk I/O outside the range the host showed while training.
--
-- Detects: a host whose disk_io level leaves what it did in a known-good period: debug
-- logging left on, a backup or compaction at the wrong hour, a disk that stalls. No
-- threshold to pick per host: each host's normal range is learned from its own data.
--
-- Why: CREATE INVARIANT learns, per host, the lowest and highest one-minute average of
-- disk_io during the first 2 hours of the stream (TRAIN FOR INTERVAL '2' HOUR, counted
-- from the first window that closes), then judges every later minute. MODE OFFLINE
-- freezes the range: a new level keeps violating for as long as it lasts (ONLINE would
-- learn it on first sight and violate once). One-minute averages (6 samples) rather than
-- raw readings, so the range is not set by a single extreme reading. A healthy host still
-- sets a new record now and then (after 120 training minutes, about one minute in 60 is
-- outside the range by chance); FOR 5 WINDOWS (5 minutes in a row) is what a real change
-- of level does and noise does not. Train on a period that covers your normal cycle (a
-- whole day if load follows the day): a range learned at night makes the morning violate.
-- A host first seen after training has learned nothing: every minute violates.
--
-- Run:    vigil run queries/pack/learned_range.sql
--         vigil run queries/pack/learned_range.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, disk_io; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: training takes the minutes 08:00 to 10:00 (windows ending before
-- 10:01, 2 hours after the first one); web-02's disk_io jumps from ~45/s to ~160/s from
-- 12:10 to 12:35 (learned range [35, 52.4]): firing at 12:15 (since 12:11), resolved at
-- 12:36. Every other host has a few single-minute violations, never 5 in a row.

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE VIEW io_per_minute AS
  SELECT window_start, window_end, host, avg(disk_io) AS avg_io
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_start, window_end, host;

CREATE OR REPLACE INVARIANT io_range AS
  SELECT window_end, host, avg_io FROM io_per_minute
  LEARN RANGE OF avg_io BY host TRAIN FOR INTERVAL '2' HOUR MODE OFFLINE;

CREATE OR REPLACE ALERT disk_io_out_of_range AS
  SELECT window_end, host, avg_io, violation, learned FROM io_range
ALERT BY host WHEN violation FOR 5 WINDOWS
SEVERITY 'warning'
MESSAGE '{host}: disk_io {avg_io:.0}/s, outside the range {learned} learned in training'
RESOLVE MESSAGE '{host}: disk_io {avg_io:.0}/s, back inside the range {learned} (outside since {since})';
