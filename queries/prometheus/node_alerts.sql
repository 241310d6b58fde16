-- The samples, as the `remote_write` and `prometheus` sources produce them: labels other
-- than __name__ (name), job and instance in `labels`. Swap the connector to read them
-- elsewhere (e.g. connector = 'prometheus', targets = 'http://127.0.0.1:9100/metrics').
CREATE OR REPLACE STREAM prom_samples (
  ts TIMESTAMP, job TEXT, instance TEXT, name TEXT, labels MAP<TEXT, TEXT>, value DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (connector = 'remote_write');

-- alert HostHighCpuLoad: 100 - (avg by (job, instance) (rate(node_cpu_seconds_total{mode="idle"}[5m])) * 100) > 80 (evaluated every 1m)
CREATE OR REPLACE ALERT "HostHighCpuLoad" AS
SELECT window_end, job, instance, value
FROM (
  SELECT window_start, window_end, job, instance, (100.0 - value) AS value
  FROM (
    SELECT window_start, window_end, job, instance, (value * 100.0) AS value
    FROM (
      SELECT window_start, window_end, job, instance, avg(value) AS value
      FROM (
        SELECT window_start, window_end, job, instance, labels,
               increase * (sampled
                 + CASE WHEN to_start < spacing * 1.1 THEN to_start ELSE spacing / 2 END
                 + CASE WHEN to_end < spacing * 1.1 THEN to_end ELSE spacing / 2 END) / sampled / 300.0 AS value
        FROM (
          SELECT window_start, window_end, job, instance, labels, increase, samples,
                 (CAST(last_ts AS BIGINT) - CAST(first_ts AS BIGINT)) / 1000.0 AS sampled,
                 (CAST(last_ts AS BIGINT) - CAST(first_ts AS BIGINT)) / 1000.0 / (samples - 1) AS spacing,
                 CASE WHEN increase > 0 AND first_value >= 0
                      THEN least((CAST(first_ts AS BIGINT) - CAST(window_start AS BIGINT)) / 1000.0, (CAST(last_ts AS BIGINT) - CAST(first_ts AS BIGINT)) / 1000.0 * first_value / increase)
                      ELSE (CAST(first_ts AS BIGINT) - CAST(window_start AS BIGINT)) / 1000.0 END AS to_start,
                 (CAST(window_end AS BIGINT) - 1 - CAST(last_ts AS BIGINT)) / 1000.0 AS to_end
          FROM (
            SELECT window_start, window_end, job, instance, name, labels,
                   counter_increase(ts, value) AS increase, first_value(value ORDER BY ts) AS first_value,
                   count(value) AS samples, min(ts) AS first_ts, max(ts) AS last_ts
            FROM HOP(prom_samples, ts, INTERVAL '1' MINUTE, INTERVAL '300001' MILLISECOND)
            WHERE name = 'node_cpu_seconds_total' AND coalesce(labels['mode'], '') = 'idle'
            GROUP BY window_start, window_end, job, instance, name, labels
          )
          WHERE samples >= 2 AND last_ts > first_ts
        )
      )
      GROUP BY window_start, window_end, job, instance
    )
  )
)
ALERT BY job, instance WHEN value > 80.0 FOR INTERVAL '5' MINUTE
  SEVERITY 'warning'
  MESSAGE 'High CPU load on {instance}'
  ANNOTATIONS (summary = 'High CPU load on {instance}', description = 'CPU is {value:.1} % busy (over 80 % for 5 minutes).');

-- alert HostOutOfMemory: node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes * 100 < 10 (evaluated every 1m)
CREATE OR REPLACE ALERT "HostOutOfMemory" AS
SELECT window_end, job, instance, labels, value
FROM (
  SELECT window_start, window_end, job, instance, labels, value
  FROM (
    SELECT window_start, window_end, job, instance, labels, ((last_value(value ORDER BY ts) FILTER (WHERE name = 'node_memory_MemAvailable_bytes') / last_value(value ORDER BY ts) FILTER (WHERE name = 'node_memory_MemTotal_bytes')) * 100.0) AS value
    FROM HOP(prom_samples, ts, INTERVAL '1' MINUTE, INTERVAL '300001' MILLISECOND)
    WHERE (name = 'node_memory_MemAvailable_bytes') OR (name = 'node_memory_MemTotal_bytes')
    GROUP BY window_start, window_end, job, instance, labels
  )
  WHERE value IS NOT NULL
)
ALERT BY job, instance, labels WHEN value < 10.0 FOR INTERVAL '2' MINUTE
  SEVERITY 'warning'
  MESSAGE 'Host out of memory: {instance}'
  ANNOTATIONS (summary = 'Host out of memory: {instance}', description = 'Only {value:.1} % of the memory is available.');

-- alert HostOutOfDiskSpace: node_filesystem_avail_bytes{fstype!~"tmpfs|overlay|squashfs"} / node_filesystem_size_bytes{fstype!~"tmpfs|overlay|squashfs"} * 100 < 10 (evaluated every 1m)
CREATE OR REPLACE ALERT "HostOutOfDiskSpace" AS
SELECT window_end, job, instance, labels, labels['device'] AS device, labels['mountpoint'] AS mountpoint, value
FROM (
  SELECT window_start, window_end, job, instance, labels, value
  FROM (
    SELECT window_start, window_end, job, instance, labels, ((last_value(value ORDER BY ts) FILTER (WHERE name = 'node_filesystem_avail_bytes' AND coalesce(labels['fstype'], '') !~ '^(?:tmpfs|overlay|squashfs)$') / last_value(value ORDER BY ts) FILTER (WHERE name = 'node_filesystem_size_bytes' AND coalesce(labels['fstype'], '') !~ '^(?:tmpfs|overlay|squashfs)$')) * 100.0) AS value
    FROM HOP(prom_samples, ts, INTERVAL '1' MINUTE, INTERVAL '300001' MILLISECOND)
    WHERE (name = 'node_filesystem_avail_bytes' AND coalesce(labels['fstype'], '') !~ '^(?:tmpfs|overlay|squashfs)$') OR (name = 'node_filesystem_size_bytes' AND coalesce(labels['fstype'], '') !~ '^(?:tmpfs|overlay|squashfs)$')
    GROUP BY window_start, window_end, job, instance, labels
  )
  WHERE value IS NOT NULL
)
ALERT BY job, instance, labels WHEN value < 10.0 FOR INTERVAL '2' MINUTE
  KEEP FIRING FOR INTERVAL '5' MINUTE
  SEVERITY 'critical'
  MESSAGE 'Disk almost full: {mountpoint} on {instance}'
  LABELS (team = 'infra')
  ANNOTATIONS (summary = 'Disk almost full: {mountpoint} on {instance}', description = '{device} has {value:.1} % space left.');

-- alert InstanceDown: up == 0 (evaluated every 1m)
CREATE OR REPLACE ALERT "InstanceDown" AS
SELECT window_end, job, instance, name, labels, value
FROM (
  SELECT window_start, window_end, job, instance, name, labels, last_value(value ORDER BY ts) AS value
  FROM HOP(prom_samples, ts, INTERVAL '1' MINUTE, INTERVAL '300001' MILLISECOND)
  WHERE name = 'up'
  GROUP BY window_start, window_end, job, instance, name, labels
)
ALERT BY job, instance, name, labels WHEN value = 0.0 FOR INTERVAL '1' MINUTE
  SEVERITY 'critical'
  MESSAGE 'Instance {instance} down'
  ANNOTATIONS (summary = 'Instance {instance} down', description = '{instance} of job {job} has been down for more than a minute.');
