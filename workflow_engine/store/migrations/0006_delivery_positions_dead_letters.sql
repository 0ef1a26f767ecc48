-- onceflow schema, version 6: duplicate rows idempotent per Kafka position, a different
-- workflow type on a job id recorded as a mismatch, provenance (origin) on every job,
-- dead-lettered records in the database, and job_trace showing both.

-- 1. onceflow_duplicate_deliveries: one row per Kafka position (topic, partition,
--    offset). A record redelivered again (the worker died between the database commit
--    and the offset commit, more than once) never adds a second row. Rows written
--    before this migration may repeat a position: keep the earliest of each.
DELETE FROM onceflow_duplicate_deliveries d
USING onceflow_duplicate_deliveries e
WHERE (d.source_topic, d.source_partition, d.source_offset)
      = (e.source_topic, e.source_partition, e.source_offset)
  AND e.id < d.id;

ALTER TABLE onceflow_duplicate_deliveries
    ADD CONSTRAINT onceflow_duplicate_deliveries_position_key
        UNIQUE (source_topic, source_partition, source_offset);

-- The duplicate's own workflow (or task) type, and whether it is the winner's. Rows
-- recorded before this migration did not keep it: both NULL ("not recorded").
ALTER TABLE onceflow_duplicate_deliveries
    ADD COLUMN workflow text,
    ADD COLUMN workflow_match boolean,
    ADD CONSTRAINT onceflow_duplicate_deliveries_workflow_check
        CHECK ((workflow IS NULL) = (workflow_match IS NULL));

-- 2. Provenance: did the record come through ingest (HTTP) or straight to Kafka
--    (kcat, a Java or Go producer)?
ALTER TABLE onceflow_jobs
    ADD COLUMN origin text NOT NULL DEFAULT 'http'
        CONSTRAINT onceflow_jobs_origin_check CHECK (origin IN ('http', 'kafka'));

-- 3. One row per dead-lettered source record: why (a DeadLetterReason code + text),
--    where it was (source position) and where it went (the DLQ position, when known).
CREATE TABLE onceflow_dead_letters (
    id bigint GENERATED ALWAYS AS IDENTITY CONSTRAINT onceflow_dead_letters_pkey PRIMARY KEY,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    job_id text,
    reason text NOT NULL,
    detail text NOT NULL DEFAULT '',
    original_size integer NOT NULL,
    sha256 text NOT NULL,
    truncated boolean NOT NULL DEFAULT false,
    dlq_topic text NOT NULL,
    dlq_partition integer,
    dlq_offset bigint,
    headers jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_dead_letters_source_key
        UNIQUE (source_topic, source_partition, source_offset),
    CONSTRAINT onceflow_dead_letters_reason_check CHECK (reason IN (
        'no_value', 'not_json', 'not_an_object', 'unsupported_version', 'invalid_job_id',
        'key_mismatch', 'missing_workflow', 'invalid_params', 'invalid_submitted_at',
        'too_large', 'unknown_type', 'task_failed', 'database_refused')),
    CONSTRAINT onceflow_dead_letters_dlq_position_check
        CHECK ((dlq_partition IS NULL) = (dlq_offset IS NULL))
);
CREATE INDEX onceflow_dead_letters_job_idx ON onceflow_dead_letters (job_id);

-- 4. job_trace: the same columns; now with provenance, workflow mismatches and dead
--    letters of the id.
CREATE OR REPLACE FUNCTION job_trace(p_job_id text)
RETURNS TABLE (at timestamptz, event text, detail text, layer text)
LANGUAGE sql STABLE
AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    SELECT j.submitted_at AS at, 1 AS ord, 'received' AS event,
           CASE j.origin
               WHEN 'http' THEN 'HTTP request ' || coalesce(j.request_id, '-')
               ELSE 'produced directly to Kafka'
                    || coalesce(' (request ' || j.request_id || ')', '') END
             || coalesce(', traceparent ' || j.traceparent, '') AS detail,
           CASE j.origin WHEN 'http' THEN 'ingest' ELSE 'kafka' END AS layer
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
             || CASE WHEN d.params_match THEN '' ELSE ', PAYLOAD MISMATCH (params differ)' END
             || CASE WHEN d.workflow_match IS FALSE
                     THEN ', WORKFLOW MISMATCH (' || d.workflow || ', not ' || j.type_name || ')'
                     ELSE '' END,
           'streams'
    FROM onceflow_duplicate_deliveries d JOIN onceflow_jobs j USING (job_id)
    WHERE d.job_id = p_job_id
    UNION ALL
    SELECT dl.created_at, 3, 'dead-lettered',
           dl.reason || ': ' || dl.detail
             || ' (from ' || dl.source_topic || '/' || dl.source_partition
             || '@' || dl.source_offset || ' to ' || dl.dlq_topic
             || coalesce('/' || dl.dlq_partition || '@' || dl.dlq_offset, '') || ')',
           'streams'
    FROM onceflow_dead_letters dl WHERE dl.job_id = p_job_id
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
