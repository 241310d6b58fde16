-- mad_own_history.sql: CPU far outside the host's own last half hour, robustly.
--
-- Detects: a minute that is abnormal for this host - a spike on a host that is normally
-- steady - judged against the host's own recent history, not a fixed threshold.
--
-- Why: the score is 0.6745 * (x - median) / MAD over the host's last 30 one-minute
-- averages (the current one included), the modified z-score of Iglewicz and Hoaglin: the
-- median and the median absolute deviation ignore the odd bad minute, where a mean and a
-- standard deviation would be dragged along by it. 5 is well past the customary 3.5
-- outlier cut-off, because 30 minutes is a small sample: its MAD is itself uncertain and
-- a slow swing of load inflates scores (healthy hosts of the bundled data pass 5 in 2 of
-- 2,793 minutes). nullif(mad, 0) leaves the score NULL (no alert) for a flat line. Two
-- guards a sysadmin will want: at least 25 CPU points above the median, because a very
-- quiet host can score 5 on a move from 3 % to 6 % that nobody should be paged for (the
-- two healthy minutes above were 10 points up); and at least 10 minutes of history,
-- because a median of three minutes means little. No FOR: like
-- spike_vs_moving_average.sql it reports short events. Only upward moves alert.
--
-- Run:    vigil run queries/pack/mad_own_history.sql
--         vigil run queries/pack/mad_own_history.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, cpu; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: web-01's spike (10:20:00-10:22:30): firing at 10:21 (89.3 % against
-- a typical 31.3 %, score 17.6), resolved at 10:24. Nothing else.

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

CREATE OR REPLACE VIEW cpu_scored AS
  SELECT window_end, host, avg_cpu,
         median(avg_cpu) OVER recent AS typical,
         0.6745 * (avg_cpu - median(avg_cpu) OVER recent)
           / nullif(mad(avg_cpu) OVER recent, 0) AS score,
         count(avg_cpu) OVER recent AS minutes
  FROM cpu_per_minute
  WINDOW recent AS (PARTITION BY host ORDER BY window_end
                    ROWS BETWEEN 29 PRECEDING AND CURRENT ROW);

CREATE OR REPLACE ALERT cpu_unusual_for_host AS
  SELECT window_end, host, avg_cpu, typical, score
  FROM cpu_scored
  WHERE minutes >= 10
ALERT BY host WHEN score > 5 AND avg_cpu - typical > 25
SEVERITY 'warning'
MESSAGE '{host}: CPU {avg_cpu:.1} %, typical {typical:.1} % (robust score {score:.1})'
RESOLVE MESSAGE '{host}: CPU {avg_cpu:.1} %, usual again (typical {typical:.1} %, unusual since {since})';
