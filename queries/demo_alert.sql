-- demo_alert.sql: an alert over real sensor data, with no data file at all.
--
-- The demo connector replays the machine-temperature series of the Numenta Anomaly
-- Benchmark, which is built into vigil (the same file as
-- data/nab/machine_temperature_system_failure.csv, MIT, see data/nab/PROVENANCE): one
-- reading every 5 minutes from 2013-12-02, with its real timestamps, replayed at 1000
-- readings per second. The alert fires when the hourly average temperature is below 55 for
-- two hours in a row, and resolves once an hour averages above 60 (hysteresis).
--
-- Run:   vigil run queries/demo_alert.sql
--
-- Output: 4 alert rows. It fires about 2 s into the replay (window ending 2013-12-10
-- 08:00), resolves at 2.3 s (window ending 2013-12-10 23:00), fires again at 3.9 s (window
-- ending 2013-12-16 07:00) and resolves at 4 s (window ending 2013-12-16 20:00).
--
-- As written, the stream below ends after 4100 readings (4 s), so the example finishes on
-- its own (the test suite runs every example to the end). To replay the whole series
-- (22,695 readings, about 23 s, 7 episodes), delete the CREATE STREAM statement: the alert
-- then reads the built-in stream demo. `speed` sets the readings per second.

CREATE STREAM demo (
  ts     TIMESTAMP,
  host   TEXT,
  value  DOUBLE,
  WATERMARK FOR ts AS ts
) WITH (connector = 'demo', speed = '1000', limit = '4100');

CREATE ALERT machine_cooling AS
  SELECT window_end, host, avg(value) AS avg_temp
  FROM TUMBLE(demo, ts, INTERVAL '1' HOUR)
  GROUP BY window_end, host
ALERT WHEN avg_temp < 55 FOR 2 WINDOWS
  RESOLVE WHEN avg_temp > 60
  SEVERITY 'critical'
  MESSAGE '{host} {state}: hourly average temperature {avg_temp:.1}';
