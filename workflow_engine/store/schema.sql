-- GENERATED FILE, do not edit: the schema the product migrations
-- (workflow_engine/store/migrations) produce on a fresh database, from
-- pg_dump --schema-only --no-owner --no-privileges, normalised.
-- Regenerate after adding a migration: onceflow dev schema-snapshot

CREATE FUNCTION public.job_trace(p_job_id text) RETURNS TABLE(at timestamp with time zone, event text, detail text, layer text)
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
    UNION ALL
    SELECT r.finished_at, 'run ' || r.run || ' ended',
           r.status || coalesce(' (' || r.timeout_kind || ')', '')
             || coalesce(': ' || r.error, '') || ', '
             || jsonb_array_length(r.steps) || ' step(s) kept',
           'engine', r.run, 2
    FROM onceflow_runs r WHERE r.job_id = p_job_id AND r.status IS NOT NULL
    UNION ALL
    SELECT r.created_at, 'run ' || r.run || ' started',
           'id reuse: a new submission'
             || coalesce(' from ' || r.source_topic || '/' || r.source_partition
                         || '@' || r.source_offset, '')
             || coalesce(', request ' || r.request_id, ''),
           'streams', r.run, 2
    FROM onceflow_runs r WHERE r.job_id = p_job_id AND r.run > 1
) AS t
ORDER BY date_trunc('milliseconds', t.at), t.src, t.ord, t.at
$$;

CREATE FUNCTION public.job_trace_without_children(p_job_id text) RETURNS TABLE(at timestamp with time zone, event text, detail text, layer text)
    LANGUAGE sql STABLE
    AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    SELECT j.submitted_at AS at, 1 AS ord, 'received' AS event,
           CASE j.origin
               WHEN 'http' THEN 'HTTP request ' || coalesce(j.request_id, '-')
               WHEN 'schedule' THEN coalesce(
                   'schedule ' || k.schedule || ', tick ' || k.tick_at || ' (' || k.trigger
                     || ', ' || round(k.lateness_seconds::numeric, 3) || ' s late)',
                   'schedule tick')
               ELSE 'produced directly to Kafka'
                    || coalesce(' (request ' || j.request_id || ')', '') END
             || coalesce(', traceparent ' || j.traceparent, '') AS detail,
           CASE j.origin WHEN 'http' THEN 'ingest' WHEN 'schedule' THEN 'engine'
                ELSE 'kafka' END AS layer
    FROM onceflow_jobs j LEFT JOIN onceflow_schedule_ticks k USING (job_id)
    WHERE j.job_id = p_job_id
    UNION ALL
    SELECT coalesce(j.enqueued_at, j.submitted_at), 2, 'enqueued',
           j.source_topic || '/' || j.source_partition || '@' || j.source_offset, 'kafka'
    FROM onceflow_jobs j WHERE j.job_id = p_job_id AND j.origin <> 'schedule'
    UNION ALL
    SELECT i.created_at, 3, 'instance created',
           'workflow ' || i.workflow || CASE j.origin
               WHEN 'schedule' THEN ' by the scheduler'
               ELSE ' from ' || j.source_topic || '/' || j.source_partition
                    || '@' || j.source_offset END,
           CASE j.origin WHEN 'schedule' THEN 'engine' ELSE 'streams' END
    FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id) WHERE i.job_id = p_job_id
    UNION ALL
    SELECT t.created_at, 3, 'task run created', 'task ' || t.task, 'streams'
    FROM onceflow_task_runs t WHERE t.job_id = p_job_id
    UNION ALL
    SELECT d.received_at, 4,
           CASE WHEN d.redelivery THEN 'redelivery collapsed' ELSE 'duplicate collapsed' END,
           d.source_topic || '/' || d.source_partition || '@' || d.source_offset
             || coalesce(', request ' || d.request_id, '')
             || CASE WHEN d.params_match THEN '' ELSE ', PAYLOAD MISMATCH (params differ)' END
             || CASE WHEN d.workflow_match IS FALSE
                     THEN ', WORKFLOW MISMATCH (' || d.workflow || ', not ' || j.type_name || ')'
                     ELSE '' END,
           'streams'
    FROM onceflow_duplicate_deliveries d JOIN onceflow_jobs j USING (job_id)
    WHERE d.job_id = p_job_id
    UNION ALL
    SELECT dl.created_at, 3, 'dead-lettered',
           dl.reason || ': ' || dl.detail
             || ' (from ' || dl.source_topic || '/' || dl.source_partition
             || '@' || dl.source_offset || ' to ' || dl.dlq_topic
             || coalesce('/' || dl.dlq_partition || '@' || dl.dlq_offset, '') || ')',
           'streams'
    FROM onceflow_dead_letters dl WHERE dl.job_id = p_job_id
    UNION ALL
    SELECT a.started_at, 5, 'step started',
           '"' || s.name || '" attempt ' || a.attempt || ' on ' || a.engine_id, 'engine'
    FROM onceflow_step_attempts a JOIN onceflow_steps s USING (job_id, position)
    WHERE a.job_id = p_job_id
    UNION ALL
    SELECT a.finished_at, 6, 'step ' || a.outcome,
           '"' || s.name || '" attempt ' || a.attempt || coalesce(': ' || a.error, ''), 'engine'
    FROM onceflow_step_attempts a JOIN onceflow_steps s USING (job_id, position)
    WHERE a.job_id = p_job_id AND a.finished_at IS NOT NULL
    UNION ALL
    SELECT s.started_at, 5,
           CASE s.kind WHEN 'sleep' THEN 'sleep started' ELSE 'waiting for event' END,
           '"' || s.name || '"' || CASE s.kind
               WHEN 'sleep' THEN ' until ' || s.wake_at
               ELSE ' of type ' || s.event_type || coalesce(' until ' || s.wake_at, '') END,
           'engine'
    FROM onceflow_steps s WHERE s.job_id = p_job_id AND s.kind IN ('sleep', 'event')
    UNION ALL
    SELECT s.finished_at, 6,
           CASE WHEN s.kind = 'sleep' THEN 'sleep ended'
                WHEN s.status = 'complete' THEN 'event received'
                ELSE 'event wait timed out' END,
           '"' || s.name || '"', 'engine'
    FROM onceflow_steps s
    WHERE s.job_id = p_job_id AND s.kind IN ('sleep', 'event') AND s.finished_at IS NOT NULL
    UNION ALL
    SELECT e.sent_at, 4, 'event sent', 'type ' || e.type, 'operator'
    FROM onceflow_events e WHERE e.job_id = p_job_id
    UNION ALL
    SELECT i.finished_at, 9, 'instance ' || i.status, coalesce(i.error, ''), 'engine'
    FROM onceflow_instances i WHERE i.job_id = p_job_id AND i.finished_at IS NOT NULL
    UNION ALL
    SELECT t.finished_at, 9, 'task ' || t.status,
           t.attempts || ' attempt(s)' || coalesce(': ' || t.error, ''), 'streams'
    FROM onceflow_task_runs t WHERE t.job_id = p_job_id AND t.finished_at IS NOT NULL
) AS t
ORDER BY date_trunc('milliseconds', t.at), t.ord, t.at
$$;

CREATE FUNCTION public.job_trace_without_webhooks(p_job_id text) RETURNS TABLE(at timestamp with time zone, event text, detail text, layer text)
    LANGUAGE sql STABLE
    AS $$
