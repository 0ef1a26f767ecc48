import asyncio

import pytest

from onceflow.core.envelope import HEADER_DLQ_REASON, HEADER_DLQ_SOURCE, JobEnvelope
from streams.batch import _parse_failpoint
from streams.records import RawRecord, classify, split_by_partition


def _rec(partition, offset, env=None, value=None):
    if env is not None:
        return RawRecord("t", partition, offset, env.key(), env.encode(), env.headers())
    return RawRecord("t", partition, offset, b"k", value, [])


def test_classify_keeps_order_and_dead_letters_with_reason():
    a = JobEnvelope("a", "w", {})
    b = JobEnvelope("b", "w", {})
    records = [
        _rec(0, 1, a),
        _rec(0, 2, value=b"garbage"),
        _rec(1, 1, b),
        _rec(0, 3, a),
        _rec(1, 2, value=b"x" * 500),
    ]
    deliveries, dead = classify(records, max_value_bytes=400)
    assert [(d.envelope.job_id, d.offset) for d in deliveries] == [("a", 1), ("b", 1), ("a", 3)]
    assert [letter.record.offset for letter in dead] == [2, 2]
    assert "not JSON" in dead[0].reason
    assert "limit 400" in dead[1].reason
    headers = dict(dead[0].headers())
    assert headers[HEADER_DLQ_SOURCE] == b"t/0@2"
    assert b"not JSON" in headers[HEADER_DLQ_REASON]


def test_split_keeps_partitions_whole_and_bounded():
    records = [_rec(p, o, JobEnvelope(f"j{p}{o}", "w", {})) for p in range(5) for o in range(3)]
    deliveries, _ = classify(records, 10_000)
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
    deliveries, _ = classify(records, 10_000)
    assert len(split_by_partition(deliveries, groups=8)) == 1
    assert split_by_partition([], groups=4) == []


def test_failpoint_parsing():
    assert _parse_failpoint("streams.after_db_commit:3", "streams.after_db_commit") == 3
    assert _parse_failpoint("other:1, streams.after_db_commit", "streams.after_db_commit") == 1
    assert _parse_failpoint("", "streams.after_db_commit") is None


# --- the worker is built from the settings it is given ------------------------------


def test_register_builds_the_agent_from_the_given_settings(tmp_path):
    from onceflow.core.settings import Settings
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
    from onceflow.cli.main import cli

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
    from onceflow.core.settings import Settings
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
