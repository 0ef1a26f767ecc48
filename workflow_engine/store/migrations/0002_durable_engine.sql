-- onceflow schema, version 2: durable sleeps, events, control operations, tasks.

-- Steps become "history entries" of three kinds: a step run, a sleep, an event wait.
ALTER TABLE onceflow_steps
    ADD COLUMN kind text NOT NULL DEFAULT 'step',
    ADD COLUMN wake_at timestamptz,
    ADD COLUMN event_type text,
    ADD CONSTRAINT onceflow_steps_kind_check CHECK (kind IN ('step', 'sleep', 'event')),
    ADD CONSTRAINT onceflow_steps_event_type_check CHECK ((kind = 'event') = (event_type IS NOT NULL));
ALTER TABLE onceflow_steps
    DROP CONSTRAINT onceflow_steps_status_check,
    ADD CONSTRAINT onceflow_steps_status_check
        CHECK (status IN ('running', 'sleeping', 'waiting', 'complete', 'failed')),
    DROP CONSTRAINT onceflow_steps_finished_check,
    ADD CONSTRAINT onceflow_steps_finished_check
        CHECK ((status IN ('running', 'sleeping', 'waiting')) = (finished_at IS NULL));

-- A control operation asked of an instance while an engine runs it; the engine
-- carries it out at the next step boundary.
ALTER TABLE onceflow_instances
    ADD COLUMN requested_action text,
    ADD COLUMN restart_count integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT onceflow_instances_requested_action_check
        CHECK (requested_action IN ('pause', 'terminate', 'restart'));

-- Sleeping and waiting instances are claimed again when run_after falls due (a sleep
-- ends, a retry delay passes, an event arrives or its wait times out).
DROP INDEX onceflow_instances_runnable_idx;
CREATE INDEX onceflow_instances_runnable_idx ON onceflow_instances (run_after)
    WHERE status IN ('queued', 'sleeping', 'waiting');
CREATE INDEX onceflow_instances_finished_idx ON onceflow_instances (finished_at)
    WHERE finished_at IS NOT NULL;

-- Events sent to an instance; kept until a wait_for_event of their type consumes them.
CREATE TABLE onceflow_events (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    job_id            text        NOT NULL,
    type              text        NOT NULL,
    payload           jsonb,
    sent_at           timestamptz NOT NULL DEFAULT now(),
    consumed_at       timestamptz,
    consumed_by       integer,
    CONSTRAINT onceflow_events_pkey PRIMARY KEY (id),
    CONSTRAINT onceflow_events_instance_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_instances (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_events_consumed_check CHECK ((consumed_at IS NULL) = (consumed_by IS NULL))
);
CREATE INDEX onceflow_events_pending_idx ON onceflow_events (job_id, type, id)
    WHERE consumed_at IS NULL;

-- Plain queue tasks: one run record per job id, run by the streams worker.
CREATE TABLE onceflow_task_runs (
    job_id            text        NOT NULL,
    task              text        NOT NULL,
    params            jsonb       NOT NULL,
    status            text        NOT NULL DEFAULT 'pending',
    attempts          integer     NOT NULL DEFAULT 0,
    result            jsonb,
    error             text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    CONSTRAINT onceflow_task_runs_job_id_key PRIMARY KEY (job_id),
    CONSTRAINT onceflow_task_runs_job_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_jobs (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_task_runs_status_check
        CHECK (status IN ('pending', 'succeeded', 'dead_lettered')),
    CONSTRAINT onceflow_task_runs_finished_check
        CHECK ((status = 'pending') = (finished_at IS NULL))
);
