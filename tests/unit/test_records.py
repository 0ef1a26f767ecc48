import asyncio
import hashlib

import pytest

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_ORIGINAL_SIZE,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SHA256,
    HEADER_DLQ_SOURCE,
    HEADER_DLQ_TRUNCATED,
    JobEnvelope,
)
from onceflow.vocabulary import DeadLetterReason
from streams.dead_letters import dlq_message
from streams.records import DeadLetter, RawRecord, classify, split_by_partition
from tests.unit.registries import registry_of


def _rec(partition, offset, env=None, value=None):
    if env is not None:
        return RawRecord("t", partition, offset, env.key(), env.encode(), env.headers())
    return RawRecord("t", partition, offset, b"k", value, [])


def test_classify_keeps_order_and_dead_letters_with_reason_codes():
    a = JobEnvelope("a", "w", {})
    b = JobEnvelope("b", "w", {})
    records = [
        _rec(0, 1, a),
        _rec(0, 2, value=b"garbage"),
        _rec(1, 1, b),
        _rec(0, 3, a),
        _rec(1, 2, value=b"x" * 500),
    ]
    deliveries, dead = classify(records, 400, registry_of({"w": "v1"}))
    assert [(d.envelope.job_id, d.offset) for d in deliveries] == [("a", 1), ("b", 1), ("a", 3)]
    assert [letter.record.offset for letter in dead] == [2, 2]
    assert dead[0].reason == DeadLetterReason.NOT_JSON
    assert "not JSON" in dead[0].detail
    assert dead[1].reason == DeadLetterReason.TOO_LARGE
    assert "the limit is 400" in dead[1].detail
    headers = dict(dlq_message(dead[0], 10_000).headers)
    assert headers[HEADER_DLQ_SOURCE] == b"t/0@2"
    assert headers[HEADER_DLQ_REASON] == b"not_json"
    assert b"not JSON" in headers[HEADER_DLQ_DETAIL]


def test_an_unknown_type_is_a_code_too():
    env = JobEnvelope("a", "nobody-registers-this", {})
    _, dead = classify([_rec(0, 1, env)], 10_000, registry_of())
    assert (dead[0].reason, dead[0].job_id) == (DeadLetterReason.UNKNOWN_TYPE, "a")


def _letter(value, key=b"job_big", headers=None):
    record = RawRecord("jobs", 3, 17, key, value, headers or [("x-producer", b"java")])
    return DeadLetter.of(record, DeadLetterReason.TOO_LARGE, "too big")


def test_a_letter_that_fits_is_copied_whole():
    msg = dlq_message(_letter(b"v" * 1000), budget=4096)
    headers = dict(msg.headers)
    assert (msg.value, msg.key, msg.truncated) == (b"v" * 1000, b"job_big", False)
    assert headers["x-producer"] == b"java"  # the original headers travel along
    assert headers[HEADER_DLQ_TRUNCATED] == b"false"
    assert headers[HEADER_DLQ_ORIGINAL_SIZE] == b"1000"
    assert headers[HEADER_DLQ_SHA256] == hashlib.sha256(b"v" * 1000).hexdigest().encode()


def test_a_letter_too_big_keeps_a_bounded_prefix_with_size_and_digest():
    value = bytes(range(256)) * 40_000  # ~10 MB
    msg = dlq_message(_letter(value), budget=100_000)
    headers = dict(msg.headers)
    total = (
        len(msg.key or b"")
        + len(msg.value or b"")
        + sum(len(k) + len(v) for k, v in headers.items())
    )
    assert total <= 100_000
    assert msg.truncated and value.startswith(msg.value) and len(msg.value) > 90_000
    assert headers[HEADER_DLQ_TRUNCATED] == b"true"
    assert headers[HEADER_DLQ_ORIGINAL_SIZE] == str(len(value)).encode()
    assert headers[HEADER_DLQ_SHA256] == hashlib.sha256(value).hexdigest().encode()
    assert headers[HEADER_DLQ_SOURCE] == b"jobs/3@17"


def test_at_the_smallest_budget_the_original_headers_and_key_go():
    big_headers = [("h", b"x" * 5000)]
    msg = dlq_message(_letter(b"v" * 5000, key=b"k" * 5000, headers=big_headers), budget=1024)
    headers = dict(msg.headers)
    assert "h" not in headers and len(msg.key or b"") <= 256
    assert headers[HEADER_DLQ_REASON] == b"too_large" and msg.truncated


def test_split_keeps_partitions_whole_and_bounded():
    records = [_rec(p, o, JobEnvelope(f"j{p}{o}", "w", {})) for p in range(5) for o in range(3)]
    deliveries, _ = classify(records, 10_000, registry_of({"w": "v1"}))
    chunks = split_by_partition(deliveries, groups=2)
    assert len(chunks) == 2
    for chunk in chunks:
        parts = {d.partition for d in chunk}
        for p in parts:
            offsets = [d.offset for d in chunk if d.partition == p]
            assert offsets == [0, 1, 2]  # whole partition, in order
    assert sum(len(c) for c in chunks) == 15
    assert sorted(p for c in chunks for p in {d.partition for d in c}) == [0, 1, 2, 3, 4]


def test_split_with_more_groups_than_partitions():
    records = [_rec(0, o, JobEnvelope(f"j{o}", "w", {})) for o in range(4)]
    deliveries, _ = classify(records, 10_000, registry_of({"w": "v1"}))
    assert len(split_by_partition(deliveries, groups=8)) == 1
    assert split_by_partition([], groups=4) == []


# --- the worker is built from the settings it is given ------------------------------


