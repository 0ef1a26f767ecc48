-- onceflow schema, version 24: singleton policies (issue 26, item 3).
--
-- @workflow(singleton=Singleton(key, mode)) keeps at most one live instance per value of
-- a params key. Running is bounded by the claim's per-key limit (one per key, held while
-- sleeping or waiting: migration 0009's machinery, declared by the policy), so two
-- engines never run two of one key. What a NEW instance does while another of its key
-- is live is decided when it is created, in the creating transaction
-- (store/writes/singleton.py), under a transaction-level advisory lock on
-- (workflow, key), so two workers creating jobs of one key at once take their decisions
-- one after the other and the second sees the first's instance:
--   skip (alias cancel_newest): the new instance is 'skipped' (terminal, never runs),
--     skipped_for naming the live instance it gave way to;
--   cancel_in_progress: every older live instance of the key is terminated by the
--     operator's terminate rule (at once when no engine runs it, else requested of its
--     engine, which stops it at its next step boundary), cancelled_by naming the new one.

-- 1. A new terminal status: skipped.
ALTER TABLE onceflow_instances
    DROP CONSTRAINT onceflow_instances_status_check,
    ADD CONSTRAINT onceflow_instances_status_check CHECK (status IN (
        'queued', 'running', 'sleeping', 'waiting', 'paused', 'complete', 'errored',
        'terminated', 'skipped')),
    DROP CONSTRAINT onceflow_instances_finished_check,
    ADD CONSTRAINT onceflow_instances_finished_check CHECK (
        (status IN ('complete', 'errored', 'terminated', 'skipped')) = (finished_at IS NOT NULL));

-- 2. The key's value (bounded like a fairness lane, migration 0014: at most 200 bytes as
--    it is, else 'md5:' and its md5), set only for a workflow whose policy decides at
--    creation (NULL otherwise); the live instance a skipped one gave way to; the newer
--    instance that cancelled this one.
ALTER TABLE onceflow_instances
    ADD COLUMN singleton_key text,
    ADD COLUMN skipped_for text,
    ADD COLUMN cancelled_by text,
    ADD CONSTRAINT onceflow_instances_skipped_check CHECK (
        status <> 'skipped' OR skipped_for IS NOT NULL);

-- 3. The live instances of a key, which the creating transaction reads under its lock.
CREATE INDEX onceflow_instances_singleton_idx
    ON onceflow_instances (workflow, singleton_key, created_at)
    WHERE singleton_key IS NOT NULL
      AND status IN ('queued', 'running', 'sleeping', 'waiting', 'paused');
