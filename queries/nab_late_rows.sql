-- nab_late_rows.sql: what a watermark delay does to a real out-of-order stream.
--
-- The NAB machine temperature file (data/nab/) jumps back from 2014-01-07 02:55 to 02:00
-- and replays that hour. Two streams read the same file:
--   temp_strict  has no delay (WATERMARK FOR "timestamp" AS "timestamp"): when the replayed
--                rows arrive the watermark is already 02:55, so the 10 replayed rows from
--                02:00 to 02:45 fall in 10-minute windows that have closed: they are late.
--   temp_relaxed tolerates one hour of disorder: nothing is late.
--
-- Run:   vigil run queries/nab_late_rows.sql > /dev/null
-- Stderr: `vigil: query 1: out=11342 late=10` and `vigil: query 2: out=11342 late=0`
--         (query 2 counts the replayed readings inside its windows instead).

CREATE STREAM temp_strict (
  "timestamp" TIMESTAMP,
  "value"     DOUBLE,
  WATERMARK FOR "timestamp" AS "timestamp"
) WITH (path = 'data/nab/machine_temperature_system_failure.csv');

CREATE STREAM temp_relaxed (
  "timestamp" TIMESTAMP,
  "value"     DOUBLE,
  WATERMARK FOR "timestamp" AS "timestamp" - INTERVAL '1' HOUR
) WITH (path = 'data/nab/machine_temperature_system_failure.csv');

SELECT window_start, window_end, count(*) AS readings, avg("value") AS avg_temp
FROM TUMBLE(temp_strict, "timestamp", INTERVAL '10' MINUTE)
GROUP BY window_start, window_end;

SELECT window_start, window_end, count(*) AS readings, avg("value") AS avg_temp
FROM TUMBLE(temp_relaxed, "timestamp", INTERVAL '10' MINUTE)
GROUP BY window_start, window_end;
