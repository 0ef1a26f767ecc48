-- onceflow schema, version 8: bulk control operations, and the indexes of the
-- console's instance lists.

-- 1. One row per bulk operation ("pause every errored order-workflow instance"): the
--    filter it was started with (InstanceFilter.describe()), how many instances it
--    matched when it started, and its progress.
CREATE TABLE onceflow_bulk_operations (
    id          bigint      GENERATED ALWAYS AS IDENTITY
                            CONSTRAINT onceflow_bulk_operations_pkey PRIMARY KEY,
    action      text        NOT NULL,
    filter      text        NOT NULL,
    total       integer     NOT NULL,
    done        integer     NOT NULL DEFAULT 0,
    skipped     integer     NOT NULL DEFAULT 0,
    status      text        NOT NULL DEFAULT 'running',
    -- Progress marker: the last job id applied (the operation resumes after it).
    last_job_id text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    error       text,
    CONSTRAINT onceflow_bulk_operations_action_check
        CHECK (action IN ('pause', 'resume', 'terminate', 'restart')),
    CONSTRAINT onceflow_bulk_operations_status_check
        CHECK (status IN ('running', 'complete', 'failed')),
    CONSTRAINT onceflow_bulk_operations_finished_check
        CHECK ((status = 'running') = (finished_at IS NULL)),
    CONSTRAINT onceflow_bulk_operations_progress_check
        CHECK (done >= 0 AND skipped >= 0 AND done + skipped <= total)
);

-- 2. The job ids an operation matched when it started (its snapshot): it applies to
--    exactly these, in job-id order, whatever their status does meanwhile. Deleted
--    when the operation finishes (the counts stay on the operation).
CREATE TABLE onceflow_bulk_operation_items (
    operation_id bigint NOT NULL,
    job_id       text   NOT NULL,
    CONSTRAINT onceflow_bulk_operation_items_pkey PRIMARY KEY (operation_id, job_id),
    CONSTRAINT onceflow_bulk_operation_items_operation_fkey FOREIGN KEY (operation_id)
        REFERENCES onceflow_bulk_operations (id) ON DELETE CASCADE
);

-- 3. The instance lists (newest first, keyset-paged on (sort key, job_id)): one index
--    per sort, and one for the commonest filter (a workflow) under the default sort.
--    The updated_at index costs an index entry per instance update; most of those
--    updates already change an indexed column (status, lease_expires_at), so they were
--    not HOT updates before either.
CREATE INDEX onceflow_instances_created_idx ON onceflow_instances (created_at, job_id);
CREATE INDEX onceflow_instances_updated_idx ON onceflow_instances (updated_at, job_id);
CREATE INDEX onceflow_instances_workflow_created_idx
    ON onceflow_instances (workflow, created_at, job_id);
