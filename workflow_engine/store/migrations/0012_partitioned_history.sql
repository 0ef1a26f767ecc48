-- onceflow schema, version 12: the growing history tables are time-partitioned, so
-- that retention drops whole partitions (no DELETE, no dead tuples, no vacuum debt)
-- and the hot indexes stay the size of a few days of history, not of months.
--
-- Partitioned (RANGE, one partition per interval, daily here; the engine's maintenance
-- service creates partitions ahead and retires expired ones, see
-- workflow_engine/store/partitions.py):
--   * onceflow_step_attempts, on started_at (one row per step attempt: the largest);
--   * onceflow_duplicate_deliveries, on job_received_at, the receive time of the job id
--     it duplicates (onceflow_jobs.received_at, fixed when the id is first seen). Not on
--     its own received_at: the key of a partitioned table's unique constraint must
--     contain the partition key, and a redelivery of the same Kafka record arrives at
--     another time - (position, job_received_at) is as unique as (position) because a
--     Kafka position always carries the same job id.
-- Not partitioned, on purpose:
--   * onceflow_jobs, the job-id registry: its primary key is the "one instance per job
--     id" guarantee and must stay globally unique; a time-partitioned key would make it
--     unique per time range only. It stays one B-tree (depth 4 at 100M ids).
--   * onceflow_instances and onceflow_steps: live state, referenced by job_id from
--     steps and events, and the target of ON CONFLICT (job_id); they are still deleted
--     row by row by retention (cascading to steps), one partition interval after their
--     attempts went with a dropped partition.
--   * onceflow_dead_letters: poison records only (bounded by bad input, not by
--     traffic), and its source-position key cannot include a time for the same reason.
-- Each partitioned table has a DEFAULT partition for rows outside every range (older
-- than the first partition, or written while the maintainer lagged) and for the rows
-- of live instances kept when their partition is retired.
--
-- Neither partitioned table keeps its foreign key (attempts -> steps, duplicates ->
-- jobs), deliberately. ON DELETE CASCADE into a partitioned table probes every
-- partition's index once per deleted parent row (the partition key is not in the
-- join): measured at 1M attempt rows in 34 daily partitions, deleting one day of
-- instances took 25 s against 2 s unpartitioned. Rows are instead removed by
-- dropping their partition; a restart deletes its attempts explicitly; the few rows
-- parked in a default partition are deleted by maintenance once their step or job id
-- is gone. Every insert derives its row from the parent row in the same statement
-- (the step upsert, the job-id upsert), so an orphan cannot be written.

-- 1. Partition management as two SECURITY DEFINER functions, so that the services'
--    role (which cannot change the schema) can run retention; each accepts only the
--    tables below, and nothing but the migrations' owner and the granted app role
--    may call it.
CREATE FUNCTION onceflow_add_partition(p_parent text, p_from timestamptz, p_to timestamptz)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_key text := CASE p_parent WHEN 'onceflow_step_attempts' THEN 'started_at'
                                WHEN 'onceflow_duplicate_deliveries' THEN 'job_received_at' END;
    v_from timestamp := p_from AT TIME ZONE 'UTC';
    v_name text;
BEGIN
    IF v_key IS NULL THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_add_partition: ' || p_parent
                                        || ' is not a partitioned history table';
    END IF;
    IF p_to <= p_from THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_add_partition: empty range';
    END IF;
    v_name := p_parent || '_p' || to_char(v_from, 'YYYYMMDD')
              || CASE WHEN v_from = date_trunc('day', v_from) THEN ''
                      ELSE to_char(v_from, '_HH24MISS') END;
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN NULL;  -- exists already (another engine made it)
    END IF;
    -- Create, fill from the default partition, then attach: ATTACH takes only SHARE
    -- UPDATE EXCLUSIVE on the parent, so inserts into the other partitions go on.
    -- (No format(): the migration runner's driver would read its percent signs.)
    EXECUTE 'CREATE TABLE ' || quote_ident(v_name) || ' (LIKE ' || quote_ident(p_parent)
            || ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)';
    EXECUTE 'WITH moved AS (DELETE FROM ' || quote_ident(p_parent || '_default')
            || ' WHERE ' || quote_ident(v_key) || ' >= $1 AND ' || quote_ident(v_key)
            || ' < $2 RETURNING *) INSERT INTO ' || quote_ident(v_name)
            || ' SELECT * FROM moved' USING p_from, p_to;
    EXECUTE 'ALTER TABLE ' || quote_ident(p_parent) || ' ATTACH PARTITION '
            || quote_ident(v_name) || ' FOR VALUES FROM (' || quote_literal(p_from)
            || ') TO (' || quote_literal(p_to) || ')';
    RETURN v_name;
