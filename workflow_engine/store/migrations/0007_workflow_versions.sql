-- onceflow schema, version 7: safe deploys. Every instance records the version of its
-- workflow definition when it is created; engines advertise the versions they have and
-- claim only those; ctx.patched() records a marker in the history.

-- 1. The definition version an instance was created with (an explicit
--    @workflow(..., version=...) or a fingerprint of the workflow function). NULL:
--    created before this migration, or by a creator that did not know the definition;
--    any engine that has the workflow may run it (the behaviour before versioning).
ALTER TABLE onceflow_instances ADD COLUMN version text;

-- 2. Patch markers (ctx.patched("fix-refund")) are history entries of their own kind.
ALTER TABLE onceflow_steps
    DROP CONSTRAINT onceflow_steps_kind_check,
    ADD CONSTRAINT onceflow_steps_kind_check
        CHECK (kind IN ('step', 'sleep', 'event', 'patch'));

-- 3. Live engines and the workflow versions each can run ({"order-workflow": "v2"}),
--    refreshed every third of a lease. An engine not seen for a lease is gone; an
--    instance whose version no live engine has is reported (gauge, describe), not
--    silently stuck.
CREATE TABLE onceflow_engines (
    engine_id    text        NOT NULL CONSTRAINT onceflow_engines_pkey PRIMARY KEY,
    workflows    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_engines_workflows_check CHECK (jsonb_typeof(workflows) = 'object')
);
