-- peer_outlier.sql: a host working harder than its identical peers.
--
-- Detects: among hosts that share the same work (web servers behind one load balancer),
-- one that burns clearly more CPU than the others in the same minute, for 10 minutes: a
-- bad deploy on one host, a stuck background process, a noisy neighbour, a failing disk
-- or NIC making every request cost more. Peers share the traffic, so a fleet-wide surge
-- moves them all and alerts nobody.
--
-- Why: peers are the hosts of the same tier in the same one-minute window; the tier is
-- the host name up to its first '-' (web-01 -> web; edit split_part(...) to match your
-- naming, e.g. a role column). robust_z is 0.6745 (x - median) / MAD over the peers; 3.5
-- is the customary outlier cut-off. With a handful of peers bunched within a few points,
-- the MAD is tiny: on the bundled data healthy web hosts score above 3.5 in 27 of 2,025
-- host-minutes, some only 2 CPU points above the median. So the alert also wants the host
-- 10 points above the peers' median (healthy ones never pass 8.4); and at least 5 peers
-- (a robust z-score over 2 or 3 values is meaningless - a tier that small is never
-- judged). FOR INTERVAL '10' MINUTE ignores spikes (spike_vs_moving_average.sql's job);
-- RESOLVE WHEN above_peers < 5: back within 5 points of the median, not merely under the
-- firing thresholds, so it does not flap while the host is on its way back. One-sided on
-- purpose: a host doing less than its peers (out of the pool, crashed) is
-- dbscan_outlier.sql's or no_data.sql's case.
--
-- Run:    vigil run queries/pack/peer_outlier.sql
--         vigil run queries/pack/peer_outlier.sql --input metrics=my.csv --format csv
--
-- Your data: a CSV with a header row and at least the columns ts, host, cpu; ts in
-- ISO-8601 (2024-06-03T08:00:00Z) or epoch milliseconds, rows up to 30 s out of order
-- (the WATERMARK delay; later ones are dropped as late and counted on stderr). The stream
-- declares ts, host, cpu, mem and disk_io: a column your file
-- lacks reads as NULL (with a warning on stderr naming it), so a rule that does not
-- read it still works; ts must be there. Extra columns are ignored.
--
-- On data/fleet.csv: web-05's CPU drifts up from 11:20 to 18 points above the other web
-- hosts by 12:00, stays there until 13:00 and is back at 13:10: firing at 11:54 (since
-- 11:44; 16.9 points above the median of its 6 web peers, z 6.4), resolved at 13:08. The
-- three batch hosts are never judged (fewer than 5 peers).

CREATE OR REPLACE STREAM metrics (
  ts      TIMESTAMP,
  host    TEXT,
  cpu     DOUBLE,
  mem     DOUBLE,
  disk_io DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (path = '../data/fleet.csv');

CREATE OR REPLACE VIEW cpu_per_minute_by_tier AS
  SELECT window_start, window_end, host, split_part(host, '-', 1) AS tier,
         avg(cpu) AS avg_cpu
  FROM TUMBLE(metrics, ts, INTERVAL '1' MINUTE)
  GROUP BY window_start, window_end, host;

CREATE OR REPLACE ALERT peer_outlier AS
  SELECT window_end, host, tier, avg_cpu,
         count(*) OVER peers AS peer_count,
         avg_cpu - median(avg_cpu) OVER peers AS above_peers,
         robust_z(avg_cpu) OVER peers AS z
  FROM cpu_per_minute_by_tier
  WINDOW peers AS (PARTITION BY window_end, tier)
ALERT BY host WHEN peer_count >= 5 AND z > 3.5 AND above_peers > 10
  FOR INTERVAL '10' MINUTE RESOLVE WHEN above_peers < 5
SEVERITY 'warning'
MESSAGE '{host}: CPU {avg_cpu:.1} %, {above_peers:.1} above its {tier} peers (z {z:.1})'
RESOLVE MESSAGE '{host}: CPU {avg_cpu:.1} %, back with its {tier} peers ({above_peers:.1} above), apart since {since}';
