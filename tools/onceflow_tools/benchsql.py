"""The benchmarks' own SQL: data seeded straight into the product tables, and the
statistics a benchmark reads of them.

The product never seeds: its rows come through the pipeline (Kafka, the worker, the
engine) and every statement of the runtime lives in :mod:`workflow_engine.store`. A
benchmark that measures a table at a million or a hundred million rows cannot wait for
the pipeline to write them, so it writes them here, in ``INSERT … SELECT
generate_series`` statements, into a scratch database only. Never for a real database.

- :func:`seed_for_bench`: the instances that ``onceflow bench console-list`` pages;
- the history functions: the 30 days of finished instances that
  :mod:`onceflow_tools.history_bench` measures before and after partitioning, and the
  table statistics it reads.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import TERMINAL_STATUSES, InstanceStatus


def seed_for_bench(
    db: Engine, n: int, workflow_count: int = 4, prefix: str = "bench_", tenants: int = 0
) -> int:
    """Insert ``n`` instances (and their job rows) in two statements with
    ``generate_series``, spread over the last 30 days and over every status, then
    ANALYZE: the data of ``onceflow bench console-list``. Never for a real database.
    ``tenants``: when set, each instance has searchable attributes ``{"tenant":
    "t<g % tenants>", "tier": gold|silver|bronze}`` (g: its number)."""
    statuses = [str(s) for s in InstanceStatus if s != InstanceStatus.RUNNING]
    params = {
        "n": n,
        "w": workflow_count,
        "p": prefix,
        "st": statuses,
        "final": sorted(TERMINAL_STATUSES),
        "tenants": tenants,
    }
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_jobs (job_id, type_name, params_digest, source_topic,"
                " source_partition, source_offset)"
                " SELECT :p || lpad(g::text, 10, '0'), 'bench-wf-' || (g % :w), 'x',"
                " 'bench', 0, g FROM generate_series(1, :n) g"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_instances (job_id, workflow, params, status, created_at,"
                " updated_at, finished_at, error, attributes, skipped_for, debounced_into,"
                " batch_key, batch_id, batch_index)"
                " SELECT job_id, type_name, '{}'::jsonb, st, at, at + interval '1 second',"
                " CASE WHEN st = ANY(CAST(:final AS text[]))"
                "      THEN at + interval '1 second' END,"
                f" CASE WHEN st = '{InstanceStatus.ERRORED}'"
                "      THEN 'boom ' || (source_offset % 97) END,"
                " CASE WHEN :tenants > 0 THEN jsonb_build_object("
                "   'tenant', 't' || (source_offset % greatest(:tenants, 1)),"
                "   'tier', (ARRAY['gold', 'silver', 'bronze'])[1 + source_offset % 3])"
                "   ELSE '{}'::jsonb END,"
                # a skipped instance names the live one it gave way to (migration 0024)
                f" CASE WHEN st = '{InstanceStatus.SKIPPED}' THEN 'bench-live' END,"
                # a debounced one names the instance that absorbed it (migration 0025)
                f" CASE WHEN st = '{InstanceStatus.DEBOUNCED}' THEN 'bench-live' END,"
                # a batch member waits in its key's pool, or names its batch run (0026)
                f" CASE WHEN st IN ('{InstanceStatus.BATCHING}', '{InstanceStatus.BATCHED}')"
                "      THEN '' END,"
                f" CASE WHEN st = '{InstanceStatus.BATCHED}' THEN 'bench-live~batch' END,"
                f" CASE WHEN st = '{InstanceStatus.BATCHED}' THEN 0 END"
                " FROM (SELECT job_id, type_name, source_offset,"
                "   (:st)[1 + (source_offset % cardinality(CAST(:st AS text[])))] AS st,"
                "   now() - (source_offset * interval '30 days' / :n) AS at"
                "   FROM onceflow_jobs WHERE source_topic = 'bench' AND job_id LIKE :p || '%') s"
            ),
            params,
        )
        conn.execute(sa.text("ANALYZE onceflow_jobs"))
        conn.execute(sa.text("ANALYZE onceflow_instances"))
    return n


def add_rare_old_tenant(db: Engine, n: int = 5, tenant: str = "rare") -> None:
    """Give the ``n`` oldest instances the attributes ``{"tenant": tenant}`` and ANALYZE:
    the worst case of an attribute filter's page (few matches, all at the far end of
    the created-at index). Never for a real database."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET attributes = jsonb_build_object('tenant', :t)"
                " WHERE job_id IN (SELECT job_id FROM onceflow_instances"
                " ORDER BY created_at LIMIT :n)"
            ),
            {"t": tenant, "n": n},
        )
        conn.execute(sa.text("ANALYZE onceflow_instances"))


