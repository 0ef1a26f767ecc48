-- onceflow schema, version 13: retiring a history partition no longer locks it
-- against writes, so it can neither stall nor deadlock with the engine's checkpoints.
--
-- 0012 took SHARE on the partition while it looked for the rows to keep, then ACCESS
-- EXCLUSIVE on the parent to detach it. The engine's attempt UPDATEs and the restart's
-- DELETE filter on job_id, never on started_at, so they lock every partition: while
-- the retire held SHARE each of them waited, and one that already held the parent
-- (ROW EXCLUSIVE, taken by an earlier statement of its transaction) closed a cycle
-- with the detach - a deadlock, which aborted the retire (every round, under load) or
-- the engine's whole write batch.
--
-- Now the retire holds nothing stronger than ACCESS SHARE until the detach:
--   1. the job ids whose rows must be kept are collected with a plain read (writers
--      go on; an UPDATE may land in the partition after this read);
--   2. DETACH: ACCESS EXCLUSIVE on the parent, waiting at most the caller's
--      lock_timeout for the transactions that hold it (maintenance sets 2 s);
--   3. from the detached table, which no writer can reach any more, the current rows
--      of those job ids (an index probe per job id, not a scan: the parent stays
--      locked until commit) go back through the parent into the default partition,
--      then the table is dropped.
-- Keeping by job id from the first read misses nothing: all rows of a job id are kept
-- or dropped together, and no job id becomes one to keep after the read - the only
-- revival of a finished instance, a restart, deletes its attempts in the same
-- transaction; new attempts are stamped now(), never in an expired range; a
-- duplicate delivery written meanwhile into an expired range is for a job id that
-- either had its instance or task run at the read (kept with it) or never gets one
-- (the registry makes any later submission a duplicate).
--
-- CREATE OR REPLACE keeps the owner and the grants (REVOKE from PUBLIC in 0012,
-- EXECUTE for the app role by grant_app_role); the attributes are restated.
CREATE OR REPLACE FUNCTION onceflow_retire_partition(p_partition text, p_cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_parent text;
    v_keep text[];
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
    -- Step 3 must see the writes committed while the detach waited: each statement
    -- needs its own snapshot.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_retire_partition: run it in a READ'
                                        || ' COMMITTED transaction';
    END IF;
    -- 1. The job ids to keep (no table lock beyond the read's ACCESS SHARE).
    IF v_parent = 'onceflow_step_attempts' THEN
        EXECUTE 'SELECT array_agg(DISTINCT a.job_id) FROM ' || quote_ident(p_partition)
                || ' a WHERE EXISTS (SELECT 1 FROM onceflow_instances i'
                || ' WHERE i.job_id = a.job_id'
                || ' AND (i.finished_at IS NULL OR i.finished_at >= $1))'
            INTO v_keep USING p_cutoff;
    ELSE
        EXECUTE 'SELECT array_agg(DISTINCT d.job_id) FROM ' || quote_ident(p_partition)
                || ' d WHERE EXISTS (SELECT 1 FROM onceflow_instances i'
                || ' WHERE i.job_id = d.job_id) OR EXISTS (SELECT 1 FROM'
                || ' onceflow_task_runs t WHERE t.job_id = d.job_id)'
            INTO v_keep;
    END IF;
    -- 2. Detach: from here the range routes to the default partition and no statement
    --    can write the detached table.
    EXECUTE 'ALTER TABLE ' || quote_ident(v_parent) || ' DETACH PARTITION '
            || quote_ident(p_partition);
    -- 3. The kept job ids' rows as they are now (with every write committed before the
    --    detach), back into the parent, then the rest goes in one DROP.
    v_kept := 0;
    IF v_keep IS NOT NULL THEN
        EXECUTE 'INSERT INTO ' || quote_ident(v_parent) || ' OVERRIDING SYSTEM VALUE'
                || ' SELECT * FROM ' || quote_ident(p_partition) || ' WHERE job_id = ANY($1)'
            USING v_keep;
        GET DIAGNOSTICS v_kept = ROW_COUNT;
    END IF;
    EXECUTE 'DROP TABLE ' || quote_ident(p_partition);
    RETURN v_kept;
END
$$;
