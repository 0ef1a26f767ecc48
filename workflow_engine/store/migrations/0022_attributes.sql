-- onceflow schema, version 22: searchable attributes (issue 26, item 7).
--
-- A job may carry attributes (a small JSON object of string keys to strings, numbers
-- and booleans: onceflow.envelope.check_attributes has the bounds) in the HTTP body or
-- the Kafka envelope; its instance keeps them, and workflow code updates them with
-- ctx.set_attributes (an entry of kind 'attributes' in the history, written in the
-- same transaction as the change, so a replay never applies one twice). Lists, the
-- admin API and bulk operations filter on them with @>, served by a GIN index
-- (jsonb_path_ops: containment only, a third the size of the default opclass). A
-- record whose attributes do not fit is a dead letter with its own reason.
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

-- 1. The attributes: a constant default adds the column without rewriting the table.
--    The bounds are the code's (one rule for ingest, the worker and the engine); the
--    database keeps the shape and a size cap above the rule's 2 KiB whatever they do.
ALTER TABLE onceflow_instances
    ADD COLUMN attributes jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD CONSTRAINT onceflow_instances_attributes_shape
        CHECK (jsonb_typeof(attributes) = 'object' AND octet_length(attributes::text) <= 4096);

COMMENT ON COLUMN onceflow_instances.attributes IS
    'Searchable attributes: set at submit, updated by ctx.set_attributes; filtered with @>.';

CREATE INDEX onceflow_instances_attributes_idx
    ON onceflow_instances USING gin (attributes jsonb_path_ops);

-- The planner estimates @> from the column's histogram (matchingsel). At the default
-- target, 100 entries, a value found in one of them is taken for 1% of the table, and
-- a page of it reads the created-at index backwards instead of the GIN index (1M
-- instances, a tenant of 0.1%: 17 to 45 ms a page instead of 6; a rare value whose
-- instances are all old reads most of that index). 1000 entries give 0.1% resolution;
-- the price is ANALYZE sampling 300,000 rows of this table (2.9 s at 1M, BENCHMARKS.md).
ALTER TABLE onceflow_instances ALTER COLUMN attributes SET STATISTICS 1000;

-- 2. ctx.set_attributes's history entries, and the dead letters of bad attributes.
SELECT pg_temp.onceflow_allow_value('onceflow_steps', 'onceflow_steps_kind_check',
                                    'kind', 'attributes');
SELECT pg_temp.onceflow_allow_value('onceflow_dead_letters', 'onceflow_dead_letters_reason_check',
                                    'reason', 'invalid_attributes');
