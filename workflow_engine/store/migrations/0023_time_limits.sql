-- onceflow schema, version 23: time limits (issue 26, item 4).
--
-- execution_timeout (@workflow(execution_timeout=)): the instance's deadline is
-- computed by the claim that first starts it (started_at + the workflow's limit) and
-- kept here, so every engine, and an engine started after a restart, enforces the same
-- instant. The deadline is checked under the instance's lease when a step is about to
-- start and by every claim (a sleeping or waiting instance is made runnable at it:
-- run_after is at most the deadline). NULL: no limit (or not started yet).
--
-- start_within (@workflow(start_within=), a job's own start_within): start_by is the
-- latest time the instance may be first claimed (its created, or delayed start, time +
-- the limit), set when it is created. Past it, a claim does not start it; the expiry
-- (in the engine's claim transaction, under the row lock) errors it instead.
--
-- timeout_kind says which limit ended an errored instance: 'start_timeout' (never
-- started in time) or 'timed_out' (past its execution deadline); NULL otherwise.
ALTER TABLE onceflow_instances
    ADD COLUMN deadline timestamptz,
    ADD COLUMN start_by timestamptz,
    ADD COLUMN timeout_kind text,
    ADD CONSTRAINT onceflow_instances_timeout_kind_check
        CHECK (timeout_kind IN ('start_timeout', 'timed_out')),
    ADD CONSTRAINT onceflow_instances_timeout_errored_check
        CHECK (timeout_kind IS NULL OR status = 'errored');

COMMENT ON COLUMN onceflow_instances.deadline IS
    'The execution deadline (execution_timeout), set by the claim that first started it.';
COMMENT ON COLUMN onceflow_instances.start_by IS
    'Errored as start_timeout if not first claimed by then (start_within).';
COMMENT ON COLUMN onceflow_instances.timeout_kind IS
    'The time limit that errored the instance: start_timeout or timed_out.';

-- The expiry's probe: queued instances that never started and have a start limit.
-- Queued only: those it errored keep started_at NULL and a passed start_by until
-- retention removes them, and every claim's probe would read them all.
CREATE INDEX onceflow_instances_start_by_idx ON onceflow_instances (start_by)
    WHERE start_by IS NOT NULL AND started_at IS NULL AND status = 'queued';

-- A record whose start_within is not a number of seconds in range is dead-lettered
-- with its own reason (the helper of 0011, redefined: a pg_temp function lives only in
-- the session that made it).
CREATE OR REPLACE FUNCTION pg_temp.onceflow_allow_value(p_table text, p_constraint text,
                                                        p_column text, p_value text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    allowed text[];
BEGIN
    SELECT array_agg(m[1] ORDER BY m[1]) INTO allowed
    FROM pg_constraint c,
         regexp_matches(pg_get_constraintdef(c.oid), '''([^'']*)''', 'g') AS m
    WHERE c.conname = p_constraint AND c.conrelid = to_regclass(p_table);
    IF allowed IS NULL THEN
        RAISE EXCEPTION 'constraint % on % not found', p_constraint, p_table;
    END IF;
    IF NOT p_value = ANY(allowed) THEN
        allowed := allowed || p_value;
    END IF;
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I, ADD CONSTRAINT %I CHECK (%I IN (%s))',
                   p_table, p_constraint, p_constraint, p_column,
                   (SELECT string_agg(quote_literal(v), ', ') FROM unnest(allowed) AS v));
END $$;

SELECT pg_temp.onceflow_allow_value('onceflow_dead_letters', 'onceflow_dead_letters_reason_check',
                                    'reason', 'invalid_start_within');
