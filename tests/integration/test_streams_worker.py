"""The real streams worker (subprocess) on real Kafka and PostgreSQL."""

from __future__ import annotations

import signal
import time
import urllib.request

import orjson
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SOURCE,
    JobEnvelope,
)
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration.kafka_helpers import (
    committed_offsets,
    consume_all,
    produce,
    produce_envelopes,
)


def scalar(db, sql):
    with db.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


def wait_until(predicate, timeout, what, group=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if group is not None:
            group.check_alive()
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start_worker(group, name="streams", **env):
    port = free_port()
    group.start(name, "worker", env={"ONCEFLOW_STREAMS_METRICS_PORT": str(port), **env})
    group.wait_http(f"http://127.0.0.1:{port}/metrics", 60)
    return port


def test_worker_creates_one_instance_per_id_and_dead_letters_bad_records(settings, db, tmp_path):
    envs = [JobEnvelope(f"job_{i}", "order-workflow", {"i": i}) for i in range(30)]
    dupes = envs[:10]
    mismatch = JobEnvelope("job_0", "order-workflow", {"i": "different"})
    produce_envelopes(
        settings.kafka_bootstrap_servers, settings.jobs_topic, envs + dupes + [mismatch]
    )
    produce(
        settings.kafka_bootstrap_servers,
        settings.jobs_topic,
        [
            (b"junk", b"this is not json", []),
            (b"job_x", orjson.dumps({"v": 1, "job_id": "job_x", "params": {}}), []),
        ],
    )
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        port = start_worker(group)
        wait_until(
            lambda: (
                scalar(
                    db,
                    "SELECT (SELECT count(*) FROM onceflow_instances) +"
                    " (SELECT count(*) FROM onceflow_duplicate_deliveries)",
                )
                >= 41
            ),
            60,
            "41 deliveries",
            group,
        )
        dead = consume_all(settings.kafka_bootstrap_servers, settings.dlq_topic, 2)
        consumed = _records_consumed(port, settings.jobs_topic)
        # Clean shutdown: SIGTERM commits what was written, exits 0.
        assert group.stop("streams", signal.SIGTERM) == 0

    assert scalar(db, "SELECT count(*) FROM onceflow_instances") == 30
    assert scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries") == 11
    assert (
        scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries WHERE NOT params_match") == 1
    )
    assert scalar(db, "SELECT params->>'i' FROM onceflow_instances WHERE job_id = 'job_0'") == "0"

    reasons = sorted(
        (dict(m.headers())[HEADER_DLQ_REASON], dict(m.headers())[HEADER_DLQ_DETAIL]) for m in dead
    )
    assert len(reasons) == 2
    assert reasons[0] == (b"missing_workflow", b"missing workflow")
    assert reasons[1][0] == b"not_json" and reasons[1][1].startswith(b"value is not JSON")
    assert all(
        dict(m.headers())[HEADER_DLQ_SOURCE].startswith(settings.jobs_topic.encode()) for m in dead
    )
    # Everything consumed was committed: 43 records across the partitions.
    committed = committed_offsets(
        settings.kafka_bootstrap_servers,
        settings.consumer_group,
        settings.jobs_topic,
        settings.topic_partitions,
    )
    assert sum(max(o, 0) for o in committed.values()) == 43
    # ... and counted, per partition, by the worker's records-consumed counter.
    assert consumed == {p: o for p, o in committed.items() if o > 0}


def _records_consumed(port: int, topic: str) -> dict[int, int]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "onceflow_streams_records_consumed_total":
                assert sample.labels["topic"] == topic
                found[int(sample.labels["partition"])] = int(sample.value)
    return found


def test_sigkill_between_db_commit_and_offset_commit(settings, db, tmp_path):
    """The worker dies right after its first database commit, before any offset commit.

    On restart Kafka redelivers those records; they collapse (flagged as redeliveries)
    and nothing is lost or doubled.
    """
    n = 200
    envs = [JobEnvelope(f"job_{i:03d}", "order-workflow", {"i": i}) for i in range(n)]
    produce_envelopes(settings.kafka_bootstrap_servers, settings.jobs_topic, envs)
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        port = free_port()
        proc = group.start(
            "streams-doomed",
            "worker",
            env={
                "ONCEFLOW_STREAMS_METRICS_PORT": str(port),
                # a long commit interval: the kill certainly lands before any offset commit
                "ONCEFLOW_STREAMS_COMMIT_INTERVAL_SECONDS": "60",
            },
            failpoints="streams.after_db_commit=kill",
        )
        proc.wait(timeout=90)
        assert proc.returncode == -signal.SIGKILL
        group.procs.pop("streams-doomed")
        written_before_kill = scalar(db, "SELECT count(*) FROM onceflow_instances")
        assert written_before_kill > 0
        committed = committed_offsets(
            settings.kafka_bootstrap_servers,
            settings.consumer_group,
            settings.jobs_topic,
            settings.topic_partitions,
        )
        assert all(o < 0 for o in committed.values()), committed  # nothing committed

        start_worker(group)
        wait_until(
            lambda: (
                scalar(db, "SELECT count(*) FROM onceflow_instances") == n
                and scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries")
                >= written_before_kill
            ),
            60,
            "redelivery to finish",
            group,
        )
        time.sleep(1.0)
        group.stop("streams")

    assert scalar(db, "SELECT count(*) FROM onceflow_instances") == n
    assert scalar(db, "SELECT count(DISTINCT job_id) FROM onceflow_instances") == n
    # Exactly the records written before the kill came back, each once, as redeliveries.
    assert scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries") == written_before_kill
    assert (
        scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries WHERE redelivery")
        == written_before_kill
    )


def test_a_record_the_database_refuses_is_dead_lettered_and_the_rest_kept(settings, db, tmp_path):
    # Valid JSON that PostgreSQL's jsonb refuses: a NUL character in a string.
    poison = JobEnvelope("job_nul", "order-workflow", {"note": "a\u0000b"})
    good = [JobEnvelope(f"job_ok_{i}", "order-workflow", {"i": i}) for i in range(5)]
    produce_envelopes(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [*good[:2], poison, *good[2:]]
    )
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        dead = consume_all(settings.kafka_bootstrap_servers, settings.dlq_topic, 1)
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 5,
            30,
            "the good records",
            group,
        )
    assert len(dead) == 1
    assert dead[0].key() == b"job_nul"
    assert dict(dead[0].headers())[HEADER_DLQ_REASON] == b"database_refused"
    assert dict(dead[0].headers())[HEADER_DLQ_DETAIL].startswith(b"database rejected:")
    assert scalar(db, "SELECT count(*) FROM onceflow_jobs WHERE job_id = 'job_nul'") == 0
