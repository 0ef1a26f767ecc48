-- onceflow schema, version 15: the instances list's has_duplicates and payload_mismatch
-- filters read two flags on the instance, served by partial indexes, instead of probing
-- onceflow_duplicate_deliveries for every instance they pass (issue 23).
--
-- The filters were EXISTS over the duplicates with the job's receive time (their
-- partition key) looked up per instance. Measured on 1M instances whose 25,000
-- duplicated ids (50,000 rows) all lie in the older half, EXPLAIN ANALYZE of one page:
-- 2.3-2.5 s, the planner either hashing the duplicates against every instance (the
-- receive-time lookup run 1M times) or walking the created index newest first and
-- probing each of 35 partitions per instance until 51 matched; a count took 2.0 s.
-- A duplicated id is rare and its rows are clustered in time (an incident's
-- resubmissions), which is exactly where "walk the order, test each row" cannot stop
-- early. With the flags, a page reads the 51 newest entries of a partial index that
-- holds only duplicated instances, whatever their share or their age (figures in
-- BENCHMARKS.md, "The has_duplicates filter").
--
-- The streams worker sets the flags in the transaction that records a duplicate row
-- (workflow_engine.store.instances.create_instances_in), in a statement after the one
-- that wrote it, so that an instance another worker committed while this one waited on
-- the job id's registry row is seen. The flags only ever go from false to true, as the
-- rows they stand for are kept while their instance exists (retention keeps a live
-- instance's duplicate rows, migration 0013).
ALTER TABLE onceflow_instances
    ADD COLUMN duplicated boolean NOT NULL DEFAULT false,
    ADD COLUMN mismatched boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT onceflow_instances_mismatched_check CHECK (duplicated OR NOT mismatched);

COMMENT ON COLUMN onceflow_instances.duplicated IS
    'A later delivery of this job id was recorded (onceflow_duplicate_deliveries).';
COMMENT ON COLUMN onceflow_instances.mismatched IS
    'One of those deliveries had other params or named another workflow.';

-- The duplicate rows of the job id's current registry row (job_received_at: an id
-- deleted by retention and submitted again starts with no duplicates).
UPDATE onceflow_instances i
SET duplicated = true, mismatched = d.mismatched
FROM (
    SELECT d.job_id, bool_or(NOT d.params_match OR d.workflow_match IS FALSE) AS mismatched
    FROM onceflow_duplicate_deliveries d
    JOIN onceflow_jobs j ON j.job_id = d.job_id AND j.received_at = d.job_received_at
    GROUP BY d.job_id
) d
WHERE i.job_id = d.job_id;

-- The list's two orders (created, updated), newest first by a backward scan.
CREATE INDEX onceflow_instances_duplicated_created_idx
    ON onceflow_instances (created_at, job_id) WHERE duplicated;
CREATE INDEX onceflow_instances_duplicated_updated_idx
    ON onceflow_instances (updated_at, job_id) WHERE duplicated;
