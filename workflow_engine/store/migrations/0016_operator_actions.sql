-- onceflow schema, version 16: the audit trail of operator actions (issue 23).
--
-- One row per operator action, whichever front end it came from (the admin API, the
-- console, the CLI): who (the API key's name, 'console:<key name>', 'cli:<OS user>'),
-- what, on which instance or with which filter, and how it went. Logins to the console
-- and every refusal at the door (401/403 on the admin API or a console form) are rows
-- too; successful reads are not. A control action, an event or a bulk start writes its
-- row in the transaction that acts (workflow_engine.store.operator_audit): the action
-- and its row commit together or not at all. A refusal, an error and a re-drive (Kafka,
-- not one transaction) write theirs in a transaction of their own.
--
-- Every text that reaches an index is bounded here, whatever the callers do (the store
-- module bounds them first): a refused request can carry any path, and a value too large
-- for a B-tree entry must never make the refusal fail (issue 23, case 1). Retention
-- deletes rows older than ONCEFLOW_RETENTION_OPERATOR_ACTIONS_SECONDS (90 days).
CREATE TABLE onceflow_operator_actions (
    id        bigint      GENERATED ALWAYS AS IDENTITY
                          CONSTRAINT onceflow_operator_actions_pkey PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    front_end text        NOT NULL,
    action    text        NOT NULL,
    result    text        NOT NULL,
    -- The instance acted on (a single action); NULL for a bulk start, a re-drive, a login.
    workflow  text,
    job_id    text,
    -- A bulk operation's instance filter (InstanceFilter.as_params()), or the dead
    -- letters a re-drive selected.
    filter    jsonb,
    -- The bulk operation started (no foreign key: the trail outlives bulk rows).
    bulk_id   bigint,
    -- The peer address of an HTTP request (NULL for the CLI).
    client    text,
    -- Why it was refused or failed; for one that went through, what it did.
    detail    text,
    CONSTRAINT onceflow_operator_actions_front_end_check
        CHECK (front_end IN ('admin_api', 'console', 'cli')),
    CONSTRAINT onceflow_operator_actions_action_check
        CHECK (action IN ('pause', 'resume', 'terminate', 'restart', 'send_event',
                          'bulk_pause', 'bulk_resume', 'bulk_terminate', 'bulk_restart',
                          'redrive', 'login', 'logout', 'request')),
    CONSTRAINT onceflow_operator_actions_result_check
        CHECK (result IN ('ok', 'refused', 'error')),
    CONSTRAINT onceflow_operator_actions_actor_length
        CHECK (char_length(actor) BETWEEN 1 AND 200),
    CONSTRAINT onceflow_operator_actions_workflow_length CHECK (char_length(workflow) <= 200),
    CONSTRAINT onceflow_operator_actions_job_id_length CHECK (char_length(job_id) <= 200),
    CONSTRAINT onceflow_operator_actions_client_length CHECK (char_length(client) <= 100),
    CONSTRAINT onceflow_operator_actions_detail_length CHECK (char_length(detail) <= 1000),
    CONSTRAINT onceflow_operator_actions_filter_size CHECK (pg_column_size(filter) <= 8192)
);

COMMENT ON TABLE onceflow_operator_actions IS
    'Operator actions (admin API, console, CLI), console logins and refusals: the audit trail.';

-- Newest first (the id order is the insertion order) is the primary key's backward
-- scan. The trail of one instance (its console page, --job-id) and of one operator:
CREATE INDEX onceflow_operator_actions_job_idx
    ON onceflow_operator_actions (job_id, id) WHERE job_id IS NOT NULL;
CREATE INDEX onceflow_operator_actions_actor_idx ON onceflow_operator_actions (actor, id);
-- Retention deletes by age.
CREATE INDEX onceflow_operator_actions_at_idx ON onceflow_operator_actions (at);
