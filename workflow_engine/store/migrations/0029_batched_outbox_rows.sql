-- onceflow schema, version 29: the hot paths' lifecycle events as one outbox row per
-- statement (issue 25, the outbox's cost).
--
-- Until now every event was a row of its own: its payload built as jsonb by the
-- statement that made the change, its index entry, its WAL, and later its delete. On
-- the engine's hot path (a claim, a checkpoint, a finish: one statement for a batch of
-- up to a few hundred instances) that was ~15 us of the server's CPU an event, six
-- events a three-step workflow, and most of what events cost the engine's throughput
-- (BENCHMARKS.md, "Lifecycle events"). A statement now writes ONE row holding its
-- events as parallel arrays (job_ids[i], seqs[i], types[i] ... are event i): ~0.8 us
-- an event in a micro-benchmark, and one delete per statement. The relay builds each
-- event's JSON data and headers from the arrays (workflow_engine/engine/relay.py), to
-- the same contract (docs/events.md); onceflow_outbox_events shows every event, of
-- either kind of row, with its data built here, for the console and for SQL.
--
-- The one-row-per-event layout stays, for Debezium's outbox event router (it reads one
-- event a row, with these column names): a session whose onceflow.outbox_layout is
-- 'per_event' (ALTER DATABASE ... SET onceflow.outbox_layout = 'per_event': every
-- session of every process, set BEFORE the processes of this version start) writes rows
-- as before. The rarer changes (onceflow_emit: operators, suspensions, duplicates) always
-- write one row an event, and so does an event whose extra data is large (a finish with
-- a big result): a row of several stays small. Either way a job's events keep their
-- order: each is written under the instance's row lock, so a row holding a later event
-- of a job is inserted after the one holding the earlier committed, and the relay
-- publishes rows in position order (within a row, a job's events in sequence order).

ALTER TABLE onceflow_outbox
    ALTER COLUMN id DROP NOT NULL,
    ALTER COLUMN aggregateid DROP NOT NULL,
    ALTER COLUMN type DROP NOT NULL,
    ALTER COLUMN seq DROP NOT NULL,
    ALTER COLUMN workflow DROP NOT NULL,
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN job_ids text[],
    ADD COLUMN seqs integer[],
    ADD COLUMN types text[],
    ADD COLUMN workflows text[],
    ADD COLUMN versions text[],
    ADD COLUMN statuses text[],
    ADD COLUMN runs integer[],
    -- the creating record's position (the events' "kafka"); NULL: none (not a record
    -- that came through Kafka: a schedule's tick, a child, a fork)
    ADD COLUMN kafka_topics text[],
    ADD COLUMN kafka_partitions integer[],
    ADD COLUMN kafka_offsets bigint[],
    -- what each event's kind adds to the common fields (NULL: nothing)
    ADD COLUMN extras jsonb[],
    -- how many events the row holds (read without the arrays, to size a relay's round)
    ADD COLUMN events integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT onceflow_outbox_layout_check CHECK (
        CASE WHEN job_ids IS NULL
             THEN id IS NOT NULL AND aggregateid IS NOT NULL AND type IS NOT NULL
                  AND seq IS NOT NULL AND workflow IS NOT NULL AND payload IS NOT NULL
                  AND events = 1
             ELSE id IS NULL AND aggregateid IS NULL AND payload IS NULL
                  -- every array there (a NULL one would pass the equalities below)
                  AND num_nonnulls(seqs, types, workflows, versions, statuses, runs,
                                   kafka_topics, kafka_partitions, kafka_offsets,
                                   extras) = 10
                  AND cardinality(job_ids) > 0 AND events = cardinality(job_ids)
                  AND cardinality(seqs) = cardinality(job_ids)
                  AND cardinality(types) = cardinality(job_ids)
                  AND cardinality(workflows) = cardinality(job_ids)
                  AND cardinality(versions) = cardinality(job_ids)
                  AND cardinality(statuses) = cardinality(job_ids)
                  AND cardinality(runs) = cardinality(job_ids)
                  AND cardinality(kafka_topics) = cardinality(job_ids)
                  AND cardinality(kafka_partitions) = cardinality(job_ids)
                  AND cardinality(kafka_offsets) = cardinality(job_ids)
                  AND cardinality(extras) = cardinality(job_ids)
        END);

COMMENT ON COLUMN onceflow_outbox.job_ids IS
    'A row of several events (one statement''s): event i is job_ids[i], seqs[i], types[i] ...';

-- Whether this session writes the hot paths' events as one row per statement (the
-- default) or one row per event (onceflow.outbox_layout = 'per_event', for Debezium).
CREATE FUNCTION onceflow_outbox_batched() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(current_setting('onceflow.outbox_layout', true), '') <> 'per_event'
$$;

-- Every event in the outbox, one row each, with its data as the relay publishes it
-- (docs/events.md): a row of one event as it is, a row of several unnested, their
-- data built here from the arrays and the row's time. The console's pending events read
-- it; it is for reading (a scan of the outbox, which backpressure keeps small).
CREATE VIEW onceflow_outbox_events AS
SELECT o.position, 1 AS ordinality, o.id, o.aggregateid, o.type, o.seq, o.workflow,
       o.payload, o.created_at
FROM onceflow_outbox o
WHERE o.job_ids IS NULL
UNION ALL
SELECT o.position, e.n, e.job_id || ':' || e.seq, e.job_id, e.type, e.seq, e.workflow,
       jsonb_build_object(
           'job_id', e.job_id, 'workflow', e.workflow, 'version', e.version,
           'sequence', e.seq,
           'time', to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           'status', e.status,
           'kafka', CASE WHEN e.topic IS NOT NULL
                         THEN jsonb_build_object('topic', e.topic, 'partition', e.part,
                                                 'offset', e.off) END,
           'run', e.run
       ) || coalesce(e.extra, '{}'::jsonb),
       o.created_at
FROM onceflow_outbox o
CROSS JOIN LATERAL unnest(o.job_ids, o.seqs, o.types, o.workflows, o.versions, o.statuses,
                          o.runs, o.kafka_topics, o.kafka_partitions, o.kafka_offsets,
                          o.extras)
    WITH ORDINALITY AS e(job_id, seq, type, workflow, version, status, run, topic, part, off,
                         extra, n)
WHERE o.job_ids IS NOT NULL;

COMMENT ON VIEW onceflow_outbox_events IS
    'Every unpublished lifecycle event, one row each, with its data (docs/events.md).';
