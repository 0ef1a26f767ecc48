-- onceflow schema, version 19: signed webhooks on lifecycle events (issue 25, item 3).
--
-- A job may name a callback endpoint (a name from ONCEFLOW_WEBHOOK_ENDPOINTS, never a
-- URL); its instance keeps it. The webhook dispatcher reads the lifecycle events topic
-- and writes one delivery per (event, endpoint) that subscribes to it: the named unique
-- constraint makes the at-least-once events topic's redeliveries collapse. Each attempt
-- to send a delivery is a row of its own, opened in the transaction that claims it and
-- closed by the one that records the answer, fenced by the claim number
-- (workflow_engine.store.writes.webhooks). Deliveries and their attempts go with their
-- instance (ON DELETE CASCADE: the instances' retention removes them).

CREATE FUNCTION pg_temp.onceflow_allow_value(p_table text, p_constraint text,
                                             p_column text, p_value text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    allowed text[];
BEGIN
    SELECT array_agg(m[1] ORDER BY m[1]) INTO allowed
    FROM pg_constraint c,
         regexp_matches(pg_get_constraintdef(c.oid), '''([^'']*)''', 'g') AS m
    WHERE c.conname = p_constraint AND c.conrelid = to_regclass(p_table);
    IF allowed IS NULL THEN
        RAISE EXCEPTION 'constraint % on % not found', p_constraint, p_table;
    END IF;
    IF NOT p_value = ANY(allowed) THEN
        allowed := allowed || p_value;
    END IF;
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I, ADD CONSTRAINT %I CHECK (%I IN (%s))',
                   p_table, p_constraint, p_constraint, p_column,
                   (SELECT string_agg(quote_literal(v), ', ') FROM unnest(allowed) AS v));
END $$;

-- 1. The job's callback (checked by ingest and the worker against the configured names;
--    bounded here whatever they do).
ALTER TABLE onceflow_instances
    ADD COLUMN callback text,
    ADD CONSTRAINT onceflow_instances_callback_length CHECK (char_length(callback) <= 64);

COMMENT ON COLUMN onceflow_instances.callback IS
    'The webhook endpoint (a configured name) the job asked its lifecycle events be sent to.';

-- 2. A record whose callback is not an endpoint name, or names none configured, is a
--    dead letter with its reason.
SELECT pg_temp.onceflow_allow_value('onceflow_dead_letters', 'onceflow_dead_letters_reason_check',
                                    'reason', 'invalid_callback');
SELECT pg_temp.onceflow_allow_value('onceflow_dead_letters', 'onceflow_dead_letters_reason_check',
                                    'reason', 'unknown_callback');

