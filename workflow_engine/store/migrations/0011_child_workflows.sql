-- onceflow schema, version 11: child workflows (ctx.start_child / ctx.child_result).
--
-- A child is an ordinary job: its id (``<parent job id>__<name>``) goes through the
-- same unique constraint as every job (onceflow_jobs_job_id_key), so a replaying
-- parent, a second engine or a crash never makes a second child. The parent's history
-- records the start as an entry of kind 'child' (its child_job_id), and later the
-- child's result or error, so replay neither starts it again nor depends on the child's
-- row still existing (retention may prune a finished child before its parent).

-- Closed sets that other migrations of this release may also extend (0010 adds
-- 'schedule' to the origins): add one value to a named CHECK (col IN (...)) whatever
-- values it allows now, instead of restating the list and dropping someone else's.
CREATE FUNCTION pg_temp.onceflow_allow_value(p_table text, p_constraint text,
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

-- 1. Provenance: a child was started by its parent's workflow code, not by a record.
SELECT pg_temp.onceflow_allow_value('onceflow_jobs', 'onceflow_jobs_origin_check',
                                    'origin', 'child');
-- Jobs that did not come from a Kafka record (children) have no source position; every
-- record that did (http, kafka) still must.
ALTER TABLE onceflow_jobs
    ALTER COLUMN source_topic DROP NOT NULL,
    ALTER COLUMN source_partition DROP NOT NULL,
    ALTER COLUMN source_offset DROP NOT NULL,
    ADD CONSTRAINT onceflow_jobs_source_check CHECK (
        origin NOT IN ('http', 'kafka')
        OR (source_topic IS NOT NULL AND source_partition IS NOT NULL
            AND source_offset IS NOT NULL));

-- 2. The tree: a child knows its parent and what happens to it when the parent is
--    terminated. No foreign key to the parent: a parent may be pruned before a child
--    it abandoned.
ALTER TABLE onceflow_instances
    ADD COLUMN parent_job_id text,
    ADD COLUMN parent_close_policy text,
    ADD CONSTRAINT onceflow_instances_parent_close_policy_check
        CHECK (parent_close_policy IN ('terminate', 'abandon')),
    ADD CONSTRAINT onceflow_instances_parent_check
        CHECK ((parent_job_id IS NULL) = (parent_close_policy IS NULL));
CREATE INDEX onceflow_instances_parent_idx ON onceflow_instances (parent_job_id)
    WHERE parent_job_id IS NOT NULL;

-- 3. The parent's history entry of a child: status 'running' once started, 'waiting'
--    while the parent awaits it (ctx.child_result), 'complete' / 'failed' once the
--    parent has taken its result or error.
SELECT pg_temp.onceflow_allow_value('onceflow_steps', 'onceflow_steps_kind_check',
                                    'kind', 'child');
ALTER TABLE onceflow_steps
    ADD COLUMN child_job_id text,
    ADD CONSTRAINT onceflow_steps_child_check CHECK ((kind = 'child') = (child_job_id IS NOT NULL));

-- 4. job_trace with the tree: a parent's trace shows each child started and finished,
--    a child's shows its parent. Wraps whatever job_trace the earlier migrations
--    defined (renamed job_trace_without_children), so their rows stay.
ALTER FUNCTION job_trace(text) RENAME TO job_trace_without_children;

CREATE FUNCTION job_trace(p_job_id text)
RETURNS TABLE (at timestamptz, event text, detail text, layer text)
LANGUAGE sql STABLE
AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    -- A child has no HTTP request nor Kafka record: its 'received' / 'enqueued' rows
    -- would only say "-"; its own 'instance created' row names its parent instead.
    SELECT b.at, b.event, coalesce(b.detail, '') AS detail, b.layer, b.n AS ord, 0 AS src
    FROM job_trace_without_children(p_job_id) WITH ORDINALITY AS b(at, event, detail, layer, n)
    WHERE NOT (b.event IN ('received', 'enqueued', 'instance created') AND EXISTS (
        SELECT 1 FROM onceflow_jobs j WHERE j.job_id = p_job_id AND j.origin = 'child'))
    UNION ALL
    SELECT i.created_at, 'instance created',
           'workflow ' || i.workflow || ', started by parent ' || i.parent_job_id
             || ' (on parent close: ' || i.parent_close_policy || ')',
           'engine', 0, 0
    FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id)
    WHERE i.job_id = p_job_id AND j.origin = 'child'
    UNION ALL
    SELECT s.started_at, 'child started',
           '"' || s.name || '" ' || s.child_job_id
             || coalesce(' (workflow ' || c.workflow || ')', ''), 'engine', 0, 1
    FROM onceflow_steps s LEFT JOIN onceflow_instances c ON c.job_id = s.child_job_id
    WHERE s.job_id = p_job_id AND s.kind = 'child'
    UNION ALL
    SELECT c.finished_at, 'child ' || c.status,
           '"' || s.name || '" ' || s.child_job_id || coalesce(': ' || c.error, ''), 'engine', 0, 2
    FROM onceflow_steps s JOIN onceflow_instances c ON c.job_id = s.child_job_id
    WHERE s.job_id = p_job_id AND s.kind = 'child' AND c.finished_at IS NOT NULL
    UNION ALL
    SELECT s.finished_at,
           CASE s.status WHEN 'complete' THEN 'child result taken' ELSE 'child failure raised' END,
           '"' || s.name || '" ' || s.child_job_id || coalesce(': ' || s.error, ''), 'engine', 0, 3
    FROM onceflow_steps s
    WHERE s.job_id = p_job_id AND s.kind = 'child' AND s.finished_at IS NOT NULL
) AS t
ORDER BY date_trunc('milliseconds', t.at), t.src, t.ord, t.at
$$;

DROP FUNCTION pg_temp.onceflow_allow_value(text, text, text, text);
