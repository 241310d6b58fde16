CREATE STREAM task_events (
  ts TIMESTAMP, job BIGINT, task BIGINT, machine BIGINT, event_type TEXT,
  WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE
) WITH (connector = 'file', path = 'task_events.csv', format = 'csv');

SELECT job, window_start, window_end, count(*) AS n_events
FROM SESSION(task_events, ts, INTERVAL '10' MINUTE)
GROUP BY window_start, window_end, job;
