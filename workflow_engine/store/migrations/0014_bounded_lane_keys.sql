-- onceflow schema, version 14: the fairness lane an instance stores (and
-- onceflow_instances_lane_idx indexes) is a bounded form of its key's value.
--
-- A B-tree entry holds at most ~2.7 kB. The lane is the value of a user-supplied
-- params path (fairness_key, else concurrency_key, else the rate limit's key), so a
-- job whose key was 20,000 random characters failed its insert with SQLSTATE 54000
-- ("index row requires 20016 bytes") - every time it was redelivered, and the streams
-- worker retried it forever, wedging its partitions (issue 23).
--
-- Now every writer of flow_lane (the streams worker's create, a parent starting a
-- child) takes it from onceflow_flow_lane(): a value of at most 200 bytes is stored as
-- it is (lanes stay readable, and ordered as before); a longer one as 'md5:' and its
-- md5, 36 characters. The lane only groups instances for the fair round-robin and the
-- per-key lookahead; every limit's key is computed from params in the claim itself, so
-- two long values that shared a hash would only share a lane, never a limit.
-- The index and the claim statements are unchanged: they read flow_lane as before.

-- The lane stored for a key's value (NULL stays NULL: no key read).
CREATE FUNCTION onceflow_lane_key(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN octet_length(value) <= 200 THEN value ELSE 'md5:' || md5(value) END $$;

-- The lane of a new instance with ``params``, for its workflow's lane path: NULL without
-- flow control (the plain claim takes it), '' with flow control but no key (or a missing
-- key), else the bounded form of the key's value.
CREATE FUNCTION onceflow_flow_lane(params jsonb, lane_path text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN lane_path IS NULL THEN NULL
                  WHEN cardinality(lane_path) = 0 THEN ''
                  ELSE onceflow_lane_key(coalesce(params #>> lane_path, '')) END $$;
