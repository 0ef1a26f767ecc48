-- onceflow schema, version 27: id reuse policies (issue 26, item 8).
--
-- @workflow(id_reuse="never"|"after_failure"|"after_completion") (and a job's own,
-- stricter id_reuse): whether a new submission of a job id whose instance has finished
-- starts a new run of it. A job id still maps to one instance row: a new run resets
-- that row to queued with run = run + 1 and the resubmission's params, in the worker's
-- creating transaction, under the row's lock (store/writes/reuse.py). The finished run
-- is archived first, with its steps, as one onceflow_runs row: nothing of its history
-- is thrown away (an operator's restart forgets it; a reuse keeps it, numbered).
-- claim_count goes on counting across runs, so an engine that still holds a lease of
-- run N (a zombie) names a claim no claim of run N+1 can have: its fenced writes miss.

-- 1. The instance's current run, from 1.
ALTER TABLE onceflow_instances
    ADD COLUMN run integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT onceflow_instances_run_check CHECK (run >= 1);

COMMENT ON COLUMN onceflow_instances.run IS
    'The current run of this job id (1, then one more per id reuse: onceflow_runs).';

-- 2. The runs of a reused job id: one row per run once a second run exists. A run's
--    row is written when the run after it starts: run N's outcome, result, error and
--    steps (status not NULL, archived); run N+1's row at the same time, with the Kafka
--    position of the submission that started it (status NULL while it is the current
--    run: its outcome is the instance row's). The position's named unique constraint
--    makes a new run idempotent per Kafka record: a redelivery of the record that
--    started a run never starts another one. The instance's retention deletes its
--    runs with it; an earlier run past the job-id retention goes on its own.
CREATE TABLE onceflow_runs (
    job_id text NOT NULL,
    run integer NOT NULL,
    source_topic text,
    source_partition integer,
    source_offset bigint,
    request_id text,
    submitted_at timestamptz,
    traceparent text,
    params jsonb NOT NULL,
    version text,
    callback text,
    created_at timestamptz NOT NULL,
    status text,
    timeout_kind text,
    started_at timestamptz,
    finished_at timestamptz,
    result jsonb,
    error text,
    steps jsonb NOT NULL DEFAULT '[]',
    archived_at timestamptz,
    CONSTRAINT onceflow_runs_pkey PRIMARY KEY (job_id, run),
    CONSTRAINT onceflow_runs_position_key UNIQUE (source_topic, source_partition, source_offset),
    CONSTRAINT onceflow_runs_instance_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_instances (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_runs_run_check CHECK (run >= 1),
    CONSTRAINT onceflow_runs_status_check CHECK (
        status IN ('complete', 'errored', 'terminated', 'skipped')),
    CONSTRAINT onceflow_runs_archived_check CHECK ((status IS NULL) = (archived_at IS NULL)),
    CONSTRAINT onceflow_runs_steps_check CHECK (jsonb_typeof(steps) = 'array')
);

-- Retention deletes the earlier runs past the job-id retention (an id reused again
-- and again keeps a live instance: store/writes/maintenance.py).
CREATE INDEX onceflow_runs_finished_idx ON onceflow_runs (finished_at)
    WHERE status IS NOT NULL;

COMMENT ON TABLE onceflow_runs IS
    'The numbered runs of a reused job id (id_reuse): each finished run''s outcome and steps.';

COMMENT ON COLUMN onceflow_runs.submitted_at IS
    'When the run''s submission was made (the claim''s, for a run after the first).';
COMMENT ON COLUMN onceflow_runs.traceparent IS
    'The run''s submission''s W3C trace context: the parent of the run''s spans.';
COMMENT ON COLUMN onceflow_runs.callback IS
    'A finished run''s callback: its events the dispatcher reads late still go there.';

-- 2b. A bulk operation's snapshot names the run its filter matched: a batch applied
--     after a resubmission started the id's next run skips it (the operator selected
--     the earlier run, not this one). Items written before this migration are run 1's.
ALTER TABLE onceflow_bulk_operation_items ADD COLUMN run integer NOT NULL DEFAULT 1;

-- 3. Every lifecycle event names the run it belongs to ("run": 1, 2, ...): the hot
--    paths' statements pass it in their event CTEs (store/lifecycle.py); the rarer
--    changes' events get it here, from the row the bump reads.
CREATE OR REPLACE FUNCTION onceflow_emit(job_ids text[], kinds text[], extras jsonb[])
RETURNS integer LANGUAGE sql AS $$
    WITH input AS (
        SELECT t.job_id, t.kind, t.extra, t.ord
        FROM unnest(job_ids, kinds, extras) WITH ORDINALITY AS t(job_id, kind, extra, ord)
        WHERE onceflow_events_on()
    ),
    counts AS (
        SELECT job_id, count(*)::int AS n FROM input GROUP BY job_id
    ),
    locked AS (
        SELECT i.job_id FROM onceflow_instances i JOIN counts c USING (job_id)
        ORDER BY i.job_id
        FOR NO KEY UPDATE OF i
    ),
    bumped AS (
        UPDATE onceflow_instances i SET event_seq = i.event_seq + c.n
        FROM counts c JOIN locked l USING (job_id)
        WHERE i.job_id = c.job_id
        RETURNING i.job_id, i.workflow, i.version, i.status, i.run, i.event_seq - c.n AS base
    ),
    numbered AS (
        SELECT input.*, b.workflow, b.version, b.status, b.run,
               (b.base + row_number() OVER (PARTITION BY input.job_id ORDER BY input.ord))::int
                   AS seq
        FROM input JOIN bumped b USING (job_id)
    ),
    written AS (
        INSERT INTO onceflow_outbox (id, aggregateid, type, seq, workflow, payload)
        SELECT n.job_id || ':' || n.seq, n.job_id, 'dev.onceflow.' || n.kind, n.seq, n.workflow,
               onceflow_event_data(n.job_id, n.workflow, n.version, n.seq, n.status, j.origin,
                                   j.source_topic, j.source_partition, j.source_offset,
                                   jsonb_build_object('run', n.run) || coalesce(n.extra, '{}'))
        FROM numbered n LEFT JOIN onceflow_jobs j USING (job_id)
        ORDER BY n.job_id, n.seq
        RETURNING 1
    )
    SELECT count(*)::int FROM written
$$;

-- 4. The job's timeline (job_trace) names its runs: each new run's start (the record
--    that started it) and each earlier run's end, archived with it. The steps the
--    timeline lists are the current run's (the earlier ones are in onceflow_runs.steps).
CREATE OR REPLACE FUNCTION job_trace(p_job_id text)
RETURNS TABLE(at timestamptz, event text, detail text, layer text)
LANGUAGE sql STABLE AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    SELECT b.at, b.event, b.detail, b.layer, b.n AS ord, 0 AS src
    FROM job_trace_without_webhooks(p_job_id) WITH ORDINALITY AS b(at, event, detail, layer, n)
    UNION ALL
    SELECT a.started_at, 'webhook ' || coalesce(a.outcome, 'sending'),
           d.endpoint || ' ' || d.kind || ' (attempt ' || a.attempt
             || coalesce(', HTTP ' || a.response_code, '')
             || coalesce(', ' || round(a.latency_ms::numeric, 1) || ' ms', '')
             || coalesce(': ' || a.error, '') || ')',
           'webhooks', a.attempt, 1
    FROM onceflow_webhook_deliveries d
    JOIN onceflow_webhook_attempts a ON a.delivery_id = d.id
    WHERE d.job_id = p_job_id
    UNION ALL
    SELECT d.finished_at, 'webhook dead', d.endpoint || ' ' || d.kind || ': ' || d.dead_reason
             || coalesce(' (' || d.last_error || ')', ''),
           'webhooks', d.attempts + 1, 1
    FROM onceflow_webhook_deliveries d
    WHERE d.job_id = p_job_id AND d.status = 'dead'
    UNION ALL
    SELECT r.finished_at, 'run ' || r.run || ' ended',
           r.status || coalesce(' (' || r.timeout_kind || ')', '')
             || coalesce(': ' || r.error, '') || ', '
             || jsonb_array_length(r.steps) || ' step(s) kept',
           'engine', r.run, 2
    FROM onceflow_runs r WHERE r.job_id = p_job_id AND r.status IS NOT NULL
    UNION ALL
    SELECT r.created_at, 'run ' || r.run || ' started',
           'id reuse: a new submission'
             || coalesce(' from ' || r.source_topic || '/' || r.source_partition
                         || '@' || r.source_offset, '')
             || coalesce(', request ' || r.request_id, ''),
           'streams', r.run, 2
    FROM onceflow_runs r WHERE r.job_id = p_job_id AND r.run > 1
) AS t
ORDER BY date_trunc('milliseconds', t.at), t.src, t.ord, t.at
$$;
