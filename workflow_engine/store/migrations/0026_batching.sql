-- onceflow schema, version 26: batching many jobs into one run (issue 26, item 2).
--
-- @workflow(batch=Batch(max_size, max_wait, key)): each job is still its own instance
-- (one row per job id, the unique constraint unchanged), created by the worker as
-- 'batching', a status no engine claims. An engine's batch former
-- (store/writes/batches.py) takes up to max_size of one (workflow, key)'s waiting
-- members FOR UPDATE SKIP LOCKED, re-checked under the lock (still 'batching'; max_size
-- of them, or the oldest due max_wait ago), and in that one transaction inserts the
-- batch run (a new job id '<first member>~batch', through the same unique constraints)
-- whose params list the members, and marks every member 'batched' with batch_id and
-- its place (batch_index). A member is in at most one batch: the status check under the
-- row lock.
--
-- When the batch run's status changes to a final one, every member gets its own in the
-- same statement's transaction (the trigger below, so every path that finishes an
-- instance - an engine's finish, an operator's terminate, a time limit - does it): its
-- result (the run's list, element batch_index; or its dict, the member's job id), or
-- the run's error; and when the run is live again (restart, retry), the members are
-- 'batched' again.

-- 1. Two live statuses: waiting in the pool, and in a batch run.
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

SELECT pg_temp.onceflow_allow_value('onceflow_instances', 'onceflow_instances_status_check',
                                    'status', 'batching');
SELECT pg_temp.onceflow_allow_value('onceflow_instances', 'onceflow_instances_status_check',
                                    'status', 'batched');
-- A batch run is a job of its own, made by an engine (no Kafka record).
SELECT pg_temp.onceflow_allow_value('onceflow_jobs', 'onceflow_jobs_origin_check',
                                    'origin', 'batch');

-- 2. A member: its key's value in the pool (bounded like a fairness lane, migration
--    0014), the batch run it is in and its place there. A batch run: how many members.
ALTER TABLE onceflow_instances
    ADD COLUMN batch_key text,
    ADD COLUMN batch_id text,
    ADD COLUMN batch_index integer,
    ADD COLUMN batch_size integer,
    ADD CONSTRAINT onceflow_instances_batch_member_check CHECK (
        (batch_id IS NULL) = (batch_index IS NULL)
        AND (status NOT IN ('batching', 'batched') OR batch_key IS NOT NULL)
        AND (status <> 'batched' OR batch_id IS NOT NULL)
        AND (status <> 'batching' OR batch_id IS NULL)),
    ADD CONSTRAINT onceflow_instances_batch_size_check CHECK (
        batch_size IS NULL OR (batch_size >= 1 AND batch_key IS NULL));

-- 3. The pool, which the former reads per (workflow, key) in the order members became
--    eligible (run_after: a delayed start delays a member too), and a run's members.
CREATE INDEX onceflow_instances_batching_idx
    ON onceflow_instances (workflow, batch_key, run_after, job_id)
    WHERE status = 'batching';
CREATE INDEX onceflow_instances_batch_id_idx
    ON onceflow_instances (batch_id, batch_index)
    WHERE batch_id IS NOT NULL;