END
$$;

-- Retire one partition whose whole range is past retention: its rows that still
-- belong to live history (below) move to the default partition, the rest go with the
-- partition in one DROP. The partition is first locked against writes only (SHARE:
-- the parent and its other partitions stay fully usable) while the survivors are
-- found; the parent is locked exclusively only for the detach, the small re-insert
-- and the drop. Returns how many rows were kept.
--   step attempts: kept while their instance exists and did not finish before p_cutoff;
--   duplicate deliveries: kept while their job id still has an instance or task run.
CREATE FUNCTION onceflow_retire_partition(p_partition text, p_cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_parent text;
    v_kept bigint;
BEGIN
    SELECT p.relname INTO v_parent
    FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
    WHERE i.inhrelid = to_regclass(p_partition);
    IF v_parent IS NULL OR v_parent NOT IN ('onceflow_step_attempts',
                                            'onceflow_duplicate_deliveries')
       OR p_partition = v_parent || '_default' THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_retire_partition: ' || p_partition
                                        || ' is not a retirable history partition';
    END IF;
    EXECUTE 'LOCK TABLE ' || quote_ident(p_partition) || ' IN SHARE MODE';
    IF v_parent = 'onceflow_step_attempts' THEN
        EXECUTE 'CREATE TEMP TABLE onceflow_survivors ON COMMIT DROP AS SELECT a.* FROM '
                || quote_ident(p_partition) || ' a WHERE EXISTS (SELECT 1 FROM'
                || ' onceflow_instances i WHERE i.job_id = a.job_id'
                || ' AND (i.finished_at IS NULL OR i.finished_at >= $1))'
            USING p_cutoff;
    ELSE
        EXECUTE 'CREATE TEMP TABLE onceflow_survivors ON COMMIT DROP AS SELECT d.* FROM '
                || quote_ident(p_partition) || ' d WHERE EXISTS (SELECT 1 FROM'
                || ' onceflow_instances i WHERE i.job_id = d.job_id) OR EXISTS (SELECT 1 FROM'
                || ' onceflow_task_runs t WHERE t.job_id = d.job_id)';
    END IF;
    EXECUTE 'ALTER TABLE ' || quote_ident(v_parent) || ' DETACH PARTITION '
            || quote_ident(p_partition);
    -- The range is detached: the survivors route to the default partition.
    EXECUTE 'INSERT INTO ' || quote_ident(v_parent)
            || ' OVERRIDING SYSTEM VALUE SELECT * FROM pg_temp.onceflow_survivors';
    GET DIAGNOSTICS v_kept = ROW_COUNT;
    EXECUTE 'DROP TABLE ' || quote_ident(p_partition);
    DROP TABLE pg_temp.onceflow_survivors;
    RETURN v_kept;
END
$$;

REVOKE ALL ON FUNCTION onceflow_add_partition(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow_retire_partition(text, timestamptz) FROM PUBLIC;

-- 2. onceflow_step_attempts -> partitioned on started_at. The primary key must contain
--    the partition key: (job_id, position, attempt, started_at). The attempt number
--    stays unique per step without it: it is onceflow_steps.attempts, incremented
--    under that row's lock by the statement that inserts the attempt.
ALTER TABLE onceflow_step_attempts RENAME TO onceflow_step_attempts_unpartitioned;
ALTER TABLE onceflow_step_attempts_unpartitioned
    RENAME CONSTRAINT onceflow_step_attempts_pkey TO onceflow_step_attempts_unpartitioned_pkey;

CREATE TABLE onceflow_step_attempts (
    LIKE onceflow_step_attempts_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    CONSTRAINT onceflow_step_attempts_pkey PRIMARY KEY (job_id, position, attempt, started_at)
) PARTITION BY RANGE (started_at);
CREATE TABLE onceflow_step_attempts_default PARTITION OF onceflow_step_attempts DEFAULT;

-- 3. onceflow_duplicate_deliveries -> partitioned on job_received_at.
ALTER TABLE onceflow_duplicate_deliveries RENAME TO onceflow_duplicate_deliveries_unpartitioned;
ALTER TABLE onceflow_duplicate_deliveries_unpartitioned
    RENAME CONSTRAINT onceflow_duplicate_deliveries_pkey
        TO onceflow_duplicate_deliveries_unpartitioned_pkey;
ALTER TABLE onceflow_duplicate_deliveries_unpartitioned
    RENAME CONSTRAINT onceflow_duplicate_deliveries_position_key
        TO onceflow_duplicate_deliveries_unpartitioned_position_key;
ALTER INDEX onceflow_duplicate_deliveries_job_idx
    RENAME TO onceflow_duplicate_deliveries_unpartitioned_job_idx;
ALTER SEQUENCE onceflow_duplicate_deliveries_id_seq
    RENAME TO onceflow_duplicate_deliveries_unpartitioned_id_seq;

CREATE TABLE onceflow_duplicate_deliveries (
    LIKE onceflow_duplicate_deliveries_unpartitioned
        INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,
    job_received_at timestamptz NOT NULL,
    CONSTRAINT onceflow_duplicate_deliveries_pkey PRIMARY KEY (id, job_received_at),
    CONSTRAINT onceflow_duplicate_deliveries_position_key
        UNIQUE (source_topic, source_partition, source_offset, job_received_at)
) PARTITION BY RANGE (job_received_at);
CREATE TABLE onceflow_duplicate_deliveries_default
    PARTITION OF onceflow_duplicate_deliveries DEFAULT;
CREATE INDEX onceflow_duplicate_deliveries_job_idx ON onceflow_duplicate_deliveries (job_id);

-- 4. Daily partitions over the existing history (at most 400 days back; older rows
--    land in the default partition) and three days ahead, then the rows, then the
--    old tables go.
DO $$
DECLARE
    v_day timestamptz;
    v_parent text;
    v_first timestamptz;
BEGIN
    FOREACH v_parent IN ARRAY ARRAY['onceflow_step_attempts', 'onceflow_duplicate_deliveries']
    LOOP
        IF v_parent = 'onceflow_step_attempts' THEN
            SELECT min(started_at) INTO v_first FROM onceflow_step_attempts_unpartitioned;
        ELSE
            SELECT min(j.received_at) INTO v_first
            FROM onceflow_duplicate_deliveries_unpartitioned d JOIN onceflow_jobs j USING (job_id);
        END IF;
        v_day := date_trunc('day', greatest(coalesce(v_first, now()), now() - interval '400 days')
                                   AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
        WHILE v_day < now() + interval '3 days' LOOP
            PERFORM onceflow_add_partition(v_parent, v_day, v_day + interval '1 day');
            v_day := v_day + interval '1 day';
        END LOOP;
    END LOOP;
END
$$;

INSERT INTO onceflow_step_attempts SELECT * FROM onceflow_step_attempts_unpartitioned;
DROP TABLE onceflow_step_attempts_unpartitioned;

INSERT INTO onceflow_duplicate_deliveries OVERRIDING SYSTEM VALUE
SELECT d.*, j.received_at
FROM onceflow_duplicate_deliveries_unpartitioned d JOIN onceflow_jobs j USING (job_id);
SELECT setval(pg_get_serial_sequence('onceflow_duplicate_deliveries', 'id'),
              greatest((SELECT max(id) FROM onceflow_duplicate_deliveries), 1),
              (SELECT max(id) FROM onceflow_duplicate_deliveries) IS NOT NULL);
DROP TABLE onceflow_duplicate_deliveries_unpartitioned;
