-- dbscan_outlier.sql: a host whose (CPU, memory) is unlike any group of hosts.
--
-- Detects: a host that no longer looks like any group of the fleet in CPU and memory
-- together: an application that died while the node stays up (both near zero), a host
-- left out of a traffic shift, a misconfigured one. No per-metric threshold needed: the
-- fleet's own shape says what is normal in each minute, whatever roles it has.
--
-- Why: DBSCAN per one-minute window over (avg_cpu, avg_mem), both in percent. eps 30: two
-- hosts are alike when their (CPU, memory) points are within 30 percentage points of each
-- other (Euclidean). Hosts of one role spread over far less than that (on the bundled
-- data, outside the incidents, every host has 2 others within 11 points), while a dead
-- application puts its host 40+ points from everyone. min_pts 3: a host belongs when it
-- is within eps of at least 2 others (itself counted), i.e. a group has at least three
-- hosts; cluster -1 is noise. ORDER BY host makes the cluster numbers reproducible (noise
-- does not depend on it). FOR 5 WINDOWS: 5 minutes in a row as noise; a spike or a deploy
-- moves a host away for a minute or two and is not worth this alert. Limits: a role with
-- fewer than 3 hosts is noise whenever it is far from every other group (on
-- data/metrics.csv db-01, alone in its role, fires): raise eps, or give such hosts their
-- own alert. A host that moves 20-30 points (the leak, the drift and the hot batch host
-- of the bundled data) stays within eps of its group: memory_creep.sql, peer_outlier.sql
-- and high_cpu_sustained.sql are the rules for those.
--
-- Run:    vigil run queries/pack/dbscan_outlier.sql
--         vigil run queries/pack/dbscan_outlier.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, cpu, mem; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: web-06's application dies at 13:25 (CPU ~2 %, memory ~12 %; the web
-- hosts sit around (37 %, 53 %), the batch hosts around (77 %, 68 %)): firing at 13:30
-- (since 13:26), still firing at the end of the file. The other incidents stay within eps
-- of their group or last under 5 minutes.

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE VIEW usage_per_minute AS
  SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, avg(mem) AS avg_mem
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_start, window_end, host;

CREATE OR REPLACE ALERT dbscan_outlier AS
  SELECT window_end, host, avg_cpu, avg_mem,
         dbscan(30.0, 3, avg_cpu, avg_mem)
           OVER (PARTITION BY window_end ORDER BY host) AS cluster
  FROM usage_per_minute
ALERT BY host WHEN cluster = -1 FOR 5 WINDOWS
SEVERITY 'warning'
MESSAGE '{host}: CPU {avg_cpu:.1} %, memory {avg_mem:.1} %, unlike any group of hosts'
RESOLVE MESSAGE '{host}: back in a group of hosts at CPU {avg_cpu:.1} %, memory {avg_mem:.1} % (an outlier since {since})';
