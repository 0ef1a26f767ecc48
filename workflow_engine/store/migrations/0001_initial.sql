-- onceflow schema, version 1.
-- Owned by workflow_engine: other packages go through its Python API, never their own SQL.
-- Every constraint is named so that violations map to domain errors by name.

-- The job-id registry: one row per job id ever accepted. Its primary key is the
-- unique constraint that makes "at most one workflow per job id" hold; it records
-- where the job came from (the Kafka record that created it).
CREATE TABLE onceflow_jobs (
    job_id            text        NOT NULL,
    kind              text        NOT NULL DEFAULT 'workflow',
    type_name         text        NOT NULL,
    params_digest     text        NOT NULL,
    request_id        text,
    submitted_at      timestamptz,
    traceparent       text,
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL,
    source_offset     bigint      NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_jobs_job_id_key PRIMARY KEY (job_id),
    CONSTRAINT onceflow_jobs_kind_check CHECK (kind IN ('workflow', 'task'))
);

-- Every delivery of a job id after the first: Kafka redeliveries (same record) and
-- client resubmissions (a new record), with whether the params matched the winner's.
CREATE TABLE onceflow_duplicate_deliveries (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    job_id            text        NOT NULL,
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL,
    source_offset     bigint      NOT NULL,
    params_digest     text        NOT NULL,
    params_match      boolean     NOT NULL,
    redelivery        boolean     NOT NULL,
    request_id        text,
    submitted_at      timestamptz,
    received_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_duplicate_deliveries_pkey PRIMARY KEY (id),
    CONSTRAINT onceflow_duplicate_deliveries_job_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_jobs (job_id) ON DELETE CASCADE
);
CREATE INDEX onceflow_duplicate_deliveries_job_idx ON onceflow_duplicate_deliveries (job_id);

-- One workflow instance per job id: its id *is* the job id.
CREATE TABLE onceflow_instances (
    job_id            text        NOT NULL,
    workflow          text        NOT NULL,
    params            jsonb       NOT NULL,
    status            text        NOT NULL DEFAULT 'queued',
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    run_after         timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    lease_owner       text,
    lease_expires_at  timestamptz,
    claim_count       integer     NOT NULL DEFAULT 0,
    result            jsonb,
    error             text,
    CONSTRAINT onceflow_instances_job_id_key PRIMARY KEY (job_id),
    CONSTRAINT onceflow_instances_job_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_jobs (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_instances_status_check CHECK (status IN (
        'queued', 'running', 'sleeping', 'waiting', 'paused', 'complete', 'errored', 'terminated')),
    CONSTRAINT onceflow_instances_lease_check CHECK (
        (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT onceflow_instances_finished_check CHECK (
        (status IN ('complete', 'errored', 'terminated')) = (finished_at IS NOT NULL))
);
-- The claim query reads only these partial indexes.
CREATE INDEX onceflow_instances_runnable_idx ON onceflow_instances (run_after)
    WHERE status = 'queued';
CREATE INDEX onceflow_instances_leased_idx ON onceflow_instances (lease_expires_at)
    WHERE status = 'running';
CREATE INDEX onceflow_instances_workflow_status_idx ON onceflow_instances (workflow, status);

-- Steps of an instance, in the order the workflow code asked for them. A completed
-- step's result is its checkpoint: replay returns it instead of running the step.
CREATE TABLE onceflow_steps (
    job_id            text        NOT NULL,
    position          integer     NOT NULL,
    name              text        NOT NULL,
    status            text        NOT NULL DEFAULT 'running',
    attempts          integer     NOT NULL DEFAULT 0,
    result            jsonb,
    error             text,
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    CONSTRAINT onceflow_steps_pkey PRIMARY KEY (job_id, position),
    CONSTRAINT onceflow_steps_name_key UNIQUE (job_id, name),
    CONSTRAINT onceflow_steps_instance_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_instances (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_steps_status_check CHECK (status IN ('running', 'complete', 'failed')),
    CONSTRAINT onceflow_steps_finished_check CHECK ((status = 'running') = (finished_at IS NULL))
);

-- Every attempt of every step: who ran it, when, and how it ended.
CREATE TABLE onceflow_step_attempts (
    job_id            text        NOT NULL,
    position          integer     NOT NULL,
    attempt           integer     NOT NULL,
    engine_id         text        NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    outcome           text,
    error             text,
    CONSTRAINT onceflow_step_attempts_pkey PRIMARY KEY (job_id, position, attempt),
    CONSTRAINT onceflow_step_attempts_step_fkey FOREIGN KEY (job_id, position)
        REFERENCES onceflow_steps (job_id, position) ON DELETE CASCADE,
    CONSTRAINT onceflow_step_attempts_outcome_check CHECK (
        outcome IS NULL OR outcome IN ('complete', 'retry', 'failed', 'abandoned'))
);

-- The sample workflows' side-effect ledger: one row per *execution* of a side effect.
-- Deliberately no unique constraint on (job_id, step): a double execution shows here,
-- so "performed exactly once" is a check that can fail.
CREATE TABLE onceflow_demo_side_effects (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    job_id            text        NOT NULL,
    step              text        NOT NULL,
    idempotency_key   text        NOT NULL,
    performed_by      text        NOT NULL,
    performed_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_demo_side_effects_pkey PRIMARY KEY (id)
);
CREATE INDEX onceflow_demo_side_effects_job_idx ON onceflow_demo_side_effects (job_id);