SELECT t.at, t.event, t.detail, t.layer FROM (
    -- A child has no HTTP request nor Kafka record: its 'received' / 'enqueued' rows
    -- would only say "-"; its own 'instance created' row names its parent instead.
    SELECT b.at, b.event, coalesce(b.detail, '') AS detail, b.layer, b.n AS ord, 0 AS src
    FROM job_trace_without_children(p_job_id) WITH ORDINALITY AS b(at, event, detail, layer, n)
    WHERE NOT (b.event IN ('received', 'enqueued', 'instance created') AND EXISTS (
        SELECT 1 FROM onceflow_jobs j WHERE j.job_id = p_job_id AND j.origin = 'child'))
    UNION ALL
    SELECT i.created_at, 'instance created',
           'workflow ' || i.workflow || ', started by parent ' || i.parent_job_id
             || ' (on parent close: ' || i.parent_close_policy || ')',
           'engine', 0, 0
    FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id)
    WHERE i.job_id = p_job_id AND j.origin = 'child'
    UNION ALL
    SELECT s.started_at, 'child started',
           '"' || s.name || '" ' || s.child_job_id
             || coalesce(' (workflow ' || c.workflow || ')', ''), 'engine', 0, 1
    FROM onceflow_steps s LEFT JOIN onceflow_instances c ON c.job_id = s.child_job_id
    WHERE s.job_id = p_job_id AND s.kind = 'child'
    UNION ALL
    SELECT c.finished_at, 'child ' || c.status,
           '"' || s.name || '" ' || s.child_job_id || coalesce(': ' || c.error, ''), 'engine', 0, 2
    FROM onceflow_steps s JOIN onceflow_instances c ON c.job_id = s.child_job_id
    WHERE s.job_id = p_job_id AND s.kind = 'child' AND c.finished_at IS NOT NULL
    UNION ALL
    SELECT s.finished_at,
           CASE s.status WHEN 'complete' THEN 'child result taken' ELSE 'child failure raised' END,
           '"' || s.name || '" ' || s.child_job_id || coalesce(': ' || s.error, ''), 'engine', 0, 3
    FROM onceflow_steps s
    WHERE s.job_id = p_job_id AND s.kind = 'child' AND s.finished_at IS NOT NULL
) AS t
ORDER BY date_trunc('milliseconds', t.at), t.src, t.ord, t.at
$$;

CREATE FUNCTION public.onceflow_add_partition(p_parent text, p_from timestamp with time zone, p_to timestamp with time zone) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO '$user', 'public'
    AS $_$
DECLARE
    v_key text := CASE p_parent WHEN 'onceflow_step_attempts' THEN 'started_at'
                                WHEN 'onceflow_duplicate_deliveries' THEN 'job_received_at' END;
    v_from timestamp := p_from AT TIME ZONE 'UTC';
    v_name text;
BEGIN
    IF v_key IS NULL THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_add_partition: ' || p_parent
                                        || ' is not a partitioned history table';
    END IF;
    IF p_to <= p_from THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_add_partition: empty range';
    END IF;
    v_name := p_parent || '_p' || to_char(v_from, 'YYYYMMDD')
              || CASE WHEN v_from = date_trunc('day', v_from) THEN ''
                      ELSE to_char(v_from, '_HH24MISS') END;
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN NULL;  -- exists already (another engine made it)
    END IF;
    -- Create, fill from the default partition, then attach: ATTACH takes only SHARE
    -- UPDATE EXCLUSIVE on the parent, so inserts into the other partitions go on.
    -- (No format(): the migration runner's driver would read its percent signs.)
    EXECUTE 'CREATE TABLE ' || quote_ident(v_name) || ' (LIKE ' || quote_ident(p_parent)
            || ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)';
    EXECUTE 'WITH moved AS (DELETE FROM ' || quote_ident(p_parent || '_default')
            || ' WHERE ' || quote_ident(v_key) || ' >= $1 AND ' || quote_ident(v_key)
            || ' < $2 RETURNING *) INSERT INTO ' || quote_ident(v_name)
            || ' SELECT * FROM moved' USING p_from, p_to;
    EXECUTE 'ALTER TABLE ' || quote_ident(p_parent) || ' ATTACH PARTITION '
            || quote_ident(v_name) || ' FOR VALUES FROM (' || quote_literal(p_from)
            || ') TO (' || quote_literal(p_to) || ')';
    RETURN v_name;
END
$_$;

CREATE FUNCTION public.onceflow_batch_outcome() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    final constant text[] := ARRAY['complete', 'errored', 'terminated', 'skipped'];
    ids text[];
BEGIN
    IF NEW.status = ANY(final) THEN
        WITH members AS (
            SELECT m.job_id, m.batch_index FROM onceflow_instances m
            WHERE m.batch_id = NEW.job_id AND m.status = 'batched'
            ORDER BY m.job_id
            FOR UPDATE OF m
        ),
        outcome AS (
            SELECT mb.job_id,
                   CASE WHEN NEW.status <> 'complete' THEN NULL
                        WHEN jsonb_typeof(NEW.result) = 'array'
                             AND jsonb_array_length(NEW.result) = NEW.batch_size
                            THEN NEW.result -> mb.batch_index
                        WHEN jsonb_typeof(NEW.result) = 'object'
                             AND NEW.result ? mb.job_id
                            THEN NEW.result -> mb.job_id
                   END AS result,
                   CASE WHEN NEW.status <> 'complete' THEN NEW.status
                        WHEN (jsonb_typeof(NEW.result) = 'array'
                              AND jsonb_array_length(NEW.result) = NEW.batch_size)
                             OR (jsonb_typeof(NEW.result) = 'object'
                                 AND NEW.result ? mb.job_id)
                            THEN 'complete'
                        ELSE 'errored'
                   END AS status
            FROM members mb
        ),
        done AS (
            UPDATE onceflow_instances m
            SET status = o.status, result = o.result, finished_at = now(), updated_at = now(),
                error = CASE o.status
                    WHEN 'complete' THEN NULL
                    WHEN 'errored' THEN 'batch ' || NEW.job_id || ' '
                        || CASE WHEN NEW.status = 'complete'
                                THEN 'completed with no result for this member'
                                ELSE 'errored: ' || coalesce(NEW.error, '') END
                    ELSE 'batch ' || NEW.job_id || ' terminated: '
                        || coalesce(NEW.error, '') END
            FROM outcome o
            WHERE m.job_id = o.job_id
            RETURNING m.job_id
        )
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM done;
    ELSE
        WITH members AS (
            SELECT m.job_id FROM onceflow_instances m
            WHERE m.batch_id = NEW.job_id AND m.status = ANY(final)
            ORDER BY m.job_id
            FOR UPDATE OF m
        ),
        done AS (
            UPDATE onceflow_instances m
            SET status = 'batched', result = NULL, error = NULL, finished_at = NULL,
                updated_at = now()
            FROM members mb WHERE m.job_id = mb.job_id
            RETURNING m.job_id
        )
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM done;
    END IF;
    IF ids IS NOT NULL THEN
        -- instance.complete / instance.errored / instance.terminated (final) or
        -- instance.batched again, naming the batch run
        PERFORM onceflow_emit(
            ids,
            (SELECT array_agg('instance.' || CASE WHEN m.status = 'batched' THEN 'batched'
                                                  ELSE m.status END ORDER BY m.job_id)
             FROM onceflow_instances m WHERE m.job_id = ANY(ids)),
            (SELECT array_agg(
                 jsonb_build_object('batch', jsonb_build_object(
                     'batch_id', NEW.job_id, 'index', m.batch_index, 'size', NEW.batch_size))
                 || CASE WHEN m.status = 'complete' THEN jsonb_build_object('result', m.result)
                         WHEN m.status = 'batched' THEN '{}'::jsonb
                         ELSE jsonb_build_object('error', m.error) END
                 ORDER BY m.job_id)
             FROM onceflow_instances m WHERE m.job_id = ANY(ids)));
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.onceflow_claim_order(run_after timestamp with time zone, priority smallint) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT run_after + priority * interval '30 seconds' $$;