# ---- history at scale (onceflow_tools.history_bench) ----

#: The tables the history fills and measures.
HISTORY_TABLES = (
    "onceflow_jobs",
    "onceflow_instances",
    "onceflow_steps",
    "onceflow_step_attempts",
    "onceflow_duplicate_deliveries",
)
_DUPLICATES = "onceflow_duplicate_deliveries"


def add_later_columns(db: Engine) -> None:
    """At schema 0011: the duplicates' partition key (migration 0012's column, which
    today's store code reads; unindexed, filled like 0012 fills it)."""
    with db.begin() as conn:
        conn.execute(sa.text(f"ALTER TABLE {_DUPLICATES} ADD job_received_at timestamptz"))


def drop_later_columns(db: Engine) -> None:
    """Undo :func:`add_later_columns`, so that migration 0012 adds it."""
    with db.begin() as conn:
        conn.execute(sa.text(f"ALTER TABLE {_DUPLICATES} DROP COLUMN job_received_at"))


def fill_history(db: Engine, rows: int, start: datetime, queued: int) -> dict[str, int]:
    """The history, in five INSERT … SELECT generate_series statements (``rows``
    step-attempt rows, ``queued`` instances left to claim); the rows per table."""
    m = max(rows // 3, queued * 2)
    p = {"m": m, "q": queued, "start": start}
    # job g was received at ts(g): evenly from ``start`` (a UTC midnight) to now
    ts = "(CAST(:start AS timestamptz) + (now() - CAST(:start AS timestamptz)) * g / :m)"
    jid = "('h' || lpad(g::text, 10, '0'))"
    statements = [
        "INSERT INTO onceflow_jobs (job_id, type_name, params_digest, source_topic,"
        " source_partition, source_offset, received_at, last_seen_at, submitted_at)"
        f" SELECT {jid}, 'bench-wf-' || (g % 4), 'x', 'bench', g % 16, g, {ts}, {ts}, {ts}"
        " FROM generate_series(1, :m) g",
        "INSERT INTO onceflow_instances (job_id, workflow, params, status, created_at,"
        " updated_at, run_after, started_at, finished_at, result, error)"
        f" SELECT {jid}, 'bench-wf-' || (g % 4), '{{}}'::jsonb,"
        " CASE WHEN g > :m - :q THEN 'queued' WHEN g % 20 = 0 THEN 'errored' ELSE 'complete' END,"
        f" {ts}, {ts} + interval '3 s', {ts}, {ts} + interval '0.1 s',"
        f" CASE WHEN g > :m - :q THEN NULL ELSE {ts} + interval '3 s' END,"
        " CASE WHEN g > :m - :q OR g % 20 = 0 THEN NULL ELSE '{\"ok\": true}'::jsonb END,"
        " CASE WHEN g % 20 = 0 AND g <= :m - :q THEN 'boom' END"
        " FROM generate_series(1, :m) g",
        "INSERT INTO onceflow_steps (job_id, position, name, status, attempts, result,"
        " started_at, finished_at)"
        f" SELECT {jid}, s, 'step-' || s, 'complete', 1, '{{\"n\": 1}}'::jsonb,"
        f" {ts} + s * interval '1 s', {ts} + s * interval '1 s' + interval '0.5 s'"
        " FROM generate_series(1, :m - :q) g CROSS JOIN generate_series(0, 2) s",
        "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id,"
        " started_at, finished_at, outcome)"
        f" SELECT {jid}, s, 1, 'engine-' || (g % 4), {ts} + s * interval '1 s',"
        f" {ts} + s * interval '1 s' + interval '0.5 s', 'complete'"
        " FROM generate_series(1, :m - :q) g CROSS JOIN generate_series(0, 2) s",
        "INSERT INTO onceflow_duplicate_deliveries (job_id, source_topic, source_partition,"
        " source_offset, params_digest, params_match, redelivery, received_at, job_received_at)"
        f" SELECT {jid}, 'bench', g % 16, :m + g, 'x', true, false, {ts} + interval '1 s', {ts}"
        " FROM generate_series(3, :m, 3) g",
    ]
    for sql in statements:
        with db.begin() as conn:
            conn.execute(sa.text(sql), p)
    analyze(db)
    with db.connect() as conn:
        return {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in HISTORY_TABLES
        }


def analyze(db: Engine) -> None:
    """VACUUM ANALYZE, as autovacuum soon would: measuring while it still works through
    freshly written tables (or 0012's new partitions) times its cache invalidations."""
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in HISTORY_TABLES:
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")


def vacuum(db: Engine) -> None:
    """The VACUUM that a DELETE leaves owed."""
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM " + ", ".join(HISTORY_TABLES))


# The leaf tables of a table: its partitions, or itself when it is not partitioned.
_LEAVES = (
    "(SELECT relid FROM pg_partition_tree(CAST(:t AS regclass)) WHERE isleaf"
    " UNION SELECT CAST(:t AS regclass) WHERE"
    " (SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)) = 'r')"
)


def table_sizes(db: Engine) -> dict[str, dict[str, int]]:
    """Heap and index bytes per table, summed over the partitions of a partitioned one."""
    out = {}
    with db.connect() as conn:
        for table in HISTORY_TABLES:
            heap, index, leaves = conn.execute(
                sa.text(
                    "SELECT sum(pg_table_size(relid)), sum(pg_indexes_size(relid)),"
                    f" count(*) FROM {_LEAVES} l"
                ),
                {"t": table},
            ).one()
            out[table] = {"table_bytes": int(heap), "index_bytes": int(index), "leaves": leaves}
    return out


def vacuum_stats(db: Engine, settle: float = 0.0) -> dict[str, dict[str, Any]]:
    """``pg_stat_user_tables`` per table (partitions summed; the latest autovacuum)."""
    out = {}
    # An idle backend reports its counters at most 10 s after committing (PG 15
    # shared-memory statistics, PGSTAT_IDLE_INTERVAL): after a change, wait that out.
    time.sleep(settle)
    with db.connect() as conn:
        for table in HISTORY_TABLES:
            row = conn.execute(
                sa.text(
                    "SELECT sum(s.n_live_tup), sum(s.n_dead_tup), max(s.last_autovacuum),"
                    " sum(s.autovacuum_count)"
                    f" FROM {_LEAVES} p JOIN pg_stat_user_tables s ON s.relid = p.relid"
                ),
                {"t": table},
            ).one()
            out[table] = {
                "n_live_tup": int(row[0] or 0),
                "n_dead_tup": int(row[1] or 0),
                "last_autovacuum": row[2].isoformat() if row[2] else None,
                "autovacuum_count": int(row[3] or 0),
            }
    return out


def insert_attempts(db: Engine, attempt: int, after_job: int) -> None:
    """10,000 more step attempts (number ``attempt``) on position 0 of the jobs after
    job number ``after_job``: a burst of the engine's writes."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id)"
                " SELECT job_id, position, :a, 'bench' FROM onceflow_steps"
                " WHERE job_id > 'h' || lpad(CAST(:from AS text), 10, '0') AND position = 0"
                " ORDER BY job_id LIMIT 10000"
            ),
            {"a": attempt, "from": after_job},
        )


def delete_finished_instances(db: Engine, before: datetime) -> int:
    """Retention as onceflow ran it before 0012: DELETE the instances finished before
    ``before`` (cascading to their steps, and their attempts while not partitioned)."""
    with db.begin() as conn:
        return int(
            conn.execute(
                sa.text(
                    "DELETE FROM onceflow_instances WHERE status = ANY(:t) AND finished_at < :c"
                ),
                {"t": sorted(TERMINAL_STATUSES), "c": before},
            ).rowcount
        )


def count_attempts_before(db: Engine, cutoff: datetime) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM onceflow_step_attempts WHERE started_at < :c"),
                {"c": cutoff},
            ).scalar_one()
        )


def server_now(db: Engine) -> datetime:
    with db.connect() as conn:
        now: datetime = conn.execute(sa.text("SELECT now()")).scalar_one()
    return now
