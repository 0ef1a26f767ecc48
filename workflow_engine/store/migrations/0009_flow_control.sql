-- onceflow schema, version 9: flow control in the claim (per-key concurrency, rate
-- limits, priority, fairness). The engine enforces it in its claim statement
-- (workflow_engine/store/flow.py), against these tables, so any number of engines
-- respect the limits together.

-- 1. Priority (1 highest .. 5, default 3), set when the instance is created from the
--    job's envelope; and the instance's fairness "lane": the value of the key its
--    workflow rotates claims over (fairness_key, else concurrency_key, else the rate
--    limit's key; '' for a workflow with flow control but no key, or a missing key),
--    computed when it is created. NULL: the workflow has no flow control, or the
--    creator did not know its definition (limits still hold: the claim computes every
--    key from params; only the per-key lookahead is lost).
ALTER TABLE onceflow_instances
    ADD COLUMN priority smallint NOT NULL DEFAULT 3,
    ADD COLUMN flow_lane text,
    ADD CONSTRAINT onceflow_instances_priority_check CHECK (priority BETWEEN 1 AND 5);

-- 2. The claim order: a priority is worth 30 seconds of waiting per level. An instance
--    of priority p that became runnable at t is claimed as if it had become runnable at
--    t + p * 30 s, so a priority-1 job passes priority-3 jobs that became runnable up to
--    60 s before it, and no job waits more than 120 s behind jobs that arrived after it
--    (anti-starvation: its effective priority rises one level per 30 s waited). The
--    order does not depend on the current time, so an index serves it.
--    IMMUTABLE is true here although timestamptz + interval is only STABLE in general:
--    an interval of seconds alone does not depend on the time zone.
CREATE FUNCTION onceflow_claim_order(run_after timestamptz, priority smallint)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT run_after + priority * interval '30 seconds' $$;

-- The plain claim's index: instances without a lane, i.e. of workflows without flow
-- control (whose instances always get a lane, '' when they have no key), so the plain
-- claim never walks past a flow-controlled workflow's backlog. run_after stays indexed
-- by onceflow_instances_runnable_idx for the timer queries.
CREATE INDEX onceflow_instances_claim_order_idx
    ON onceflow_instances (onceflow_claim_order(run_after, priority))
    WHERE status IN ('queued', 'sleeping', 'waiting') AND flow_lane IS NULL;
-- The flow-controlled claim's index: the distinct lanes of a workflow (a loose index
-- scan), the head of each lane, and the instances without a lane (flow_lane IS NULL)
-- in claim order, all without scanning other workflows' rows.
CREATE INDEX onceflow_instances_lane_idx
    ON onceflow_instances (workflow, flow_lane, onceflow_claim_order(run_after, priority))
    WHERE status IN ('queued', 'sleeping', 'waiting');

