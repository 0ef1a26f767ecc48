-- onceflow schema, version 18: durable step-output streams (issue 25, item 4).
--
-- Workflow code appends JSON values to named streams of its instance (ctx.emit, or
-- emit() in step code); GET /v1/jobs/{id}/stream serves them as Server-Sent Events.
--
-- onceflow_streams holds one counter row per instance that ever emitted. An append
-- takes the next seq from it with an UPDATE, so the row lock is held until the append
-- commits: two appends of one instance (gather branches, a step thread) get their seq
-- in commit order, and a reader that has seen seq N never finds a smaller one commit
-- later and skip it (a bigserial's ids can commit out of order). The same row counts
-- the instance's values and bytes against the configured bounds, in that transaction.
--
-- Each value has a deterministic key (where in the workflow's code it was emitted: the
-- body's branch path and history position, or the step's position and attempt, and
-- the index of the emit there; workflow_engine.engine.emits), unique per instance, and
-- the append is ON CONFLICT DO NOTHING: a replay that runs the body again emits the
-- same keys, and they collapse. The key is bounded (long ones are hashed by the
-- engine) so that it always fits its index entry.
--
-- Both tables go with their instance (retention's DELETE cascades; at most
-- ONCEFLOW_STREAM_MAX_VALUES rows per instance). A restart forgets the values with the
-- history but keeps the counter's last seq: the restarted run's values get seqs past
-- every one a reader may have seen.
CREATE TABLE onceflow_streams (
    job_id     text        NOT NULL CONSTRAINT onceflow_streams_pkey PRIMARY KEY
                           CONSTRAINT onceflow_streams_job_id_fkey
                           REFERENCES onceflow_instances (job_id) ON DELETE CASCADE,
    last_seq   bigint      NOT NULL,
    value_count integer    NOT NULL,
    value_bytes bigint     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_streams_counts_check
        CHECK (last_seq >= value_count AND value_count >= 0 AND value_bytes >= 0)
);

COMMENT ON TABLE onceflow_streams IS
    'Per instance: the last stream-value seq given out, and the values and bytes held.';

CREATE TABLE onceflow_stream_values (
    job_id     text        NOT NULL,
    seq        bigint      NOT NULL,
    stream     text        NOT NULL,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onceflow_stream_values_pkey PRIMARY KEY (job_id, seq),
    CONSTRAINT onceflow_stream_values_key_key UNIQUE (job_id, key),
    CONSTRAINT onceflow_stream_values_job_id_fkey FOREIGN KEY (job_id)
        REFERENCES onceflow_streams (job_id) ON DELETE CASCADE,
    CONSTRAINT onceflow_stream_values_stream_check
        CHECK (stream ~ '^[A-Za-z0-9_.:-]{1,200}$'),
    CONSTRAINT onceflow_stream_values_key_length CHECK (char_length(key) BETWEEN 1 AND 300)
);

COMMENT ON TABLE onceflow_stream_values IS
    'Values appended to an instance''s output streams, in seq order (served over SSE).';
