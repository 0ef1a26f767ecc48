-- GENERATED FILE, do not edit: the schema the product migrations
-- (workflow_engine/store/migrations) produce on a fresh database, from
-- pg_dump --schema-only --no-owner --no-privileges, normalised.
-- Regenerate after adding a migration: onceflow dev schema-snapshot

CREATE FUNCTION public.job_trace(p_job_id text) RETURNS TABLE(at timestamp with time zone, event text, detail text, layer text)
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
ORDER BY date_trunc('milliseconds', t.at), t.ord, t.at
$$;

CREATE TABLE public.onceflow_bulk_operation_items (
    operation_id bigint NOT NULL,
    job_id text NOT NULL
);

CREATE TABLE public.onceflow_bulk_operations (
    id bigint NOT NULL,
    action text NOT NULL,
    filter text NOT NULL,
    total integer NOT NULL,
    done integer DEFAULT 0 NOT NULL,
    skipped integer DEFAULT 0 NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    last_job_id text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    error text,
    CONSTRAINT onceflow_bulk_operations_action_check CHECK ((action = ANY (ARRAY['pause'::text, 'resume'::text, 'terminate'::text, 'restart'::text]))),
    CONSTRAINT onceflow_bulk_operations_finished_check CHECK (((status = 'running'::text) = (finished_at IS NULL))),
    CONSTRAINT onceflow_bulk_operations_progress_check CHECK (((done >= 0) AND (skipped >= 0) AND ((done + skipped) <= total))),
    CONSTRAINT onceflow_bulk_operations_status_check CHECK ((status = ANY (ARRAY['running'::text, 'complete'::text, 'failed'::text])))
);

ALTER TABLE public.onceflow_bulk_operations ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_bulk_operations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_dead_letters (
    id bigint NOT NULL,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    job_id text,
    reason text NOT NULL,
    detail text DEFAULT ''::text NOT NULL,
    original_size integer NOT NULL,
    sha256 text NOT NULL,
    truncated boolean DEFAULT false NOT NULL,
    dlq_topic text NOT NULL,
    dlq_partition integer,
    dlq_offset bigint,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_dead_letters_dlq_position_check CHECK (((dlq_partition IS NULL) = (dlq_offset IS NULL))),
    CONSTRAINT onceflow_dead_letters_reason_check CHECK ((reason = ANY (ARRAY['no_value'::text, 'not_json'::text, 'not_an_object'::text, 'unsupported_version'::text, 'invalid_job_id'::text, 'key_mismatch'::text, 'missing_workflow'::text, 'invalid_params'::text, 'invalid_submitted_at'::text, 'too_large'::text, 'unknown_type'::text, 'task_failed'::text, 'database_refused'::text])))
);

ALTER TABLE public.onceflow_dead_letters ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_duplicate_deliveries (
    id bigint NOT NULL,
    job_id text NOT NULL,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    params_digest text NOT NULL,
    params_match boolean NOT NULL,
    redelivery boolean NOT NULL,
    request_id text,
    submitted_at timestamp with time zone,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone,
    workflow text,
    workflow_match boolean,
    CONSTRAINT onceflow_duplicate_deliveries_workflow_check CHECK (((workflow IS NULL) = (workflow_match IS NULL)))
);

ALTER TABLE public.onceflow_duplicate_deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_duplicate_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_engines (
    engine_id text NOT NULL,
    workflows jsonb DEFAULT '{}'::jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_engines_workflows_check CHECK ((jsonb_typeof(workflows) = 'object'::text))
);

CREATE TABLE public.onceflow_events (
    id bigint NOT NULL,
    job_id text NOT NULL,
    type text NOT NULL,
    payload jsonb,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    consumed_at timestamp with time zone,
    consumed_by integer,
    CONSTRAINT onceflow_events_consumed_check CHECK (((consumed_at IS NULL) = (consumed_by IS NULL)))
);