-- 4. The members' outcome, from their batch run's, in the transaction that changes it.
--    Final: complete (the run's result is a list with one element per member, or an
--    object keyed by member job id; any other shape errors the member, which the engine
--    never writes: it errors the run first), errored, terminated (with the run's error).
--    Live again after a final status (restart, retry): back to 'batched'.
--    Each member gets its own lifecycle event (onceflow_emit, migration 0017).
CREATE FUNCTION onceflow_batch_outcome() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    final constant text[] := ARRAY['complete', 'errored', 'terminated', 'skipped'];
    ids text[];
BEGIN
    IF NEW.status = ANY(final) THEN
        WITH members AS (
            SELECT m.job_id, m.batch_index FROM onceflow_instances m
            WHERE m.batch_id = NEW.job_id AND m.status = 'batched'
            ORDER BY m.job_id
            FOR UPDATE OF m
        ),
        outcome AS (
            SELECT mb.job_id,
                   CASE WHEN NEW.status <> 'complete' THEN NULL
                        WHEN jsonb_typeof(NEW.result) = 'array'
                             AND jsonb_array_length(NEW.result) = NEW.batch_size
                            THEN NEW.result -> mb.batch_index
                        WHEN jsonb_typeof(NEW.result) = 'object'
                             AND NEW.result ? mb.job_id
                            THEN NEW.result -> mb.job_id
                   END AS result,
                   CASE WHEN NEW.status <> 'complete' THEN NEW.status
                        WHEN (jsonb_typeof(NEW.result) = 'array'
                              AND jsonb_array_length(NEW.result) = NEW.batch_size)
                             OR (jsonb_typeof(NEW.result) = 'object'
                                 AND NEW.result ? mb.job_id)
                            THEN 'complete'
                        ELSE 'errored'
                   END AS status
            FROM members mb
        ),
        done AS (
            UPDATE onceflow_instances m
            SET status = o.status, result = o.result, finished_at = now(), updated_at = now(),
                error = CASE o.status
                    WHEN 'complete' THEN NULL
                    WHEN 'errored' THEN 'batch ' || NEW.job_id || ' '
                        || CASE WHEN NEW.status = 'complete'
                                THEN 'completed with no result for this member'
                                ELSE 'errored: ' || coalesce(NEW.error, '') END
                    ELSE 'batch ' || NEW.job_id || ' terminated: '
                        || coalesce(NEW.error, '') END
            FROM outcome o
            WHERE m.job_id = o.job_id
            RETURNING m.job_id
        )
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM done;
    ELSE
        WITH members AS (
            SELECT m.job_id FROM onceflow_instances m
            WHERE m.batch_id = NEW.job_id AND m.status = ANY(final)
            ORDER BY m.job_id
            FOR UPDATE OF m
        ),
        done AS (
            UPDATE onceflow_instances m
            SET status = 'batched', result = NULL, error = NULL, finished_at = NULL,
                updated_at = now()
            FROM members mb WHERE m.job_id = mb.job_id
            RETURNING m.job_id
        )
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM done;
    END IF;
    IF ids IS NOT NULL THEN
        -- instance.complete / instance.errored / instance.terminated (final) or
        -- instance.batched again, naming the batch run
        PERFORM onceflow_emit(
            ids,
            (SELECT array_agg('instance.' || CASE WHEN m.status = 'batched' THEN 'batched'
                                                  ELSE m.status END ORDER BY m.job_id)
             FROM onceflow_instances m WHERE m.job_id = ANY(ids)),
            (SELECT array_agg(
                 jsonb_build_object('batch', jsonb_build_object(
                     'batch_id', NEW.job_id, 'index', m.batch_index, 'size', NEW.batch_size))
                 || CASE WHEN m.status = 'complete' THEN jsonb_build_object('result', m.result)
                         WHEN m.status = 'batched' THEN '{}'::jsonb
                         ELSE jsonb_build_object('error', m.error) END
                 ORDER BY m.job_id)
             FROM onceflow_instances m WHERE m.job_id = ANY(ids)));
    END IF;
    RETURN NULL;
END $$;

-- Only a batch run's rows, only when its status changes: every other update of an
-- instance pays the WHEN test on the row, nothing more.
CREATE TRIGGER onceflow_instances_batch_outcome
    AFTER UPDATE OF status ON onceflow_instances
    FOR EACH ROW
    WHEN (NEW.batch_size IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
          AND ((NEW.status IN ('complete', 'errored', 'terminated', 'skipped'))
               <> (OLD.status IN ('complete', 'errored', 'terminated', 'skipped'))))
    EXECUTE FUNCTION onceflow_batch_outcome();