def test_register_builds_the_agent_from_the_given_settings(tmp_path):
    from onceflow.settings import Settings
    from streams.agents import AGENT_NAME, register
    from streams.app import create_app

    settings = Settings(
        state_dir=tmp_path,
        consumer_group="group-from-settings",
        jobs_topic="topic-from-settings",
        streams_concurrency=7,
    )
    app = create_app(settings)
    agent = register(app, settings)
    assert app.conf.id == "group-from-settings"
    assert app.agents[AGENT_NAME] is agent
    assert agent.concurrency == 1  # faust-streaming #606: concurrency lives in the batch
    assert agent.channel.get_topic_name() == "topic-from-settings"
    assert agent.fun.__self__.settings is settings


def test_worker_command_passes_its_flag_as_settings_not_environment(monkeypatch):
    import os

    from click.testing import CliRunner

    import streams.worker
    from onceflow_cli.main import cli

    got = []
    monkeypatch.setattr(streams.worker, "run_worker", got.append)
    result = CliRunner().invoke(cli, ["worker", "--concurrency", "7"])
    assert result.exit_code == 0, result.output
    assert got[0].streams_concurrency == 7
    assert "ONCEFLOW_STREAMS_CONCURRENCY" not in os.environ


class _Handler:
    def __init__(self, outcome):
        self.outcome = outcome
        self.finished = False

    async def handle(self, records):
        await asyncio.sleep(0.05)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        self.finished = True


def _creator(grace=5.0):
    from onceflow.settings import Settings
    from streams.agents import InstanceCreator

    return InstanceCreator(Settings(streams_shutdown_grace_seconds=grace))


class _Exited(Exception):
    pass


def _exits(monkeypatch):
    """Record os._exit calls instead of dying (and keep pytest's log handlers open)."""
    import streams.agents

    codes = []

    def fake_exit(code):
        codes.append(code)
        raise _Exited(code)

    monkeypatch.setattr(streams.agents.os, "_exit", fake_exit)
    monkeypatch.setattr(streams.agents.logging, "shutdown", lambda: None)
    return codes


def test_a_cancelled_batch_finishes_before_the_cancellation_goes_on(monkeypatch):
    codes = _exits(monkeypatch)
    handler = _Handler(None)

    async def scenario():
        task = asyncio.ensure_future(_creator()._handle(handler, []))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert handler.finished and codes == []


def test_a_batch_over_the_grace_period_exits_without_committing(monkeypatch):
    codes = _exits(monkeypatch)

    async def scenario():
        task = asyncio.ensure_future(_creator(grace=0.001)._handle(_Handler(None), []))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(_Exited):
            await task

    asyncio.run(scenario())
    assert codes == [70]


def test_a_failing_handler_exits_rather_than_let_faust_ack(monkeypatch):
    codes = _exits(monkeypatch)
    with pytest.raises(_Exited):
        asyncio.run(_creator()._handle(_Handler(RuntimeError("bug")), []))
    assert codes == [70]


# --- the dead-letter writer: shrink on size refusals, wait out broker errors -----------


class _Delivered:
    def __init__(self, offset):
        self._offset = offset

    def partition(self):
        return 0

    def offset(self):
        return self._offset


class _FakeDlq:
    """Refuses values over ``max_value`` (as the broker would) and fails ``transient``
    deliveries first."""

    def __init__(self, max_value, transient=0):
        from confluent_kafka import KafkaError

        self.KafkaError = KafkaError
        self.max_value, self.transient = max_value, transient
        self.queued, self.sent = [], []

    def produce(self, topic, key, value, headers, on_delivery):
        self.queued.append((value, on_delivery))

    def poll(self, timeout):
        return 0

    def flush(self, timeout=None):
        for value, on_delivery in self.queued:
            if self.transient:
                self.transient -= 1
                on_delivery(self.KafkaError(self.KafkaError._TRANSPORT), None)
            elif len(value or b"") > self.max_value:
                on_delivery(self.KafkaError(self.KafkaError.MSG_SIZE_TOO_LARGE), None)
            else:
                self.sent.append(value)
                on_delivery(None, _Delivered(len(self.sent) - 1))
        self.queued = []
        return 0


def _writer(monkeypatch, dlq):
    import streams.dead_letters as module
    from onceflow.settings import Settings

    slept, recorded = [], []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    writer = module.DeadLetterWriter(
        Settings(kafka_max_message_bytes=1024 * 1024),
        db=None,
        make_producer=lambda: dlq,
        with_db_retry=lambda fn, db, rows: recorded.extend(rows),
    )
    return writer, slept, recorded


def test_a_letter_the_broker_refuses_for_size_is_retried_smaller_at_once(monkeypatch):
    dlq = _FakeDlq(max_value=100_000)
    writer, slept, recorded = _writer(monkeypatch, dlq)
    value = b"z" * 3_000_000
    writer.write([_letter(value)])
    assert len(dlq.sent) == 1 and value.startswith(dlq.sent[0]) and len(dlq.sent[0]) <= 100_000
    assert slept == []  # a size refusal is not a reason to wait
    assert [(r.truncated, r.original_size, r.reason) for r in recorded] == [
        (True, 3_000_000, DeadLetterReason.TOO_LARGE)
    ]


def test_broker_errors_block_with_backoff_and_never_skip(monkeypatch):
    dlq = _FakeDlq(max_value=10**9, transient=4)
    writer, slept, recorded = _writer(monkeypatch, dlq)
    writer.write([_letter(b"small")])
    assert dlq.sent == [b"small"]
    assert slept == [0.2, 0.4, 0.8, 1.6]
    assert [(r.truncated, r.dlq_offset) for r in recorded] == [(False, 0)]
