-- onceflow schema, version 28: the dead-letter reason of a refused id reuse policy.
--
-- Migration 0027 (id reuse) added the reason code invalid_id_reuse (a job's id_reuse
-- unknown, looser than its workflow's, or on a plain task: DeadLetterReason) to the
-- worker and the dead-letter topic, but not to the dead-letter table's CHECK, so such a
-- letter could not be recorded in onceflow_dead_letters (found by
-- tests/integration/test_vocabulary.py on the merged code). The allowed values are
-- read from the constraint and the one added, as in migration 0023.

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
                                    'reason', 'invalid_id_reuse');
