-- onceflow_examples, version 1: the samples' "external system".
-- onceflow_demo_side_effects logs every *execution* of a side effect. Deliberately no
-- unique constraint on (job_id, step): a double execution shows here, so "performed
-- exactly once" is a check that can fail.
CREATE TABLE IF NOT EXISTS onceflow_demo_side_effects (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    job_id            text        NOT NULL,
    step              text        NOT NULL,
    idempotency_key   text        NOT NULL,
    performed_by      text        NOT NULL,
    performed_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_demo_side_effects_pkey PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS onceflow_demo_side_effects_job_idx
    ON onceflow_demo_side_effects (job_id);

-- A step may run again after a crash between its side effect and its checkpoint; an
-- external system that honours the step's idempotency key applies the effect once.
-- This table holds what was applied.
CREATE TABLE IF NOT EXISTS onceflow_demo_applied_effects (
    idempotency_key   text        NOT NULL,
    job_id            text        NOT NULL,
    step              text        NOT NULL,
    executions        integer     NOT NULL DEFAULT 1,
    applied_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_demo_applied_effects_pkey PRIMARY KEY (idempotency_key)
);