CREATE FUNCTION public.onceflow_emit(job_ids text[], kinds text[], extras jsonb[]) RETURNS integer
    LANGUAGE sql
    AS $$
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
        RETURNING i.job_id, i.workflow, i.version, i.status, i.run, i.event_seq - c.n AS base
    ),
    numbered AS (
        SELECT input.*, b.workflow, b.version, b.status, b.run,
               (b.base + row_number() OVER (PARTITION BY input.job_id ORDER BY input.ord))::int
                   AS seq
        FROM input JOIN bumped b USING (job_id)
    ),
    written AS (
        INSERT INTO onceflow_outbox (id, aggregateid, type, seq, workflow, payload)
        SELECT n.job_id || ':' || n.seq, n.job_id, 'dev.onceflow.' || n.kind, n.seq, n.workflow,
               onceflow_event_data(n.job_id, n.workflow, n.version, n.seq, n.status, j.origin,
                                   j.source_topic, j.source_partition, j.source_offset,
                                   jsonb_build_object('run', n.run) || coalesce(n.extra, '{}'))
        FROM numbered n LEFT JOIN onceflow_jobs j USING (job_id)
        ORDER BY n.job_id, n.seq
        RETURNING 1
    )
    SELECT count(*)::int FROM written
$$;

CREATE FUNCTION public.onceflow_event_data(job_id text, workflow text, version text, seq integer, status text, origin text, source_topic text, source_partition integer, source_offset bigint, extra jsonb) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
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

CREATE FUNCTION public.onceflow_events_on() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT coalesce(current_setting('onceflow.lifecycle_events', true), '') <> 'off'
$$;

