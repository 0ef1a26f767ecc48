-- onceflow schema, version 3: the Kafka append time, and job_trace(job_id).

ALTER TABLE onceflow_jobs ADD COLUMN enqueued_at timestamptz;
ALTER TABLE onceflow_duplicate_deliveries ADD COLUMN enqueued_at timestamptz;

-- One job's whole timeline, in order: received over HTTP, appended to Kafka, consumed,
-- instance (or task run) created, duplicates collapsed, every step attempt, sleeps,
-- events, and how it ended.
--
--     SELECT * FROM job_trace('order_1001');
--
-- Columns: at (when), event (what), detail (ids, names, errors), layer (which process
-- wrote it: ingest, kafka, streams, engine, operator).
CREATE FUNCTION job_trace(p_job_id text)
RETURNS TABLE (at timestamptz, event text, detail text, layer text)
LANGUAGE sql STABLE
AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    SELECT j.submitted_at AS at, 1 AS ord, 'received' AS event,
           'HTTP request ' || coalesce(j.request_id, '-')
             || coalesce(', traceparent ' || j.traceparent, '') AS detail,
           'ingest' AS layer
    FROM onceflow_jobs j WHERE j.job_id = p_job_id
    UNION ALL
    SELECT coalesce(j.enqueued_at, j.submitted_at), 2, 'enqueued',
           j.source_topic || '/' || j.source_partition || '@' || j.source_offset, 'kafka'
    FROM onceflow_jobs j WHERE j.job_id = p_job_id
    UNION ALL
    SELECT i.created_at, 3, 'instance created',
           'workflow ' || i.workflow || ' from ' || j.source_topic || '/' || j.source_partition
             || '@' || j.source_offset, 'streams'
    FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id) WHERE i.job_id = p_job_id
    UNION ALL
    SELECT t.created_at, 3, 'task run created', 'task ' || t.task, 'streams'
    FROM onceflow_task_runs t WHERE t.job_id = p_job_id
    UNION ALL
    SELECT d.received_at, 4,
           CASE WHEN d.redelivery THEN 'redelivery collapsed' ELSE 'duplicate collapsed' END,
           d.source_topic || '/' || d.source_partition || '@' || d.source_offset
             || coalesce(', request ' || d.request_id, '')
             || CASE WHEN d.params_match THEN '' ELSE ', PAYLOAD MISMATCH (params differ)' END,
           'streams'
    FROM onceflow_duplicate_deliveries d WHERE d.job_id = p_job_id
    UNION ALL
    SELECT a.started_at, 5, 'step started',
           '"' || s.name || '" attempt ' || a.attempt || ' on ' || a.engine_id, 'engine'
    FROM onceflow_step_attempts a JOIN onceflow_steps s USING (job_id, position)
    WHERE a.job_id = p_job_id
    UNION ALL
    SELECT a.finished_at, 6, 'step ' || a.outcome,
           '"' || s.name || '" attempt ' || a.attempt || coalesce(': ' || a.error, ''), 'engine'
    FROM onceflow_step_attempts a JOIN onceflow_steps s USING (job_id, position)
    WHERE a.job_id = p_job_id AND a.finished_at IS NOT NULL
    UNION ALL
    SELECT s.started_at, 5,
           CASE s.kind WHEN 'sleep' THEN 'sleep started' ELSE 'waiting for event' END,
           '"' || s.name || '"' || CASE s.kind
               WHEN 'sleep' THEN ' until ' || s.wake_at
               ELSE ' of type ' || s.event_type || coalesce(' until ' || s.wake_at, '') END,
           'engine'
    FROM onceflow_steps s WHERE s.job_id = p_job_id AND s.kind IN ('sleep', 'event')
    UNION ALL
    SELECT s.finished_at, 6,
           CASE WHEN s.kind = 'sleep' THEN 'sleep ended'
                WHEN s.status = 'complete' THEN 'event received'
                ELSE 'event wait timed out' END,
           '"' || s.name || '"', 'engine'
    FROM onceflow_steps s
    WHERE s.job_id = p_job_id AND s.kind IN ('sleep', 'event') AND s.finished_at IS NOT NULL
    UNION ALL
    SELECT e.sent_at, 4, 'event sent', 'type ' || e.type, 'operator'
    FROM onceflow_events e WHERE e.job_id = p_job_id
    UNION ALL
    SELECT i.finished_at, 9, 'instance ' || i.status, coalesce(i.error, ''), 'engine'
    FROM onceflow_instances i WHERE i.job_id = p_job_id AND i.finished_at IS NOT NULL
    UNION ALL
    SELECT t.finished_at, 9, 'task ' || t.status,
           t.attempts || ' attempt(s)' || coalesce(': ' || t.error, ''), 'streams'
    FROM onceflow_task_runs t WHERE t.job_id = p_job_id AND t.finished_at IS NOT NULL
) AS t
-- Kafka timestamps have millisecond resolution: order within a millisecond by stage.
ORDER BY date_trunc('milliseconds', t.at), t.ord, t.at
$$;