ALTER TABLE public.onceflow_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_instances (
    job_id text NOT NULL,
    workflow text NOT NULL,
    params jsonb NOT NULL,
    status text DEFAULT 'queued'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    claim_count integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    requested_action text,
    restart_count integer DEFAULT 0 NOT NULL,
    version text,
    CONSTRAINT onceflow_instances_finished_check CHECK (((status = ANY (ARRAY['complete'::text, 'errored'::text, 'terminated'::text])) = (finished_at IS NOT NULL))),
    CONSTRAINT onceflow_instances_lease_check CHECK (((status = 'running'::text) = ((lease_owner IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT onceflow_instances_requested_action_check CHECK ((requested_action = ANY (ARRAY['pause'::text, 'terminate'::text, 'restart'::text]))),
    CONSTRAINT onceflow_instances_status_check CHECK ((status = ANY (ARRAY['queued'::text, 'running'::text, 'sleeping'::text, 'waiting'::text, 'paused'::text, 'complete'::text, 'errored'::text, 'terminated'::text])))
);

CREATE TABLE public.onceflow_jobs (
    job_id text NOT NULL,
    kind text DEFAULT 'workflow'::text NOT NULL,
    type_name text NOT NULL,
    params_digest text NOT NULL,
    request_id text,
    submitted_at timestamp with time zone,
    traceparent text,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone,
    origin text DEFAULT 'http'::text NOT NULL,
    CONSTRAINT onceflow_jobs_kind_check CHECK ((kind = ANY (ARRAY['workflow'::text, 'task'::text]))),
    CONSTRAINT onceflow_jobs_origin_check CHECK ((origin = ANY (ARRAY['http'::text, 'kafka'::text])))
);

CREATE TABLE public.onceflow_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    checksum text
);

CREATE TABLE public.onceflow_step_attempts (
    job_id text NOT NULL,
    "position" integer NOT NULL,
    attempt integer NOT NULL,
    engine_id text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    error text,
    CONSTRAINT onceflow_step_attempts_outcome_check CHECK (((outcome IS NULL) OR (outcome = ANY (ARRAY['complete'::text, 'retry'::text, 'failed'::text, 'abandoned'::text]))))
);

CREATE TABLE public.onceflow_steps (
    job_id text NOT NULL,
    "position" integer NOT NULL,
    name text NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    kind text DEFAULT 'step'::text NOT NULL,
    wake_at timestamp with time zone,
    event_type text,
    CONSTRAINT onceflow_steps_event_type_check CHECK (((kind = 'event'::text) = (event_type IS NOT NULL))),
    CONSTRAINT onceflow_steps_finished_check CHECK (((status = ANY (ARRAY['running'::text, 'sleeping'::text, 'waiting'::text])) = (finished_at IS NULL))),
    CONSTRAINT onceflow_steps_kind_check CHECK ((kind = ANY (ARRAY['step'::text, 'sleep'::text, 'event'::text, 'patch'::text]))),
    CONSTRAINT onceflow_steps_status_check CHECK ((status = ANY (ARRAY['running'::text, 'sleeping'::text, 'waiting'::text, 'complete'::text, 'failed'::text])))
);

CREATE TABLE public.onceflow_task_runs (
    job_id text NOT NULL,
    task text NOT NULL,
    params jsonb NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT onceflow_task_runs_finished_check CHECK (((status = 'pending'::text) = (finished_at IS NULL))),
    CONSTRAINT onceflow_task_runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'succeeded'::text, 'dead_lettered'::text])))
);

ALTER TABLE ONLY public.onceflow_bulk_operation_items
    ADD CONSTRAINT onceflow_bulk_operation_items_pkey PRIMARY KEY (operation_id, job_id);

