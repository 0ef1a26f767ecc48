-- onceflow schema, version 25: debounce (issue 26, item 1).
--
-- @workflow(debounce=Debounce(key, period, max_wait, mode)) starts, of the jobs of one
-- value of a params key that come within a period, only the last (trailing) or the
-- first (leading); the others are recorded 'debounced' (terminal, never run), naming
-- the instance that absorbed them. Decided in the streams worker's creating
-- transaction (store/writes/debounce.py) under a transaction-level advisory lock on
-- (workflow, key), so two workers take their decisions one after the other:
--   trailing: a new job takes the place of its key's pending instance (queued, never
--     claimed, run_after still ahead, created by the debounce), which becomes
--     'debounced' into it, locked FOR UPDATE and re-checked under that lock (an engine
--     that claimed it first wins: the new job opens a new window); the new one starts
--     at min(window start + max_wait, now + period), the window start carried forward;
--   leading: the first job of a key starts as usual; the later ones within the period
--     of its window start are 'debounced' into it.

-- 1. A new terminal status: debounced.
ALTER TABLE onceflow_instances
    DROP CONSTRAINT onceflow_instances_status_check,
    ADD CONSTRAINT onceflow_instances_status_check CHECK (status IN (
        'queued', 'running', 'sleeping', 'waiting', 'paused', 'complete', 'errored',
        'terminated', 'skipped', 'debounced')),
    DROP CONSTRAINT onceflow_instances_finished_check,
    ADD CONSTRAINT onceflow_instances_finished_check CHECK (
        (status IN ('complete', 'errored', 'terminated', 'skipped', 'debounced'))
        = (finished_at IS NOT NULL));

-- 2. The key's value (bounded like a fairness lane, migration 0014), set only for a
--    workflow with a debounce (NULL otherwise); when its window opened (trailing: the
--    first job of the window, carried forward by each job that takes the pending one's
--    place; leading: the leader's creation); the instance that absorbed a debounced one.
ALTER TABLE onceflow_instances
    ADD COLUMN debounce_key text,
    ADD COLUMN debounce_window_start timestamptz,
    ADD COLUMN debounced_into text,
    ADD CONSTRAINT onceflow_instances_debounced_check CHECK (
        status <> 'debounced' OR debounced_into IS NOT NULL),
    ADD CONSTRAINT onceflow_instances_debounce_window_check CHECK (
        (debounce_key IS NULL) = (debounce_window_start IS NULL));

-- 3. What the creating transaction reads under its lock: a key's queued instances (the
--    trailing pending one among them: few rows, whatever the key's history), and its
--    windows newest first (the leading leader). The debounced rows are in neither.
CREATE INDEX onceflow_instances_debounce_pending_idx
    ON onceflow_instances (workflow, debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'queued';
CREATE INDEX onceflow_instances_debounce_idx
    ON onceflow_instances (workflow, debounce_key, debounce_window_start)
    WHERE debounce_key IS NOT NULL AND status <> 'debounced';
