-- no_data.sql: a host that stops reporting (a deadman alert).
--
-- Detects: a host that has reported before and then sends nothing for 5 minutes: the host
-- is down or unreachable, or its metrics agent died. Every other rule in this pack is
-- blind to a host without data, so run this one next to them.
--
-- Why: WHEN ABSENT FOR INTERVAL '5' MINUTE fires at last row + 5 minutes, once the
-- stream's watermark (the newest timestamp of any host minus the 30 s delay) has passed
-- that time, and resolves with the host's next row. At a 10 s scrape interval 5 minutes
-- is 30 missed reports: an agent restart or a network blip (a minute or two) stays quiet,
-- a dead host pages within minutes. Raise it if your hosts report less often than once a
-- minute. Event time, not wall-clock time: if the whole input stops, nothing fires, and
-- the end of a file is not silence.
--
-- Run:    vigil run queries/pack/no_data.sql
--         vigil run queries/pack/no_data.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host; ts in ISO-8601
-- (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order (the
-- WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: web-04 sends nothing from 13:00:00 to 13:15:00 (its last row is
-- 12:59:53): firing at 13:04:53 (since 12:59:53), resolved at 13:15:03, its next row.

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE ALERT no_data AS
  SELECT ts, host FROM metrics
ALERT BY host WHEN ABSENT FOR INTERVAL '5' MINUTE
SEVERITY 'critical'
MESSAGE 'no metrics from {host} since {since}'
RESOLVE MESSAGE 'metrics from {host} again at {event_time}, silent since {since}';