ALTER TABLE ONLY public.onceflow_bulk_operations
    ADD CONSTRAINT onceflow_bulk_operations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_dead_letters
    ADD CONSTRAINT onceflow_dead_letters_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_dead_letters
    ADD CONSTRAINT onceflow_dead_letters_source_key UNIQUE (source_topic, source_partition, source_offset);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries
    ADD CONSTRAINT onceflow_duplicate_deliveries_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries
    ADD CONSTRAINT onceflow_duplicate_deliveries_position_key UNIQUE (source_topic, source_partition, source_offset);

ALTER TABLE ONLY public.onceflow_engines
    ADD CONSTRAINT onceflow_engines_pkey PRIMARY KEY (engine_id);

ALTER TABLE ONLY public.onceflow_events
    ADD CONSTRAINT onceflow_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_instances
    ADD CONSTRAINT onceflow_instances_job_id_key PRIMARY KEY (job_id);

ALTER TABLE ONLY public.onceflow_jobs
    ADD CONSTRAINT onceflow_jobs_job_id_key PRIMARY KEY (job_id);

ALTER TABLE ONLY public.onceflow_migrations
    ADD CONSTRAINT onceflow_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.onceflow_step_attempts
    ADD CONSTRAINT onceflow_step_attempts_pkey PRIMARY KEY (job_id, "position", attempt);

ALTER TABLE ONLY public.onceflow_steps
    ADD CONSTRAINT onceflow_steps_name_key UNIQUE (job_id, name);

ALTER TABLE ONLY public.onceflow_steps
    ADD CONSTRAINT onceflow_steps_pkey PRIMARY KEY (job_id, "position");

ALTER TABLE ONLY public.onceflow_task_runs
    ADD CONSTRAINT onceflow_task_runs_job_id_key PRIMARY KEY (job_id);

CREATE INDEX onceflow_dead_letters_job_idx ON public.onceflow_dead_letters USING btree (job_id);

CREATE INDEX onceflow_duplicate_deliveries_job_idx ON public.onceflow_duplicate_deliveries USING btree (job_id);

CREATE INDEX onceflow_events_pending_idx ON public.onceflow_events USING btree (job_id, type, id) WHERE (consumed_at IS NULL);

CREATE INDEX onceflow_instances_created_idx ON public.onceflow_instances USING btree (created_at, job_id);

CREATE INDEX onceflow_instances_finished_idx ON public.onceflow_instances USING btree (finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX onceflow_instances_leased_idx ON public.onceflow_instances USING btree (lease_expires_at) WHERE (status = 'running'::text);

CREATE INDEX onceflow_instances_runnable_idx ON public.onceflow_instances USING btree (run_after) WHERE (status = ANY (ARRAY['queued'::text, 'sleeping'::text, 'waiting'::text]));

CREATE INDEX onceflow_instances_updated_idx ON public.onceflow_instances USING btree (updated_at, job_id);

CREATE INDEX onceflow_instances_workflow_created_idx ON public.onceflow_instances USING btree (workflow, created_at, job_id);

CREATE INDEX onceflow_instances_workflow_status_idx ON public.onceflow_instances USING btree (workflow, status);

ALTER TABLE ONLY public.onceflow_bulk_operation_items
    ADD CONSTRAINT onceflow_bulk_operation_items_operation_fkey FOREIGN KEY (operation_id) REFERENCES public.onceflow_bulk_operations(id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_duplicate_deliveries
    ADD CONSTRAINT onceflow_duplicate_deliveries_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_jobs(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_events
    ADD CONSTRAINT onceflow_events_instance_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_instances
    ADD CONSTRAINT onceflow_instances_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_jobs(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_step_attempts
    ADD CONSTRAINT onceflow_step_attempts_step_fkey FOREIGN KEY (job_id, "position") REFERENCES public.onceflow_steps(job_id, "position") ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_steps
    ADD CONSTRAINT onceflow_steps_instance_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_task_runs
    ADD CONSTRAINT onceflow_task_runs_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_jobs(job_id) ON DELETE CASCADE;
