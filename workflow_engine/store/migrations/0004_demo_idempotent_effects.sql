-- onceflow schema, version 4: the sample workflows' "external system".
-- A step may run again after a crash between its side effect and its checkpoint; an
-- external system that honours the step's idempotency key applies the effect once.
-- onceflow_demo_side_effects logs every execution; this table holds what was applied.
CREATE TABLE onceflow_demo_applied_effects (
    idempotency_key   text        NOT NULL,
    job_id            text        NOT NULL,
    step              text        NOT NULL,
    executions        integer     NOT NULL DEFAULT 1,
    applied_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_demo_applied_effects_pkey PRIMARY KEY (idempotency_key)
);