-- 3. Instance starts of rate-limited workflows (the first claim of an instance, or of
--    a restarted one), by rate-limit key; rows older than the period are deleted by the
--    claim that reads them.
CREATE TABLE onceflow_rate_starts (
    workflow   text        NOT NULL,
    key        text,
    job_id     text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX onceflow_rate_starts_idx ON onceflow_rate_starts (workflow, started_at);

-- 4. The flow control each workflow is claimed with, as the engines last declared it
--    (written by the claim when it changes), so describe and the trace can say why a
--    queued instance is held back without loading the workflow's code. Spec keys:
--    concurrency, concurrency_key (path under params, text[]), max_per_key,
--    hold_while_waiting, rate_limit, rate_period (seconds), rate_key, fairness_key.
CREATE TABLE onceflow_flow_controls (
    workflow   text        NOT NULL CONSTRAINT onceflow_flow_controls_pkey PRIMARY KEY,
    spec       jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_flow_controls_spec_check CHECK (jsonb_typeof(spec) = 'object')
);

CREATE FUNCTION onceflow_path(spec jsonb, field text) RETURNS text[]
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN jsonb_typeof(spec -> field) = 'array'
             THEN ARRAY(SELECT jsonb_array_elements_text(spec -> field)) END $$;

-- Why a runnable instance has not been claimed yet (NULL: it is not runnable now):
-- its key's concurrency limit, its key's rate limit, its workflow's limit, or its turn.
CREATE FUNCTION onceflow_hold_reason(p_job_id text) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    i record;
    s jsonb;
    k text;
    n bigint;
BEGIN
    SELECT * INTO i FROM onceflow_instances WHERE job_id = p_job_id;
    IF NOT FOUND OR i.status NOT IN ('queued', 'sleeping', 'waiting') OR i.run_after > now() THEN
        RETURN NULL;
    END IF;
    SELECT spec INTO s FROM onceflow_flow_controls WHERE workflow = i.workflow;
    IF s IS NOT NULL AND onceflow_path(s, 'concurrency_key') IS NOT NULL
       AND NOT (i.status <> 'queued' AND coalesce((s ->> 'hold_while_waiting')::boolean, false)) THEN
        k := i.params #>> onceflow_path(s, 'concurrency_key');
        SELECT count(*) INTO n FROM onceflow_instances o
        WHERE o.workflow = i.workflow
          AND (o.status = 'running' OR (coalesce((s ->> 'hold_while_waiting')::boolean, false)
                                        AND o.status IN ('sleeping', 'waiting')))
          AND o.params #>> onceflow_path(s, 'concurrency_key') IS NOT DISTINCT FROM k;
        IF n >= (s ->> 'max_per_key')::int THEN
            RETURN format('per-key limit for key %s: %s of %s slots held',
                          coalesce(k, '(none)'), n, s ->> 'max_per_key');
        END IF;
    END IF;
    IF s IS NOT NULL AND s ? 'rate_limit' AND i.started_at IS NULL THEN
        k := i.params #>> onceflow_path(s, 'rate_key');
        SELECT count(*) INTO n FROM onceflow_rate_starts r
        WHERE r.workflow = i.workflow AND r.key IS NOT DISTINCT FROM k
          AND r.started_at > now() - make_interval(secs => (s ->> 'rate_period')::float8);
        IF n >= (s ->> 'rate_limit')::int THEN
            RETURN format('rate limit for key %s: %s starts in the last %s s (limit %s)',
                          coalesce(k, '(none)'), n, s ->> 'rate_period', s ->> 'rate_limit');
        END IF;
    END IF;
    IF s IS NOT NULL AND s ? 'concurrency' THEN
        SELECT count(*) INTO n FROM onceflow_instances o
        WHERE o.workflow = i.workflow AND o.status = 'running';
        IF n >= (s ->> 'concurrency')::int THEN
            RETURN format('workflow concurrency limit: %s of %s running', n, s ->> 'concurrency');
        END IF;
    END IF;
    RETURN format('waiting for its turn (priority %s%s)', i.priority,
                  CASE WHEN onceflow_path(s, 'fairness_key') IS NOT NULL
                       THEN ', fairness key ' || coalesce(i.params #>> onceflow_path(s, 'fairness_key'), '(none)')
                       ELSE '' END);
END
$$;

-- 5. A record whose envelope carries a priority outside 1..5 is dead-lettered with its
--    own reason (DeadLetterReason.INVALID_PRIORITY).
ALTER TABLE onceflow_dead_letters
    DROP CONSTRAINT onceflow_dead_letters_reason_check,
    ADD CONSTRAINT onceflow_dead_letters_reason_check CHECK (reason IN (
        'no_value', 'not_json', 'not_an_object', 'unsupported_version', 'invalid_job_id',
        'key_mismatch', 'missing_workflow', 'invalid_params', 'invalid_submitted_at',
        'invalid_priority', 'too_large', 'unknown_type', 'task_failed', 'database_refused'));
