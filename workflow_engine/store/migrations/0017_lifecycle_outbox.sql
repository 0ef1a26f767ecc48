-- onceflow schema, version 17: lifecycle events through a transactional outbox (issue 25).
--
-- Every change of an instance's lifecycle (created, duplicate delivery, started, step
-- completed / failed / retrying, waiting, sleeping, paused, resumed, terminated,
-- restarted, complete, errored) inserts its event into onceflow_outbox in the
-- transaction that makes the change, so no event exists for a change that rolled back
-- and no committed change lacks its event. The relay (workflow_engine/engine/relay.py)
-- publishes the rows in position order to the events topic and deletes what Kafka
-- acknowledged; Debezium's outbox event router can read the same table instead
-- (docs/operations.md, "Lifecycle events"): the columns id, aggregatetype, aggregateid,
-- type and payload are the names it expects.
--
-- The per-instance sequence is a counter on the instance row, bumped by the statement
-- that writes the event: the row is locked for it, so two transactions writing events of
-- one instance take their numbers in commit order, and the second one's outbox row is
-- inserted (its position drawn) only after the first committed.

ALTER TABLE onceflow_instances ADD COLUMN event_seq integer NOT NULL DEFAULT 0;

COMMENT ON COLUMN onceflow_instances.event_seq IS
    'The sequence of the last lifecycle event written for this instance (0: none yet).';

CREATE TABLE onceflow_outbox (
    position bigserial CONSTRAINT onceflow_outbox_pkey PRIMARY KEY,
    id text NOT NULL,  -- the CloudEvents id, <job_id>:<seq>
    aggregatetype text NOT NULL DEFAULT 'onceflow.instance',
    aggregateid text NOT NULL,  -- the job id (the record key)
    type text NOT NULL,  -- the CloudEvents type, dev.onceflow.<kind>
    seq integer NOT NULL,
    workflow text NOT NULL,
    payload jsonb NOT NULL,  -- the event's data (docs/events.md)
    created_at timestamptz NOT NULL DEFAULT now()
)
-- A queue table: rows live for milliseconds while the relay keeps up, so vacuum it by
-- row count rather than by a share of a table that is nearly empty.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
      autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 5000);

COMMENT ON TABLE onceflow_outbox IS
    'Lifecycle events written with their change, deleted once the events topic has them.';

-- Whether this session writes lifecycle events: ONCEFLOW_LIFECYCLE_EVENTS=false sets
-- onceflow.lifecycle_events = off on every connection a process opens (store.db); a
-- session that sets nothing writes them.
CREATE FUNCTION onceflow_events_on() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(current_setting('onceflow.lifecycle_events', true), '') <> 'off'
$$;

-- The data every event carries (docs/events.md); extra holds what its kind adds.
-- kafka: the position of the job record that created the instance, only for records
-- that came through Kafka (a schedule's tick and a child have none).
CREATE FUNCTION onceflow_event_data(
    job_id text, workflow text, version text, seq integer, status text, origin text,
    source_topic text, source_partition integer, source_offset bigint, extra jsonb
) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'job_id', job_id, 'workflow', workflow, 'version', version, 'sequence', seq,
        'time', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'status', status,
        'kafka', CASE WHEN origin IN ('http', 'kafka') AND source_topic IS NOT NULL
                      THEN jsonb_build_object('topic', source_topic,
                                              'partition', source_partition,
                                              'offset', source_offset) END
    ) || coalesce(extra, '{}'::jsonb)
$$;

-- The events of the rarer changes (operators' actions, suspensions, duplicates, child
-- creation), written by a statement of their own after the change, in its transaction:
-- one event per element, kinds without the dev.onceflow. prefix. The instances are
-- locked in job id order (like every multi-row write) and their counters bumped by the
-- number of their events; status is the instance's after the change. The hot paths
-- (create, claim, checkpoints, finish) write their events in their own statements
-- (workflow_engine/store/lifecycle.py) instead of paying this round trip.
CREATE FUNCTION onceflow_emit(job_ids text[], kinds text[], extras jsonb[]) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH input AS (
        SELECT t.job_id, t.kind, t.extra, t.ord
        FROM unnest(job_ids, kinds, extras) WITH ORDINALITY AS t(job_id, kind, extra, ord)
        WHERE onceflow_events_on()
    ),
    counts AS (
        SELECT job_id, count(*)::int AS n FROM input GROUP BY job_id
    ),
    locked AS (
        SELECT i.job_id FROM onceflow_instances i JOIN counts c USING (job_id)
        ORDER BY i.job_id
        FOR NO KEY UPDATE OF i
    ),
    bumped AS (
        UPDATE onceflow_instances i SET event_seq = i.event_seq + c.n
        FROM counts c JOIN locked l USING (job_id)
        WHERE i.job_id = c.job_id
        RETURNING i.job_id, i.workflow, i.version, i.status, i.event_seq - c.n AS base
    ),
    numbered AS (
        SELECT input.*, b.workflow, b.version, b.status,
               (b.base + row_number() OVER (PARTITION BY input.job_id ORDER BY input.ord))::int
                   AS seq
        FROM input JOIN bumped b USING (job_id)
    ),
    written AS (
        INSERT INTO onceflow_outbox (id, aggregateid, type, seq, workflow, payload)
        SELECT n.job_id || ':' || n.seq, n.job_id, 'dev.onceflow.' || n.kind, n.seq, n.workflow,
               onceflow_event_data(n.job_id, n.workflow, n.version, n.seq, n.status, j.origin,
                                   j.source_topic, j.source_partition, j.source_offset, n.extra)
        FROM numbered n LEFT JOIN onceflow_jobs j USING (job_id)
        ORDER BY n.job_id, n.seq
        RETURNING 1
    )
    SELECT count(*)::int FROM written
$$;
