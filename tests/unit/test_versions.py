"""Workflow versions: fingerprints, explicit versions, ctx.patched() and replay errors,
without PostgreSQL (a fake runtime stands in for the engine)."""

from __future__ import annotations

import asyncio
import importlib.util
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from onceflow.envelope import KafkaHeaders
from onceflow.vocabulary import StepKind, StepStatus
from streams.records import RawRecord, classify
from tests.unit.registries import registry_of
from workflow_engine.clock import FakeClock
from workflow_engine.definitions import REGISTRY, registered_versions, workflow
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.errors import NonDeterminismError
from workflow_engine.model import RecordedStep
from workflow_engine.store.writes import Chain, Lease, Started, StartStep, Write
from workflow_engine.versions import check_version, fingerprint

STEP_THREADS = ThreadPoolExecutor(4, thread_name_prefix="test-steps")
T = TypeVar("T")

BASE = """
import json

def charge(x):
    return x

async def order(ctx, params):
    receipt = await ctx.step("charge", charge, params["amount"])
    await ctx.step("ship", charge, receipt)
    return receipt
"""


def _load(tmp_path: Path, name: str, source: str) -> Any:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fp(tmp_path: Path, name: str, source: str) -> str:
    return fingerprint(_load(tmp_path, name, source).order)


def test_fingerprint_is_stable_under_layout_comments_and_decorators(tmp_path):
    base = fp(tmp_path, "base", BASE)
    assert base.startswith("fp-") and len(base) == 19
    assert fp(tmp_path, "again", BASE) == base  # another process, another module name
    relaid = BASE.replace(
        'receipt = await ctx.step("charge", charge, params["amount"])',
        '# charge first\n    receipt = await ctx.step(\n        "charge", charge,'
        ' params["amount"]  # the amount\n    )\n\n',
    )
    assert fp(tmp_path, "relaid", relaid) == base
    decorated = BASE.replace("async def order", "@staticmethod\nasync def order")
    assert fp(tmp_path, "decorated", decorated) == base
    # A step body outside the workflow function is not covered (documented).
    assert fp(tmp_path, "step_body", BASE.replace("return x", "return x * 2")) == base


def test_fingerprint_changes_with_the_workflow_code(tmp_path):
    base = fp(tmp_path, "base2", BASE)
    assert fp(tmp_path, "renamed", BASE.replace('"ship"', '"dispatch"')) != base
    assert (
        fp(
            tmp_path,
            "added",
            BASE.replace("return receipt", "await ctx.sleep('n', 1)\n    return receipt"),
        )
        != base
    )


def test_explicit_and_fingerprinted_versions_are_registered():
    @workflow("test-versions-explicit", version="2026-11-30")
    async def explicit(ctx, params):
        return None

    @workflow("test-versions-fingerprint")
    async def fingerprinted(ctx, params):
        return None

    assert REGISTRY.version("test-versions-explicit") == "2026-11-30"
    assert REGISTRY.version("test-versions-fingerprint") == fingerprint(fingerprinted)
    assert registered_versions()["test-versions-explicit"] == "2026-11-30"
    assert REGISTRY.version("no-such-workflow") is None
    with pytest.raises(ValueError, match="printable"):
        check_version("")
    with pytest.raises(ValueError, match="printable"):
        check_version("a\nb")


def test_the_worker_records_its_definition_version():
    rec = RawRecord(
        "jobs", 0, 1, b"j1", b'{"job_id": "j1", "workflow": "w", "params": {}}', KafkaHeaders()
    )
    deliveries, dead = classify([rec], 1 << 20, registry_of({"w": "v7"}))
    assert not dead and deliveries[0].version == "v7"
    tasks, _ = classify([rec], 1 << 20, registry_of(tasks=["w"]))
    assert tasks[0].version is None


