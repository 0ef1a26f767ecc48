-- onceflow schema, version 30: a webhook delivery of an event of a derived job id.
--
-- A job id the system derives (a schedule's tick and its children, a fork, a batch
-- run, and since this version a later run's child, <parent>__<name>~run<N>) may be up to
-- 200 characters (onceflow.ids.MAX_DERIVED_JOB_ID); its events' ids are
-- <job_id>:<sequence>, so up to 211. The deliveries' event_id was bounded at 200, and
-- the dispatcher skipped every event whose job id was not a client-valid one: a
-- webhook subscribed to a child workflow got none of a reused parent's run 2 child's
-- events (found in review).

ALTER TABLE onceflow_webhook_deliveries
    DROP CONSTRAINT onceflow_webhook_deliveries_event_id_length,
    ADD CONSTRAINT onceflow_webhook_deliveries_event_id_length
        CHECK (char_length(event_id) <= 220);
