-- onceflow schema, version 10: schedules. A schedule's tick becomes a job like any
-- other: its job id (<schedule>@<UTC instant>) goes through onceflow_jobs_job_id_key, so
-- two engines, a restart or a clock jump never run a tick twice.

-- 1. Provenance: a job can come from a schedule's tick.
ALTER TABLE onceflow_jobs
    DROP CONSTRAINT onceflow_jobs_origin_check,
    ADD CONSTRAINT onceflow_jobs_origin_check CHECK (origin IN ('http', 'kafka', 'schedule'));

-- 2. One row per schedule. The engines' schedulers lock due rows with FOR UPDATE SKIP
--    LOCKED and move next_fire_at in the transaction that creates the ticks' jobs.
--    declared: upserted from @workflow(schedule=...) at engine start (else made by the
--    CLI or the admin API). buffered_tick_at: the tick overlap=buffer-one holds until
--    the previous tick's instance (last_job_id) finishes.
CREATE TABLE onceflow_schedules (
    name             text        NOT NULL CONSTRAINT onceflow_schedules_pkey PRIMARY KEY,
    workflow         text        NOT NULL,
    cron             text,
    every_seconds    integer,
    timezone         text        NOT NULL DEFAULT 'UTC',
    params           jsonb       NOT NULL DEFAULT '{}',
    catchup          text        NOT NULL DEFAULT 'run-once',
    overlap          text        NOT NULL DEFAULT 'skip',
    max_catchup      integer     NOT NULL DEFAULT 100,
    declared         boolean     NOT NULL DEFAULT false,
    paused           boolean     NOT NULL DEFAULT false,
    next_fire_at     timestamptz NOT NULL,
    buffered_tick_at timestamptz,
    last_tick_at     timestamptz,
    last_job_id      text,
    last_fired_at    timestamptz,
    ticks_fired      bigint      NOT NULL DEFAULT 0,
    ticks_skipped    bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_schedules_spec_check CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    CONSTRAINT onceflow_schedules_every_check CHECK (every_seconds IS NULL OR every_seconds >= 1),
    CONSTRAINT onceflow_schedules_catchup_check
        CHECK (catchup IN ('skip', 'run-once', 'run-all')),
    CONSTRAINT onceflow_schedules_overlap_check
        CHECK (overlap IN ('skip', 'allow', 'buffer-one')),
    CONSTRAINT onceflow_schedules_max_catchup_check CHECK (max_catchup BETWEEN 1 AND 1000)
);
CREATE INDEX onceflow_schedules_due_idx ON onceflow_schedules (next_fire_at) WHERE NOT paused;

-- 3. One row per tick that created a job: which schedule, which tick, why, how late.
--    No foreign key to the schedule: the history outlives a deleted schedule, and a
--    schedule created again under the same name finds its old ticks already taken.
CREATE TABLE onceflow_schedule_ticks (
    schedule         text        NOT NULL,
    tick_at          timestamptz NOT NULL,
    job_id           text        NOT NULL,
    trigger          text        NOT NULL,
    fired_at         timestamptz NOT NULL DEFAULT now(),
    lateness_seconds double precision NOT NULL,
    CONSTRAINT onceflow_schedule_ticks_pkey PRIMARY KEY (schedule, tick_at),
    CONSTRAINT onceflow_schedule_ticks_job_key UNIQUE (job_id),
    CONSTRAINT onceflow_schedule_ticks_job_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_jobs (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_schedule_ticks_trigger_check
        CHECK (trigger IN ('on_time', 'catch_up', 'buffered', 'backfill'))
);

-- 4. job_trace: a tick's job says which schedule and tick created it (no Kafka record).
CREATE OR REPLACE FUNCTION job_trace(p_job_id text)
RETURNS TABLE (at timestamptz, event text, detail text, layer text)
LANGUAGE sql STABLE
AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    SELECT j.submitted_at AS at, 1 AS ord, 'received' AS event,
           CASE j.origin
               WHEN 'http' THEN 'HTTP request ' || coalesce(j.request_id, '-')
               WHEN 'schedule' THEN coalesce(
                   'schedule ' || k.schedule || ', tick ' || k.tick_at || ' (' || k.trigger
                     || ', ' || round(k.lateness_seconds::numeric, 3) || ' s late)',
                   'schedule tick')
               ELSE 'produced directly to Kafka'
                    || coalesce(' (request ' || j.request_id || ')', '') END
             || coalesce(', traceparent ' || j.traceparent, '') AS detail,
           CASE j.origin WHEN 'http' THEN 'ingest' WHEN 'schedule' THEN 'engine'
                ELSE 'kafka' END AS layer
    FROM onceflow_jobs j LEFT JOIN onceflow_schedule_ticks k USING (job_id)
    WHERE j.job_id = p_job_id
    UNION ALL
    SELECT coalesce(j.enqueued_at, j.submitted_at), 2, 'enqueued',
           j.source_topic || '/' || j.source_partition || '@' || j.source_offset, 'kafka'
    FROM onceflow_jobs j WHERE j.job_id = p_job_id AND j.origin <> 'schedule'
    UNION ALL
    SELECT i.created_at, 3, 'instance created',
           'workflow ' || i.workflow || CASE j.origin
               WHEN 'schedule' THEN ' by the scheduler'
               ELSE ' from ' || j.source_topic || '/' || j.source_partition
                    || '@' || j.source_offset END,
           CASE j.origin WHEN 'schedule' THEN 'engine' ELSE 'streams' END
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
