-- onceflow schema, version 21: delayed start (issue 26, item 5).
--
-- A job may say when it may start: run_at (an RFC 3339 time) or start_after (seconds
-- after its submission), in the HTTP body or the Kafka envelope. The instance is
-- created at once (its id is taken, and deduplicated, at once) with run_after set to
-- that time, so the claim (run_after <= now) and the engines' next-timer wait take it
-- as they take a sleep's end; no column of its own. A record whose start time is not a
-- time, or more than a year ahead, is dead-lettered with its own reason.
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
                                    'reason', 'invalid_run_at');