class MarkerRuntime:
    """A runtime that records patch markers instead of writing them to PostgreSQL."""

    owner = "test-engine"
    max_result_bytes = 1000
    step_executor = STEP_THREADS  # sync steps' threads, shared by the test runs
    default_retry = None

    def __init__(self) -> None:
        self.clock = FakeClock(datetime(2025, 1, 1).astimezone())
        self.markers: list[tuple[int, str]] = []
        self.started: list[tuple[int, str]] = []

    async def write(self, write: Write[T]) -> T:
        if isinstance(write, Chain):  # a checkpoint and the write after it
            await self.write(write.first)
            return await self.write(write.then)
        if isinstance(write, StartStep):
            self.started.append((write.position, write.name))
            return cast(T, Started(1, datetime(2025, 1, 1, tzinfo=UTC), 1))
        return cast(T, None)

    async def call_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        assert fn.__name__ == "record_marker", fn.__name__
        _owner, _job, position, name = args
        self.markers.append((position, name))
        return cast(T, None)


def _ctx(rt: MarkerRuntime, history: list[RecordedStep]) -> WorkflowContext:
    return WorkflowContext(
        rt, Lease("test-engine", 1), "job-1", "orders", history, version="v1", engine_version="v1"
    )


def done(position: int, name: str, kind: StepKind = StepKind.STEP) -> RecordedStep:
    return RecordedStep(position, name, StepStatus.COMPLETE, 1, f"r-{name}", kind)


async def patched_flow(ctx: WorkflowContext) -> list[Any]:
    out = [await ctx.step("a", lambda: "a")]
    if await ctx.patched("fix-refund"):
        out.append(await ctx.step("refund-v2", lambda: "new"))
    else:
        out.append(await ctx.step("refund", lambda: "old"))
    assert await ctx.patched("fix-refund") == (out[1] in ("new", "r-refund-v2"))  # remembered
    return out


def test_patched_on_first_execution_records_a_marker_and_is_true():
    rt = MarkerRuntime()
    assert asyncio.run(patched_flow(_ctx(rt, []))) == ["a", "new"]
    assert rt.markers == [(1, "fix-refund")]
    assert rt.started == [(0, "a"), (2, "refund-v2")]


def test_patched_replays_true_where_the_marker_is_recorded():
    rt = MarkerRuntime()
    history = [done(0, "a"), done(1, "fix-refund", StepKind.PATCH), done(2, "refund-v2")]
    assert asyncio.run(patched_flow(_ctx(rt, history))) == ["r-a", "r-refund-v2"]
    assert rt.markers == [] and rt.started == []


def test_an_old_instance_without_the_marker_takes_the_old_path():
    rt = MarkerRuntime()
    history = [done(0, "a"), RecordedStep(1, "refund", StepStatus.RUNNING, 1, None)]
    assert asyncio.run(patched_flow(_ctx(rt, history))) == ["r-a", "old"]
    assert rt.markers == [] and rt.started == [(1, "refund")]


def test_deprecate_patch_consumes_a_marker_or_nothing():
    async def flow(ctx: WorkflowContext) -> list[Any]:
        await ctx.step("a", lambda: "a")
        await ctx.deprecate_patch("fix-refund")
        return [await ctx.step("refund-v2", lambda: "new")]

    with_marker = [done(0, "a"), done(1, "fix-refund", StepKind.PATCH), done(2, "refund-v2")]
    assert asyncio.run(flow(_ctx(MarkerRuntime(), with_marker))) == ["r-refund-v2"]
    rt = MarkerRuntime()
    assert asyncio.run(flow(_ctx(rt, []))) == ["new"]
    assert rt.markers == [] and rt.started == [(0, "a"), (1, "refund-v2")]


def test_a_replay_mismatch_names_the_step_the_position_and_both_versions():
    rt = MarkerRuntime()
    ctx = WorkflowContext(
        rt,
        Lease("test-engine", 1),
        "job-1",
        "orders",
        [done(0, "a"), done(1, "ship")],
        version="v1",
        engine_version="v1-fixed",
    )

    async def flow() -> None:
        await ctx.step("a", lambda: "a")
        await ctx.step("dispatch", lambda: "b")

    with pytest.raises(NonDeterminismError) as err:
        asyncio.run(flow())
    message = str(err.value)
    for part in ("'dispatch'", "position 1", "'ship'", "version v1,", "version v1-fixed"):
        assert part in message, message
    assert rt.started == []  # nothing ran again
