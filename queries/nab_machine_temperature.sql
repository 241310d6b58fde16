-- nab_machine_temperature.sql: hourly statistics over a real sensor series.
--
-- Hourly count, average, minimum, maximum and exact median of the machine temperature
-- series of the Numenta Anomaly Benchmark (data/nab/, MIT, see data/nab/PROVENANCE):
-- 22,695 readings, every 5 minutes, 2013-12-02 21:15 to 2014-02-19 15:25, timestamps naive
-- (read as UTC). The file really goes back in time at data row 10149 (2014-01-07 02:55 ->
-- 02:00, the hour is replayed); with hourly windows and no watermark delay those rows are
-- still on time (their window closes at 03:00), so the 02:00 window holds 24 readings.
--
-- Run:   vigil run queries/nab_machine_temperature.sql
-- Output: 1891 hourly rows; stderr ends with `vigil: query 1: out=1891 late=0`.

CREATE STREAM machine_temperature (
  "timestamp" TIMESTAMP,
  "value"     DOUBLE,
  WATERMARK FOR "timestamp" AS "timestamp"
) WITH (connector = 'file', path = 'data/nab/machine_temperature_system_failure.csv', format = 'csv');

SELECT
  window_start,
  window_end,
  count(*)        AS readings,
  avg("value")    AS avg_temp,
  min("value")    AS min_temp,
  max("value")    AS max_temp,
  median("value") AS median_temp
FROM TUMBLE(machine_temperature, "timestamp", INTERVAL '1' HOUR)
GROUP BY window_start, window_end;
