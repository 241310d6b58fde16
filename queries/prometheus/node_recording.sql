-- The samples, as the `remote_write` and `prometheus` sources produce them: labels other
-- than __name__ (name), job and instance in `labels`. Swap the connector to read them
-- elsewhere (e.g. connector = 'prometheus', targets = 'http://127.0.0.1:9100/metrics').
CREATE OR REPLACE STREAM prom_samples (
  ts TIMESTAMP, job TEXT, instance TEXT, name TEXT, labels MAP<TEXT, TEXT>, value DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '30' SECOND
) WITH (connector = 'remote_write');

-- record instance:node_cpu_utilisation:rate5m: 1 - avg by (job, instance) (rate(node_cpu_seconds_total{mode="idle"}[5m])) (evaluated every 1m)
CREATE OR REPLACE VIEW instance_node_cpu_utilisation_rate5m AS
SELECT window_end, job, instance, 'instance:node_cpu_utilisation:rate5m' AS name, value
FROM (
  SELECT window_start, window_end, job, instance, (1.0 - value) AS value
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
);
SELECT * FROM instance_node_cpu_utilisation_rate5m;