CREATE FUNCTION public.onceflow_flow_lane(params jsonb, lane_path text[]) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN lane_path IS NULL THEN NULL
                  WHEN cardinality(lane_path) = 0 THEN ''
                  ELSE onceflow_lane_key(coalesce(params #>> lane_path, '')) END $$;

CREATE FUNCTION public.onceflow_hold_reason(p_job_id text) RETURNS text
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

CREATE FUNCTION public.onceflow_lane_key(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN octet_length(value) <= 200 THEN value ELSE 'md5:' || md5(value) END $$;

CREATE FUNCTION public.onceflow_outbox_batched() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT coalesce(current_setting('onceflow.outbox_layout', true), '') <> 'per_event'
$$;

CREATE FUNCTION public.onceflow_path(spec jsonb, field text) RETURNS text[]
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT CASE WHEN jsonb_typeof(spec -> field) = 'array'
             THEN ARRAY(SELECT jsonb_array_elements_text(spec -> field)) END $$;

CREATE FUNCTION public.onceflow_retire_partition(p_partition text, p_cutoff timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO '$user', 'public'
    AS $_$
DECLARE
    v_parent text;
    v_keep text[];
    v_kept bigint;
BEGIN
    SELECT p.relname INTO v_parent
    FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
    WHERE i.inhrelid = to_regclass(p_partition);
    IF v_parent IS NULL OR v_parent NOT IN ('onceflow_step_attempts',
                                            'onceflow_duplicate_deliveries')
       OR p_partition = v_parent || '_default' THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_retire_partition: ' || p_partition
                                        || ' is not a retirable history partition';
    END IF;
    -- Step 3 must see the writes committed while the detach waited: each statement
    -- needs its own snapshot.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING MESSAGE = 'onceflow_retire_partition: run it in a READ'
                                        || ' COMMITTED transaction';
    END IF;
    -- 1. The job ids to keep (no table lock beyond the read's ACCESS SHARE).
    IF v_parent = 'onceflow_step_attempts' THEN
        EXECUTE 'SELECT array_agg(DISTINCT a.job_id) FROM ' || quote_ident(p_partition)
                || ' a WHERE EXISTS (SELECT 1 FROM onceflow_instances i'
                || ' WHERE i.job_id = a.job_id'
                || ' AND (i.finished_at IS NULL OR i.finished_at >= $1))'
            INTO v_keep USING p_cutoff;
    ELSE
        EXECUTE 'SELECT array_agg(DISTINCT d.job_id) FROM ' || quote_ident(p_partition)
                || ' d WHERE EXISTS (SELECT 1 FROM onceflow_instances i'
                || ' WHERE i.job_id = d.job_id) OR EXISTS (SELECT 1 FROM'
                || ' onceflow_task_runs t WHERE t.job_id = d.job_id)'
            INTO v_keep;
    END IF;
    -- 2. Detach: from here the range routes to the default partition and no statement
    --    can write the detached table.
    EXECUTE 'ALTER TABLE ' || quote_ident(v_parent) || ' DETACH PARTITION '
            || quote_ident(p_partition);
    -- 3. The kept job ids' rows as they are now (with every write committed before the
    --    detach), back into the parent, then the rest goes in one DROP.
    v_kept := 0;
    IF v_keep IS NOT NULL THEN
        EXECUTE 'INSERT INTO ' || quote_ident(v_parent) || ' OVERRIDING SYSTEM VALUE'
                || ' SELECT * FROM ' || quote_ident(p_partition) || ' WHERE job_id = ANY($1)'
            USING v_keep;
        GET DIAGNOSTICS v_kept = ROW_COUNT;
    END IF;
    EXECUTE 'DROP TABLE ' || quote_ident(p_partition);
    RETURN v_kept;
END
$_$;

CREATE TABLE public.onceflow_bulk_operation_items (
    operation_id bigint NOT NULL,
    job_id text NOT NULL,
    run integer DEFAULT 1 NOT NULL
);

CREATE TABLE public.onceflow_bulk_operations (
    id bigint NOT NULL,
    action text NOT NULL,
    filter text NOT NULL,
    total integer NOT NULL,
    done integer DEFAULT 0 NOT NULL,
    skipped integer DEFAULT 0 NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    last_job_id text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    error text,
    CONSTRAINT onceflow_bulk_operations_action_check CHECK ((action = ANY (ARRAY['pause'::text, 'restart'::text, 'resume'::text, 'terminate'::text, 'retry'::text]))),
    CONSTRAINT onceflow_bulk_operations_finished_check CHECK (((status = 'running'::text) = (finished_at IS NULL))),
    CONSTRAINT onceflow_bulk_operations_progress_check CHECK (((done >= 0) AND (skipped >= 0) AND ((done + skipped) <= total))),
    CONSTRAINT onceflow_bulk_operations_status_check CHECK ((status = ANY (ARRAY['running'::text, 'complete'::text, 'failed'::text])))
);

ALTER TABLE public.onceflow_bulk_operations ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_bulk_operations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_dead_letters (
    id bigint NOT NULL,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    job_id text,
    reason text NOT NULL,
    detail text DEFAULT ''::text NOT NULL,
    original_size integer NOT NULL,
    sha256 text NOT NULL,
    truncated boolean DEFAULT false NOT NULL,
    dlq_topic text NOT NULL,
    dlq_partition integer,
    dlq_offset bigint,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_dead_letters_dlq_position_check CHECK (((dlq_partition IS NULL) = (dlq_offset IS NULL))),
    CONSTRAINT onceflow_dead_letters_reason_check CHECK ((reason = ANY (ARRAY['database_refused'::text, 'invalid_attributes'::text, 'invalid_callback'::text, 'invalid_job_id'::text, 'invalid_params'::text, 'invalid_priority'::text, 'invalid_run_at'::text, 'invalid_start_within'::text, 'invalid_submitted_at'::text, 'key_mismatch'::text, 'missing_workflow'::text, 'no_value'::text, 'not_an_object'::text, 'not_json'::text, 'task_failed'::text, 'too_large'::text, 'unknown_callback'::text, 'unknown_type'::text, 'unsupported_version'::text, 'invalid_id_reuse'::text])))
);

ALTER TABLE public.onceflow_dead_letters ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_duplicate_deliveries (
    id bigint NOT NULL,
    job_id text NOT NULL,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    params_digest text NOT NULL,
    params_match boolean NOT NULL,
    redelivery boolean NOT NULL,
    request_id text,
    submitted_at timestamp with time zone,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone,
    workflow text,
    workflow_match boolean,
    job_received_at timestamp with time zone NOT NULL,
    run integer,
    CONSTRAINT onceflow_duplicate_deliveries_workflow_check CHECK (((workflow IS NULL) = (workflow_match IS NULL)))
)
PARTITION BY RANGE (job_received_at);

COMMENT ON COLUMN public.onceflow_duplicate_deliveries.run IS 'The run of the job id this delivery collapsed into (NULL: recorded before migration 31).';

CREATE TABLE public.onceflow_duplicate_deliveries_default (
    id bigint NOT NULL,
    job_id text NOT NULL,
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    params_digest text NOT NULL,
    params_match boolean NOT NULL,
    redelivery boolean NOT NULL,
    request_id text,
    submitted_at timestamp with time zone,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone,
    workflow text,
    workflow_match boolean,
    job_received_at timestamp with time zone NOT NULL,
    run integer,
    CONSTRAINT onceflow_duplicate_deliveries_workflow_check CHECK (((workflow IS NULL) = (workflow_match IS NULL)))
);

ALTER TABLE public.onceflow_duplicate_deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_duplicate_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_engines (
    engine_id text NOT NULL,
    workflows jsonb DEFAULT '{}'::jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_engines_workflows_check CHECK ((jsonb_typeof(workflows) = 'object'::text))
);

CREATE TABLE public.onceflow_events (
    id bigint NOT NULL,
    job_id text NOT NULL,
    type text NOT NULL,
    payload jsonb,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    consumed_at timestamp with time zone,
    consumed_by integer,
    CONSTRAINT onceflow_events_consumed_check CHECK (((consumed_at IS NULL) = (consumed_by IS NULL)))
);

ALTER TABLE public.onceflow_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_flow_controls (
    workflow text NOT NULL,
    spec jsonb NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_flow_controls_spec_check CHECK ((jsonb_typeof(spec) = 'object'::text))
);

CREATE TABLE public.onceflow_instances (
    job_id text NOT NULL,
    workflow text NOT NULL,
    params jsonb NOT NULL,
    status text DEFAULT 'queued'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    claim_count integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    requested_action text,
    restart_count integer DEFAULT 0 NOT NULL,
    version text,
    priority smallint DEFAULT 3 NOT NULL,
    flow_lane text,
    parent_job_id text,
    parent_close_policy text,
    duplicated boolean DEFAULT false NOT NULL,
    mismatched boolean DEFAULT false NOT NULL,
    event_seq integer DEFAULT 0 NOT NULL,
    callback text,
    failed_position integer,
    retry_count integer DEFAULT 0 NOT NULL,
    forked_from text,
    forked_at_position integer,
    attributes jsonb DEFAULT '{}'::jsonb NOT NULL,
    deadline timestamp with time zone,
    start_by timestamp with time zone,
    timeout_kind text,
    singleton_key text,
    skipped_for text,
    cancelled_by text,
    debounce_key text,
    debounce_window_start timestamp with time zone,
    debounced_into text,
    batch_key text,
    batch_id text,
    batch_index integer,
    batch_size integer,
    run integer DEFAULT 1 NOT NULL,
    CONSTRAINT onceflow_instances_attributes_shape CHECK (((jsonb_typeof(attributes) = 'object'::text) AND (octet_length((attributes)::text) <= 4096))),
    CONSTRAINT onceflow_instances_batch_member_check CHECK ((((batch_id IS NULL) = (batch_index IS NULL)) AND ((status <> ALL (ARRAY['batching'::text, 'batched'::text])) OR (batch_key IS NOT NULL)) AND ((status <> 'batched'::text) OR (batch_id IS NOT NULL)) AND ((status <> 'batching'::text) OR (batch_id IS NULL)))),
    CONSTRAINT onceflow_instances_batch_size_check CHECK (((batch_size IS NULL) OR ((batch_size >= 1) AND (batch_key IS NULL)))),
    CONSTRAINT onceflow_instances_callback_length CHECK ((char_length(callback) <= 64)),
    CONSTRAINT onceflow_instances_debounce_window_check CHECK (((debounce_key IS NULL) = (debounce_window_start IS NULL))),
    CONSTRAINT onceflow_instances_debounced_check CHECK (((status <> 'debounced'::text) OR (debounced_into IS NOT NULL))),
    CONSTRAINT onceflow_instances_finished_check CHECK (((status = ANY (ARRAY['complete'::text, 'errored'::text, 'terminated'::text, 'skipped'::text, 'debounced'::text])) = (finished_at IS NOT NULL))),
    CONSTRAINT onceflow_instances_forked_check CHECK (((forked_from IS NULL) = (forked_at_position IS NULL))),
    CONSTRAINT onceflow_instances_lease_check CHECK (((status = 'running'::text) = ((lease_owner IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT onceflow_instances_mismatched_check CHECK ((duplicated OR (NOT mismatched))),
    CONSTRAINT onceflow_instances_parent_check CHECK (((parent_job_id IS NULL) = (parent_close_policy IS NULL))),
    CONSTRAINT onceflow_instances_parent_close_policy_check CHECK ((parent_close_policy = ANY (ARRAY['terminate'::text, 'abandon'::text]))),
    CONSTRAINT onceflow_instances_priority_check CHECK (((priority >= 1) AND (priority <= 5))),
    CONSTRAINT onceflow_instances_requested_action_check CHECK ((requested_action = ANY (ARRAY['pause'::text, 'terminate'::text, 'restart'::text]))),
    CONSTRAINT onceflow_instances_run_check CHECK ((run >= 1)),
    CONSTRAINT onceflow_instances_skipped_check CHECK (((status <> 'skipped'::text) OR (skipped_for IS NOT NULL))),
    CONSTRAINT onceflow_instances_status_check CHECK ((status = ANY (ARRAY['batching'::text, 'complete'::text, 'debounced'::text, 'errored'::text, 'paused'::text, 'queued'::text, 'running'::text, 'skipped'::text, 'sleeping'::text, 'terminated'::text, 'waiting'::text, 'batched'::text]))),
    CONSTRAINT onceflow_instances_timeout_errored_check CHECK (((timeout_kind IS NULL) OR (status = 'errored'::text))),
    CONSTRAINT onceflow_instances_timeout_kind_check CHECK ((timeout_kind = ANY (ARRAY['start_timeout'::text, 'timed_out'::text])))
);
ALTER TABLE ONLY public.onceflow_instances ALTER COLUMN attributes SET STATISTICS 1000;

COMMENT ON COLUMN public.onceflow_instances.duplicated IS 'A later delivery of this job id was recorded (onceflow_duplicate_deliveries).';

COMMENT ON COLUMN public.onceflow_instances.mismatched IS 'One of those deliveries had other params or named another workflow.';

COMMENT ON COLUMN public.onceflow_instances.event_seq IS 'The sequence of the last lifecycle event written for this instance (0: none yet).';

COMMENT ON COLUMN public.onceflow_instances.callback IS 'The webhook endpoint (a configured name) the job asked its lifecycle events be sent to.';

COMMENT ON COLUMN public.onceflow_instances.attributes IS 'Searchable attributes: set at submit, updated by ctx.set_attributes; filtered with @>.';

COMMENT ON COLUMN public.onceflow_instances.deadline IS 'The execution deadline (execution_timeout), set by the claim that first started it.';

COMMENT ON COLUMN public.onceflow_instances.start_by IS 'Errored as start_timeout if not first claimed by then (start_within).';

COMMENT ON COLUMN public.onceflow_instances.timeout_kind IS 'The time limit that errored the instance: start_timeout or timed_out.';

COMMENT ON COLUMN public.onceflow_instances.run IS 'The current run of this job id (1, then one more per id reuse: onceflow_runs).';

CREATE TABLE public.onceflow_jobs (
    job_id text NOT NULL,
    kind text DEFAULT 'workflow'::text NOT NULL,
    type_name text NOT NULL,
    params_digest text NOT NULL,
    request_id text,
    submitted_at timestamp with time zone,
    traceparent text,
    source_topic text,
    source_partition integer,
    source_offset bigint,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone,
    origin text DEFAULT 'http'::text NOT NULL,
    CONSTRAINT onceflow_jobs_kind_check CHECK ((kind = ANY (ARRAY['workflow'::text, 'task'::text]))),
    CONSTRAINT onceflow_jobs_origin_check CHECK ((origin = ANY (ARRAY['child'::text, 'fork'::text, 'http'::text, 'kafka'::text, 'schedule'::text, 'batch'::text]))),
    CONSTRAINT onceflow_jobs_source_check CHECK (((origin <> ALL (ARRAY['http'::text, 'kafka'::text])) OR ((source_topic IS NOT NULL) AND (source_partition IS NOT NULL) AND (source_offset IS NOT NULL))))
);

CREATE TABLE public.onceflow_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    checksum text
);

CREATE TABLE public.onceflow_operator_actions (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    front_end text NOT NULL,
    action text NOT NULL,
    result text NOT NULL,
    workflow text,
    job_id text,
    filter jsonb,
    bulk_id bigint,
    client text,
    detail text,
    CONSTRAINT onceflow_operator_actions_action_check CHECK ((action = ANY (ARRAY['bulk_pause'::text, 'bulk_restart'::text, 'bulk_resume'::text, 'bulk_retry'::text, 'bulk_terminate'::text, 'login'::text, 'logout'::text, 'pause'::text, 'redrive'::text, 'request'::text, 'restart'::text, 'resume'::text, 'retry'::text, 'send_event'::text, 'terminate'::text, 'fork'::text]))),
    CONSTRAINT onceflow_operator_actions_actor_length CHECK (((char_length(actor) >= 1) AND (char_length(actor) <= 200))),
    CONSTRAINT onceflow_operator_actions_client_length CHECK ((char_length(client) <= 100)),
    CONSTRAINT onceflow_operator_actions_detail_length CHECK ((char_length(detail) <= 1000)),
    CONSTRAINT onceflow_operator_actions_filter_size CHECK ((pg_column_size(filter) <= 8192)),
    CONSTRAINT onceflow_operator_actions_front_end_check CHECK ((front_end = ANY (ARRAY['admin_api'::text, 'console'::text, 'cli'::text]))),
    CONSTRAINT onceflow_operator_actions_job_id_length CHECK ((char_length(job_id) <= 200)),
    CONSTRAINT onceflow_operator_actions_result_check CHECK ((result = ANY (ARRAY['ok'::text, 'refused'::text, 'error'::text]))),
    CONSTRAINT onceflow_operator_actions_workflow_length CHECK ((char_length(workflow) <= 200))
);

COMMENT ON TABLE public.onceflow_operator_actions IS 'Operator actions (admin API, console, CLI), console logins and refusals: the audit trail.';

ALTER TABLE public.onceflow_operator_actions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_operator_actions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.onceflow_outbox (
    "position" bigint NOT NULL,
    id text,
    aggregatetype text DEFAULT 'onceflow.instance'::text NOT NULL,
    aggregateid text,
    type text,
    seq integer,
    workflow text,
    payload jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    job_ids text[],
    seqs integer[],
    types text[],
    workflows text[],
    versions text[],
    statuses text[],
    runs integer[],
    kafka_topics text[],
    kafka_partitions integer[],
    kafka_offsets bigint[],
    extras jsonb[],
    events integer DEFAULT 1 NOT NULL,
    CONSTRAINT onceflow_outbox_layout_check CHECK (
CASE
    WHEN (job_ids IS NULL) THEN ((id IS NOT NULL) AND (aggregateid IS NOT NULL) AND (type IS NOT NULL) AND (seq IS NOT NULL) AND (workflow IS NOT NULL) AND (payload IS NOT NULL) AND (events = 1))
    ELSE ((id IS NULL) AND (aggregateid IS NULL) AND (payload IS NULL) AND (num_nonnulls(seqs, types, workflows, versions, statuses, runs, kafka_topics, kafka_partitions, kafka_offsets, extras) = 10) AND (cardinality(job_ids) > 0) AND (events = cardinality(job_ids)) AND (cardinality(seqs) = cardinality(job_ids)) AND (cardinality(types) = cardinality(job_ids)) AND (cardinality(workflows) = cardinality(job_ids)) AND (cardinality(versions) = cardinality(job_ids)) AND (cardinality(statuses) = cardinality(job_ids)) AND (cardinality(runs) = cardinality(job_ids)) AND (cardinality(kafka_topics) = cardinality(job_ids)) AND (cardinality(kafka_partitions) = cardinality(job_ids)) AND (cardinality(kafka_offsets) = cardinality(job_ids)) AND (cardinality(extras) = cardinality(job_ids)))
END)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='5000', autovacuum_vacuum_insert_scale_factor='0', autovacuum_vacuum_insert_threshold='5000');

COMMENT ON TABLE public.onceflow_outbox IS 'Lifecycle events written with their change, deleted once the events topic has them.';

COMMENT ON COLUMN public.onceflow_outbox.job_ids IS 'A row of several events (one statement''s): event i is job_ids[i], seqs[i], types[i] ...';

CREATE VIEW public.onceflow_outbox_events AS
 SELECT o."position",
    1 AS ordinality,
    o.id,
    o.aggregateid,
    o.type,
    o.seq,
    o.workflow,
    o.payload,
    o.created_at
   FROM public.onceflow_outbox o
  WHERE (o.job_ids IS NULL)
UNION ALL
 SELECT o."position",
    e.n AS ordinality,
    ((e.job_id || ':'::text) || e.seq) AS id,
    e.job_id AS aggregateid,
    e.type,
    e.seq,
    e.workflow,
    (jsonb_build_object('job_id', e.job_id, 'workflow', e.workflow, 'version', e.version, 'sequence', e.seq, 'time', to_char((o.created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'::text), 'status', e.status, 'kafka',
        CASE
            WHEN (e.topic IS NOT NULL) THEN jsonb_build_object('topic', e.topic, 'partition', e.part, 'offset', e.off)
            ELSE NULL::jsonb
        END, 'run', e.run) || COALESCE(e.extra, '{}'::jsonb)) AS payload,
    o.created_at
   FROM (public.onceflow_outbox o
     CROSS JOIN LATERAL UNNEST(o.job_ids, o.seqs, o.types, o.workflows, o.versions, o.statuses, o.runs, o.kafka_topics, o.kafka_partitions, o.kafka_offsets, o.extras) WITH ORDINALITY e(job_id, seq, type, workflow, version, status, run, topic, part, off, extra, n))
  WHERE (o.job_ids IS NOT NULL);

COMMENT ON VIEW public.onceflow_outbox_events IS 'Every unpublished lifecycle event, one row each, with its data (docs/events.md).';

CREATE SEQUENCE public.onceflow_outbox_position_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.onceflow_outbox_position_seq OWNED BY public.onceflow_outbox."position";

CREATE TABLE public.onceflow_rate_starts (
    workflow text NOT NULL,
    key text,
    job_id text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.onceflow_runs (
    job_id text NOT NULL,
    run integer NOT NULL,
    source_topic text,
    source_partition integer,
    source_offset bigint,
    request_id text,
    submitted_at timestamp with time zone,
    traceparent text,
    params jsonb NOT NULL,
    version text,
    callback text,
    created_at timestamp with time zone NOT NULL,
    status text,
    timeout_kind text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    result jsonb,
    error text,
    steps jsonb DEFAULT '[]'::jsonb NOT NULL,
    archived_at timestamp with time zone,
    CONSTRAINT onceflow_runs_archived_check CHECK (((status IS NULL) = (archived_at IS NULL))),
    CONSTRAINT onceflow_runs_run_check CHECK ((run >= 1)),
    CONSTRAINT onceflow_runs_status_check CHECK ((status = ANY (ARRAY['complete'::text, 'errored'::text, 'terminated'::text, 'skipped'::text]))),
    CONSTRAINT onceflow_runs_steps_check CHECK ((jsonb_typeof(steps) = 'array'::text))
);

COMMENT ON TABLE public.onceflow_runs IS 'The numbered runs of a reused job id (id_reuse): each finished run''s outcome and steps.';

COMMENT ON COLUMN public.onceflow_runs.submitted_at IS 'When the run''s submission was made (the claim''s, for a run after the first).';

COMMENT ON COLUMN public.onceflow_runs.traceparent IS 'The run''s submission''s W3C trace context: the parent of the run''s spans.';

COMMENT ON COLUMN public.onceflow_runs.callback IS 'A finished run''s callback: its events the dispatcher reads late still go there.';

CREATE TABLE public.onceflow_schedule_ticks (
    schedule text NOT NULL,
    tick_at timestamp with time zone NOT NULL,
    job_id text NOT NULL,
    trigger text NOT NULL,
    fired_at timestamp with time zone DEFAULT now() NOT NULL,
    lateness_seconds double precision NOT NULL,
    CONSTRAINT onceflow_schedule_ticks_trigger_check CHECK ((trigger = ANY (ARRAY['on_time'::text, 'catch_up'::text, 'buffered'::text, 'backfill'::text])))
);

CREATE TABLE public.onceflow_schedules (
    name text NOT NULL,
    workflow text NOT NULL,
    cron text,
    every_seconds integer,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    params jsonb DEFAULT '{}'::jsonb NOT NULL,
    catchup text DEFAULT 'run-once'::text NOT NULL,
    overlap text DEFAULT 'skip'::text NOT NULL,
    max_catchup integer DEFAULT 100 NOT NULL,
    declared boolean DEFAULT false NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    next_fire_at timestamp with time zone NOT NULL,
    buffered_tick_at timestamp with time zone,
    last_tick_at timestamp with time zone,
    last_job_id text,
    last_fired_at timestamp with time zone,
    ticks_fired bigint DEFAULT 0 NOT NULL,
    ticks_skipped bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_schedules_catchup_check CHECK ((catchup = ANY (ARRAY['skip'::text, 'run-once'::text, 'run-all'::text]))),
    CONSTRAINT onceflow_schedules_every_check CHECK (((every_seconds IS NULL) OR (every_seconds >= 1))),
    CONSTRAINT onceflow_schedules_max_catchup_check CHECK (((max_catchup >= 1) AND (max_catchup <= 1000))),
    CONSTRAINT onceflow_schedules_overlap_check CHECK ((overlap = ANY (ARRAY['skip'::text, 'allow'::text, 'buffer-one'::text]))),
    CONSTRAINT onceflow_schedules_spec_check CHECK (((cron IS NULL) <> (every_seconds IS NULL)))
);

CREATE TABLE public.onceflow_step_attempts (
    job_id text NOT NULL,
    "position" integer NOT NULL,
    attempt integer NOT NULL,
    engine_id text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    error text,
    CONSTRAINT onceflow_step_attempts_outcome_check CHECK (((outcome IS NULL) OR (outcome = ANY (ARRAY['complete'::text, 'retry'::text, 'failed'::text, 'abandoned'::text]))))
)
PARTITION BY RANGE (started_at);

CREATE TABLE public.onceflow_step_attempts_default (
    job_id text NOT NULL,
    "position" integer NOT NULL,
    attempt integer NOT NULL,
    engine_id text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    error text,
    CONSTRAINT onceflow_step_attempts_outcome_check CHECK (((outcome IS NULL) OR (outcome = ANY (ARRAY['complete'::text, 'retry'::text, 'failed'::text, 'abandoned'::text]))))
);

CREATE TABLE public.onceflow_steps (
    job_id text NOT NULL,
    "position" integer NOT NULL,
    name text NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    kind text DEFAULT 'step'::text NOT NULL,
    wake_at timestamp with time zone,
    event_type text,
    child_job_id text,
    retry_base integer DEFAULT 0 NOT NULL,
    CONSTRAINT onceflow_steps_child_check CHECK (((kind = 'child'::text) = (child_job_id IS NOT NULL))),
    CONSTRAINT onceflow_steps_event_type_check CHECK (((kind = 'event'::text) = (event_type IS NOT NULL))),
    CONSTRAINT onceflow_steps_finished_check CHECK (((status = ANY (ARRAY['running'::text, 'sleeping'::text, 'waiting'::text])) = (finished_at IS NULL))),
    CONSTRAINT onceflow_steps_kind_check CHECK ((kind = ANY (ARRAY['child'::text, 'event'::text, 'patch'::text, 'sleep'::text, 'step'::text, 'attributes'::text]))),
    CONSTRAINT onceflow_steps_status_check CHECK ((status = ANY (ARRAY['running'::text, 'sleeping'::text, 'waiting'::text, 'complete'::text, 'failed'::text])))
);

CREATE TABLE public.onceflow_stream_values (
    job_id text NOT NULL,
    seq bigint NOT NULL,
    stream text NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_stream_values_key_length CHECK (((char_length(key) >= 1) AND (char_length(key) <= 300))),
    CONSTRAINT onceflow_stream_values_stream_check CHECK ((stream ~ '^[A-Za-z0-9_.:-]{1,200}$'::text))
);

COMMENT ON TABLE public.onceflow_stream_values IS 'Values appended to an instance''s output streams, in seq order (served over SSE).';

CREATE TABLE public.onceflow_streams (
    job_id text NOT NULL,
    last_seq bigint NOT NULL,
    value_count integer NOT NULL,
    value_bytes bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT onceflow_streams_counts_check CHECK (((last_seq >= value_count) AND (value_count >= 0) AND (value_bytes >= 0)))
);

COMMENT ON TABLE public.onceflow_streams IS 'Per instance: the last stream-value seq given out, and the values and bytes held.';

CREATE TABLE public.onceflow_task_runs (
    job_id text NOT NULL,
    task text NOT NULL,
    params jsonb NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    result jsonb,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT onceflow_task_runs_finished_check CHECK (((status = 'pending'::text) = (finished_at IS NULL))),
    CONSTRAINT onceflow_task_runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'succeeded'::text, 'dead_lettered'::text])))
);

CREATE TABLE public.onceflow_webhook_attempts (
    delivery_id bigint NOT NULL,
    attempt integer NOT NULL,
    claim_count integer NOT NULL,
    owner text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    latency_ms double precision,
    response_code integer,
    error text,
    outcome text,
    CONSTRAINT onceflow_webhook_attempts_error_length CHECK ((char_length(error) <= 1000)),
    CONSTRAINT onceflow_webhook_attempts_outcome_check CHECK ((outcome = ANY (ARRAY['delivered'::text, 'failed'::text, 'refused'::text, 'lost'::text]))),
    CONSTRAINT onceflow_webhook_attempts_owner_length CHECK ((char_length(owner) <= 200))
);

COMMENT ON TABLE public.onceflow_webhook_attempts IS 'Each attempt to send a webhook delivery: when, how long, the response code or error.';

CREATE TABLE public.onceflow_webhook_deliveries (
    id bigint NOT NULL,
    event_id text NOT NULL,
    endpoint text NOT NULL,
    job_id text NOT NULL,
    workflow text NOT NULL,
    kind text NOT NULL,
    sequence integer NOT NULL,
    body text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    give_up_at timestamp with time zone NOT NULL,
    claim_count integer DEFAULT 0 NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    last_code integer,
    last_error text,
    dead_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT onceflow_webhook_deliveries_dead_check CHECK (((status = 'dead'::text) = (dead_reason IS NOT NULL))),
    CONSTRAINT onceflow_webhook_deliveries_dead_reason_check CHECK ((dead_reason = ANY (ARRAY['retries_exhausted'::text, 'refused_address'::text, 'unknown_endpoint'::text]))),
    CONSTRAINT onceflow_webhook_deliveries_endpoint_length CHECK ((char_length(endpoint) <= 64)),
    CONSTRAINT onceflow_webhook_deliveries_event_id_length CHECK ((char_length(event_id) <= 220)),
    CONSTRAINT onceflow_webhook_deliveries_kind_length CHECK ((char_length(kind) <= 64)),
    CONSTRAINT onceflow_webhook_deliveries_last_error_length CHECK ((char_length(last_error) <= 1000)),
    CONSTRAINT onceflow_webhook_deliveries_lease_check CHECK (((status = 'sending'::text) = (lease_expires_at IS NOT NULL))),
    CONSTRAINT onceflow_webhook_deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'sending'::text, 'delivered'::text, 'dead'::text])))
);

COMMENT ON TABLE public.onceflow_webhook_deliveries IS 'Webhook deliveries: one per (lifecycle event, subscribed endpoint), retried until delivered or dead.';

ALTER TABLE public.onceflow_webhook_deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.onceflow_webhook_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries ATTACH PARTITION public.onceflow_duplicate_deliveries_default DEFAULT;

ALTER TABLE ONLY public.onceflow_step_attempts ATTACH PARTITION public.onceflow_step_attempts_default DEFAULT;

ALTER TABLE ONLY public.onceflow_outbox ALTER COLUMN "position" SET DEFAULT nextval('public.onceflow_outbox_position_seq'::regclass);

ALTER TABLE ONLY public.onceflow_bulk_operation_items
    ADD CONSTRAINT onceflow_bulk_operation_items_pkey PRIMARY KEY (operation_id, job_id);

ALTER TABLE ONLY public.onceflow_bulk_operations
    ADD CONSTRAINT onceflow_bulk_operations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_dead_letters
    ADD CONSTRAINT onceflow_dead_letters_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_dead_letters
    ADD CONSTRAINT onceflow_dead_letters_source_key UNIQUE (source_topic, source_partition, source_offset);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries
    ADD CONSTRAINT onceflow_duplicate_deliveries_pkey PRIMARY KEY (id, job_received_at);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries_default
    ADD CONSTRAINT onceflow_duplicate_deliveries_default_pkey PRIMARY KEY (id, job_received_at);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries
    ADD CONSTRAINT onceflow_duplicate_deliveries_position_key UNIQUE (source_topic, source_partition, source_offset, job_received_at);

ALTER TABLE ONLY public.onceflow_duplicate_deliveries_default
    ADD CONSTRAINT onceflow_duplicate_deliveries_source_topic_source_partition_key UNIQUE (source_topic, source_partition, source_offset, job_received_at);

ALTER TABLE ONLY public.onceflow_engines
    ADD CONSTRAINT onceflow_engines_pkey PRIMARY KEY (engine_id);

ALTER TABLE ONLY public.onceflow_events
    ADD CONSTRAINT onceflow_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_flow_controls
    ADD CONSTRAINT onceflow_flow_controls_pkey PRIMARY KEY (workflow);

ALTER TABLE ONLY public.onceflow_instances
    ADD CONSTRAINT onceflow_instances_job_id_key PRIMARY KEY (job_id);

ALTER TABLE ONLY public.onceflow_jobs
    ADD CONSTRAINT onceflow_jobs_job_id_key PRIMARY KEY (job_id);

ALTER TABLE ONLY public.onceflow_migrations
    ADD CONSTRAINT onceflow_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.onceflow_operator_actions
    ADD CONSTRAINT onceflow_operator_actions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.onceflow_outbox
    ADD CONSTRAINT onceflow_outbox_pkey PRIMARY KEY ("position");

ALTER TABLE ONLY public.onceflow_runs
    ADD CONSTRAINT onceflow_runs_pkey PRIMARY KEY (job_id, run);

ALTER TABLE ONLY public.onceflow_runs
    ADD CONSTRAINT onceflow_runs_position_key UNIQUE (source_topic, source_partition, source_offset);

ALTER TABLE ONLY public.onceflow_schedule_ticks
    ADD CONSTRAINT onceflow_schedule_ticks_job_key UNIQUE (job_id);

ALTER TABLE ONLY public.onceflow_schedule_ticks
    ADD CONSTRAINT onceflow_schedule_ticks_pkey PRIMARY KEY (schedule, tick_at);

ALTER TABLE ONLY public.onceflow_schedules
    ADD CONSTRAINT onceflow_schedules_pkey PRIMARY KEY (name);

ALTER TABLE ONLY public.onceflow_step_attempts
    ADD CONSTRAINT onceflow_step_attempts_pkey PRIMARY KEY (job_id, "position", attempt, started_at);

ALTER TABLE ONLY public.onceflow_step_attempts_default
    ADD CONSTRAINT onceflow_step_attempts_default_pkey PRIMARY KEY (job_id, "position", attempt, started_at);

ALTER TABLE ONLY public.onceflow_steps
    ADD CONSTRAINT onceflow_steps_name_key UNIQUE (job_id, name);

ALTER TABLE ONLY public.onceflow_steps
    ADD CONSTRAINT onceflow_steps_pkey PRIMARY KEY (job_id, "position");

ALTER TABLE ONLY public.onceflow_stream_values
    ADD CONSTRAINT onceflow_stream_values_key_key UNIQUE (job_id, key);

ALTER TABLE ONLY public.onceflow_stream_values
    ADD CONSTRAINT onceflow_stream_values_pkey PRIMARY KEY (job_id, seq);

ALTER TABLE ONLY public.onceflow_streams
    ADD CONSTRAINT onceflow_streams_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY public.onceflow_task_runs
    ADD CONSTRAINT onceflow_task_runs_job_id_key PRIMARY KEY (job_id);

ALTER TABLE ONLY public.onceflow_webhook_attempts
    ADD CONSTRAINT onceflow_webhook_attempts_pkey PRIMARY KEY (delivery_id, attempt);

ALTER TABLE ONLY public.onceflow_webhook_deliveries
    ADD CONSTRAINT onceflow_webhook_deliveries_event_endpoint_key UNIQUE (event_id, endpoint);

ALTER TABLE ONLY public.onceflow_webhook_deliveries
    ADD CONSTRAINT onceflow_webhook_deliveries_pkey PRIMARY KEY (id);

CREATE INDEX onceflow_dead_letters_job_idx ON public.onceflow_dead_letters USING btree (job_id);

CREATE INDEX onceflow_duplicate_deliveries_job_idx ON ONLY public.onceflow_duplicate_deliveries USING btree (job_id);

CREATE INDEX onceflow_duplicate_deliveries_default_job_id_idx ON public.onceflow_duplicate_deliveries_default USING btree (job_id);

CREATE INDEX onceflow_events_pending_idx ON public.onceflow_events USING btree (job_id, type, id) WHERE (consumed_at IS NULL);

CREATE INDEX onceflow_instances_attributes_idx ON public.onceflow_instances USING gin (attributes jsonb_path_ops);

CREATE INDEX onceflow_instances_batch_id_idx ON public.onceflow_instances USING btree (batch_id, batch_index) WHERE (batch_id IS NOT NULL);

CREATE INDEX onceflow_instances_batching_idx ON public.onceflow_instances USING btree (workflow, batch_key, run_after, job_id) WHERE (status = 'batching'::text);

CREATE INDEX onceflow_instances_claim_order_idx ON public.onceflow_instances USING btree (public.onceflow_claim_order(run_after, priority)) WHERE ((status = ANY (ARRAY['queued'::text, 'sleeping'::text, 'waiting'::text])) AND (flow_lane IS NULL));

CREATE INDEX onceflow_instances_created_idx ON public.onceflow_instances USING btree (created_at, job_id);

CREATE INDEX onceflow_instances_debounce_idx ON public.onceflow_instances USING btree (workflow, debounce_key, debounce_window_start) WHERE ((debounce_key IS NOT NULL) AND (status <> 'debounced'::text));

CREATE INDEX onceflow_instances_debounce_pending_idx ON public.onceflow_instances USING btree (workflow, debounce_key) WHERE ((debounce_key IS NOT NULL) AND (status = 'queued'::text));

CREATE INDEX onceflow_instances_duplicated_created_idx ON public.onceflow_instances USING btree (created_at, job_id) WHERE duplicated;

CREATE INDEX onceflow_instances_duplicated_updated_idx ON public.onceflow_instances USING btree (updated_at, job_id) WHERE duplicated;

CREATE INDEX onceflow_instances_finished_idx ON public.onceflow_instances USING btree (finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX onceflow_instances_forked_from_idx ON public.onceflow_instances USING btree (forked_from) WHERE (forked_from IS NOT NULL);

CREATE INDEX onceflow_instances_lane_idx ON public.onceflow_instances USING btree (workflow, flow_lane, public.onceflow_claim_order(run_after, priority)) WHERE (status = ANY (ARRAY['queued'::text, 'sleeping'::text, 'waiting'::text]));

CREATE INDEX onceflow_instances_leased_idx ON public.onceflow_instances USING btree (lease_expires_at) WHERE (status = 'running'::text);

CREATE INDEX onceflow_instances_parent_idx ON public.onceflow_instances USING btree (parent_job_id) WHERE (parent_job_id IS NOT NULL);

CREATE INDEX onceflow_instances_runnable_idx ON public.onceflow_instances USING btree (run_after) WHERE (status = ANY (ARRAY['queued'::text, 'sleeping'::text, 'waiting'::text]));

CREATE INDEX onceflow_instances_singleton_idx ON public.onceflow_instances USING btree (workflow, singleton_key, created_at) WHERE ((singleton_key IS NOT NULL) AND (status = ANY (ARRAY['queued'::text, 'running'::text, 'sleeping'::text, 'waiting'::text, 'paused'::text])));

CREATE INDEX onceflow_instances_start_by_idx ON public.onceflow_instances USING btree (start_by) WHERE ((start_by IS NOT NULL) AND (started_at IS NULL) AND (status = 'queued'::text));

CREATE INDEX onceflow_instances_updated_idx ON public.onceflow_instances USING btree (updated_at, job_id);

CREATE INDEX onceflow_instances_workflow_created_idx ON public.onceflow_instances USING btree (workflow, created_at, job_id);

CREATE INDEX onceflow_instances_workflow_status_idx ON public.onceflow_instances USING btree (workflow, status);

CREATE INDEX onceflow_operator_actions_actor_idx ON public.onceflow_operator_actions USING btree (actor, id);

CREATE INDEX onceflow_operator_actions_at_idx ON public.onceflow_operator_actions USING btree (at);

CREATE INDEX onceflow_operator_actions_job_idx ON public.onceflow_operator_actions USING btree (job_id, id) WHERE (job_id IS NOT NULL);

CREATE INDEX onceflow_rate_starts_idx ON public.onceflow_rate_starts USING btree (workflow, started_at);

CREATE INDEX onceflow_runs_finished_idx ON public.onceflow_runs USING btree (finished_at) WHERE (status IS NOT NULL);

CREATE INDEX onceflow_schedules_due_idx ON public.onceflow_schedules USING btree (next_fire_at) WHERE (NOT paused);

CREATE INDEX onceflow_webhook_deliveries_dead_idx ON public.onceflow_webhook_deliveries USING btree (endpoint, id) WHERE (status = 'dead'::text);

CREATE INDEX onceflow_webhook_deliveries_due_idx ON public.onceflow_webhook_deliveries USING btree (next_attempt_at) WHERE (status = 'pending'::text);

CREATE INDEX onceflow_webhook_deliveries_job_idx ON public.onceflow_webhook_deliveries USING btree (job_id, id);

CREATE INDEX onceflow_webhook_deliveries_lease_idx ON public.onceflow_webhook_deliveries USING btree (lease_expires_at) WHERE (status = 'sending'::text);

ALTER INDEX public.onceflow_duplicate_deliveries_job_idx ATTACH PARTITION public.onceflow_duplicate_deliveries_default_job_id_idx;

ALTER INDEX public.onceflow_duplicate_deliveries_pkey ATTACH PARTITION public.onceflow_duplicate_deliveries_default_pkey;

ALTER INDEX public.onceflow_duplicate_deliveries_position_key ATTACH PARTITION public.onceflow_duplicate_deliveries_source_topic_source_partition_key;

ALTER INDEX public.onceflow_step_attempts_pkey ATTACH PARTITION public.onceflow_step_attempts_default_pkey;

CREATE TRIGGER onceflow_instances_batch_outcome AFTER UPDATE OF status ON public.onceflow_instances FOR EACH ROW WHEN (((new.batch_size IS NOT NULL) AND (old.status IS DISTINCT FROM new.status) AND ((new.status = ANY (ARRAY['complete'::text, 'errored'::text, 'terminated'::text, 'skipped'::text])) <> (old.status = ANY (ARRAY['complete'::text, 'errored'::text, 'terminated'::text, 'skipped'::text]))))) EXECUTE FUNCTION public.onceflow_batch_outcome();

ALTER TABLE ONLY public.onceflow_bulk_operation_items
    ADD CONSTRAINT onceflow_bulk_operation_items_operation_fkey FOREIGN KEY (operation_id) REFERENCES public.onceflow_bulk_operations(id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_events
    ADD CONSTRAINT onceflow_events_instance_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_instances
    ADD CONSTRAINT onceflow_instances_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_jobs(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_runs
    ADD CONSTRAINT onceflow_runs_instance_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_schedule_ticks
    ADD CONSTRAINT onceflow_schedule_ticks_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_jobs(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_steps
    ADD CONSTRAINT onceflow_steps_instance_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_stream_values
    ADD CONSTRAINT onceflow_stream_values_job_id_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_streams(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_streams
    ADD CONSTRAINT onceflow_streams_job_id_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_task_runs
    ADD CONSTRAINT onceflow_task_runs_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_jobs(job_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_webhook_attempts
    ADD CONSTRAINT onceflow_webhook_attempts_delivery_fkey FOREIGN KEY (delivery_id) REFERENCES public.onceflow_webhook_deliveries(id) ON DELETE CASCADE;

ALTER TABLE ONLY public.onceflow_webhook_deliveries
    ADD CONSTRAINT onceflow_webhook_deliveries_job_fkey FOREIGN KEY (job_id) REFERENCES public.onceflow_instances(job_id) ON DELETE CASCADE;