-- 3. One delivery per (event, endpoint). status: pending (due at next_attempt_at),
--    sending (claimed by lease_owner until lease_expires_at, claim claim_count),
--    delivered, dead (dead_reason says why). body is the exact text sent (signed anew
--    at each attempt, with the same webhook-id: the event id).
CREATE TABLE onceflow_webhook_deliveries (
    id               bigint      GENERATED ALWAYS AS IDENTITY
                                 CONSTRAINT onceflow_webhook_deliveries_pkey PRIMARY KEY,
    event_id         text        NOT NULL,
    endpoint         text        NOT NULL,
    job_id           text        NOT NULL
                                 CONSTRAINT onceflow_webhook_deliveries_job_fkey
                                 REFERENCES onceflow_instances (job_id) ON DELETE CASCADE,
    workflow         text        NOT NULL,
    kind             text        NOT NULL,
    sequence         integer     NOT NULL,
    body             text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending',
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    give_up_at       timestamptz NOT NULL,
    claim_count      integer     NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    last_code        integer,
    last_error       text,
    dead_reason      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT onceflow_webhook_deliveries_event_endpoint_key UNIQUE (event_id, endpoint),
    CONSTRAINT onceflow_webhook_deliveries_status_check
        CHECK (status IN ('pending', 'sending', 'delivered', 'dead')),
    CONSTRAINT onceflow_webhook_deliveries_dead_reason_check
        CHECK (dead_reason IN ('retries_exhausted', 'refused_address', 'unknown_endpoint')),
    CONSTRAINT onceflow_webhook_deliveries_dead_check
        CHECK ((status = 'dead') = (dead_reason IS NOT NULL)),
    CONSTRAINT onceflow_webhook_deliveries_lease_check
        CHECK ((status = 'sending') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT onceflow_webhook_deliveries_event_id_length CHECK (char_length(event_id) <= 200),
    CONSTRAINT onceflow_webhook_deliveries_endpoint_length CHECK (char_length(endpoint) <= 64),
    CONSTRAINT onceflow_webhook_deliveries_kind_length CHECK (char_length(kind) <= 64),
    CONSTRAINT onceflow_webhook_deliveries_last_error_length CHECK (char_length(last_error) <= 1000)
);

COMMENT ON TABLE onceflow_webhook_deliveries IS
    'Webhook deliveries: one per (lifecycle event, subscribed endpoint), retried until delivered or dead.';

-- The claim: due pending deliveries, and claimed ones whose lease expired.
CREATE INDEX onceflow_webhook_deliveries_due_idx
    ON onceflow_webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX onceflow_webhook_deliveries_lease_idx
    ON onceflow_webhook_deliveries (lease_expires_at) WHERE status = 'sending';
-- An instance's deliveries (describe, the console, the trace; the cascade from retention).
CREATE INDEX onceflow_webhook_deliveries_job_idx ON onceflow_webhook_deliveries (job_id, id);
-- Redrive and the dead gauge.
CREATE INDEX onceflow_webhook_deliveries_dead_idx
    ON onceflow_webhook_deliveries (endpoint, id) WHERE status = 'dead';

-- 4. Every attempt: opened (outcome NULL) by the claim, closed by the record.
--    outcome: delivered (2xx), failed (another code, a timeout, a connection error;
--    retried), refused (an address the endpoint may not reach; not retried), lost (the
--    lease ran out before its outcome was recorded: it may or may not have been sent).
CREATE TABLE onceflow_webhook_attempts (
    delivery_id   bigint      NOT NULL
                              CONSTRAINT onceflow_webhook_attempts_delivery_fkey
                              REFERENCES onceflow_webhook_deliveries (id) ON DELETE CASCADE,
    attempt       integer     NOT NULL,
    claim_count   integer     NOT NULL,
    owner         text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    latency_ms    double precision,
    response_code integer,
    error         text,
    outcome       text,
    CONSTRAINT onceflow_webhook_attempts_pkey PRIMARY KEY (delivery_id, attempt),
    CONSTRAINT onceflow_webhook_attempts_outcome_check
        CHECK (outcome IN ('delivered', 'failed', 'refused', 'lost')),
    CONSTRAINT onceflow_webhook_attempts_owner_length CHECK (char_length(owner) <= 200),
    CONSTRAINT onceflow_webhook_attempts_error_length CHECK (char_length(error) <= 1000)
);

COMMENT ON TABLE onceflow_webhook_attempts IS
    'Each attempt to send a webhook delivery: when, how long, the response code or error.';

-- 5. job_trace with the webhook attempts. Wraps whatever job_trace the earlier
--    migrations defined (renamed job_trace_without_webhooks), so their rows stay.
ALTER FUNCTION job_trace(text) RENAME TO job_trace_without_webhooks;

CREATE FUNCTION job_trace(p_job_id text)
RETURNS TABLE (at timestamptz, event text, detail text, layer text)
LANGUAGE sql STABLE
AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    SELECT b.at, b.event, b.detail, b.layer, b.n AS ord, 0 AS src
    FROM job_trace_without_webhooks(p_job_id) WITH ORDINALITY AS b(at, event, detail, layer, n)
    UNION ALL
    SELECT a.started_at, 'webhook ' || coalesce(a.outcome, 'sending'),
           d.endpoint || ' ' || d.kind || ' (attempt ' || a.attempt
             || coalesce(', HTTP ' || a.response_code, '')
             || coalesce(', ' || round(a.latency_ms::numeric, 1) || ' ms', '')
             || coalesce(': ' || a.error, '') || ')',
           'webhooks', a.attempt, 1
    FROM onceflow_webhook_deliveries d
    JOIN onceflow_webhook_attempts a ON a.delivery_id = d.id
    WHERE d.job_id = p_job_id
    UNION ALL
    SELECT d.finished_at, 'webhook dead', d.endpoint || ' ' || d.kind || ': ' || d.dead_reason
             || coalesce(' (' || d.last_error || ')', ''),
           'webhooks', d.attempts + 1, 1
    FROM onceflow_webhook_deliveries d
    WHERE d.job_id = p_job_id AND d.status = 'dead'
) AS t
ORDER BY date_trunc('milliseconds', t.at), t.src, t.ord, t.at
$$;

DROP FUNCTION pg_temp.onceflow_allow_value(text, text, text, text);
