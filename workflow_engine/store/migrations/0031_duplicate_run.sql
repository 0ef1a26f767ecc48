-- onceflow schema, version 31: the run a duplicate delivery collapsed into.
--
-- Start-and-wait answers a resubmission with the run its own record belongs to
-- (store/views/outcomes.py). A record that started a run is found in onceflow_runs by its
-- position; one that collapsed as a duplicate was answered the id's current run, which
-- is not the run it joined when another resubmission started a later run in between
-- (id reuse). The worker now writes down the run on the duplicate's row: the instance's
-- run as its creating statement reads it (1 for an instance the same statement creates).
-- Rows written before this migration have none: they are answered the current run.

ALTER TABLE onceflow_duplicate_deliveries ADD COLUMN run integer;

COMMENT ON COLUMN onceflow_duplicate_deliveries.run IS
    'The run of the job id this delivery collapsed into (NULL: recorded before migration 31).';
