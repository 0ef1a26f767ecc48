-- onceflow schema, version 20: retry an errored instance from its failed step, and
-- fork an instance from a history position into a new job id (issue 26, item 6).
--
-- Retry (`onceflow instances retry`) keeps every completed entry of the history and
-- runs the step the instance errored at again with a fresh attempt budget (retry_base). Which step
-- that was is recorded when the instance errors: failed_position, the history position
-- of the step whose failure (StepFailed or NonRetryableError, or one the workflow
-- raised while handling it) ended the run; NULL when the run ended for another reason
-- (its own code raised, a nondeterminism, a refused write), where a retry only
-- replays. A fork is a new job (origin 'fork') whose history starts as a copy of the
-- entries of its origin before forked_at_position.

-- Closed sets that other migrations of this release may also extend: add one value to
-- a named CHECK (col IN (...)) whatever it allows now (the helper of 0011, redefined:
-- a pg_temp function lives only in the session that made it).
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

-- 1. Provenance: a fork was made by an operator from another instance's history.
SELECT pg_temp.onceflow_allow_value('onceflow_jobs', 'onceflow_jobs_origin_check',
                                    'origin', 'fork');

-- 2. The operator's actions: retry one instance, retry by filter, fork.
SELECT pg_temp.onceflow_allow_value('onceflow_bulk_operations',
                                    'onceflow_bulk_operations_action_check', 'action', 'retry');
SELECT pg_temp.onceflow_allow_value('onceflow_operator_actions',
                                    'onceflow_operator_actions_action_check', 'action', 'retry');
SELECT pg_temp.onceflow_allow_value('onceflow_operator_actions',
                                    'onceflow_operator_actions_action_check', 'action',
                                    'bulk_retry');
SELECT pg_temp.onceflow_allow_value('onceflow_operator_actions',
                                    'onceflow_operator_actions_action_check', 'action', 'fork');

-- 3. The instance: where it failed, how often it was retried, where it was forked from.
--    (Columns without a volatile default: no table rewrite.)
ALTER TABLE onceflow_instances
    ADD COLUMN failed_position integer,
    ADD COLUMN retry_count integer NOT NULL DEFAULT 0,
    ADD COLUMN forked_from text,
    ADD COLUMN forked_at_position integer,
    ADD CONSTRAINT onceflow_instances_forked_check
        CHECK ((forked_from IS NULL) = (forked_at_position IS NULL));

-- 4. A retried step's attempts go on counting (attempt 4 follows the 3 that failed, so
--    the attempts table reads in order), while its retry budget starts again: retry_base
--    is how many attempts it had when it was last retried, and the engine counts the
--    policy's attempts from there (attempts - retry_base).
ALTER TABLE onceflow_steps
    ADD COLUMN retry_base integer NOT NULL DEFAULT 0;

-- The forks of an instance (its describe lists them); few rows, most instances none.
CREATE INDEX onceflow_instances_forked_from_idx
    ON onceflow_instances (forked_from) WHERE forked_from IS NOT NULL;
