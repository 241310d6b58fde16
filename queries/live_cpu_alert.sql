-- live_cpu_alert.sql: alert on this machine's CPU, with no data file at all.
--
-- Reads the machine vigil runs on (connector 'host', see grammar/README.md for every
-- column and its unit). The alert fires when the average CPU of three 10-second windows
-- in a row is above 80 % and resolves at the first window at or below 80 %; the second
-- query prints each window's averages as the window closes.
--
-- Run:   vigil run queries/live_cpu_alert.sql
--
-- As written, the stream below takes 12 samples 250 ms apart and then ends (3 s), so the
-- example finishes on its own (the test suite runs every example to the end); its only
-- window closes then. For a live run that goes on until Ctrl-C, delete the CREATE STREAM
-- statement: the queries then read the built-in stream host_metrics, which samples this
-- machine every second, forever. (Or keep it and drop `limit`.) To watch the alert fire,
-- load every core for half a minute, e.g. with `yes > /dev/null` once per core.

CREATE STREAM host_metrics (
  ts   TIMESTAMP,
  host TEXT,
  cpu  DOUBLE,
  mem  DOUBLE,
  WATERMARK FOR ts AS ts
) WITH (connector = 'host', interval = '250 milliseconds', limit = '12');

CREATE ALERT high_cpu AS
  SELECT window_end, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(host_metrics, ts, INTERVAL '10' SECOND)
  GROUP BY window_end, host
ALERT WHEN avg_cpu > 80 FOR 3 WINDOWS
  SEVERITY 'warning'
  MESSAGE 'cpu on {host} {state}: {avg_cpu:.1} % over the last 10 s';

SELECT window_start, window_end, host,
       round(avg(cpu), 1) AS avg_cpu, max(cpu) AS max_cpu, round(avg(mem), 1) AS avg_mem,
       count(*) AS samples
FROM TUMBLE(host_metrics, ts, INTERVAL '10' SECOND)
GROUP BY window_start, window_end, host;
