"""Tracing without a backend: settings, W3C context helpers, and the engine's spans
through ``WorkflowContext`` with an in-memory exporter (a replayed step emits none)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from onceflow import tracing
from onceflow.envelope import HEADER_TRACEPARENT
from onceflow.ids import new_traceparent
from onceflow.settings import Settings
from onceflow.vocabulary import StepKind, StepStatus
from tests.unit.test_replay import FakeRuntime, context, step
from workflow_engine.engine.job_spans import JobSpans
from workflow_engine.errors import Suspend
from workflow_engine.model import RecordedStep

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    """The process's tracer provider (settable once) feeding an in-memory exporter."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    return _EXPORTER


@pytest.fixture
def exported(spans):
    spans.clear()
    return spans


def test_off_by_default(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert tracing.endpoint(Settings()) is None
    assert tracing.setup(Settings(), "ingest") is False
    assert tracing.enabled() is False


def test_endpoint_from_our_variable_or_the_standard_ones(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")
    assert tracing.endpoint(Settings()) == "http://127.0.0.1:4318/v1/traces"
    monkeypatch.delenv("ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert tracing.endpoint(Settings()) == "http://collector:4318/v1/traces"
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom")
    assert tracing.endpoint(Settings()) == "http://c:4318/custom"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.endpoint(Settings()) is None


def test_sampling_ratio_is_bounded(monkeypatch):
    monkeypatch.setenv("ONCEFLOW_OTEL_SAMPLING_RATIO", "0.25")
    assert Settings().otel_sampling_ratio == 0.25
    monkeypatch.setenv("ONCEFLOW_OTEL_SAMPLING_RATIO", "1.5")
    with pytest.raises(ValueError):
        Settings()


def test_traceparent_round_trip():
    tp = new_traceparent()
    ctx = tracing.context_from_traceparent(tp)
    assert ctx is not None
    sc = trace.get_current_span(ctx).get_span_context()
    assert sc.is_remote and f"{sc.trace_id:032x}" == tp.split("-")[1]
    assert tracing.traceparent_of(trace.get_current_span(ctx)) == tp
    headers = [("onceflow-job-id", b"j"), (HEADER_TRACEPARENT, tp.encode())]
    from_headers = tracing.context_from_headers(headers)
    assert from_headers is not None
    assert trace.get_current_span(from_headers).get_span_context() == sc
    for bad in ("", None, "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"):
        assert tracing.context_from_traceparent(bad) is None


def _job_spans(tp: str) -> JobSpans:
    spans = JobSpans.of(tp, "job-1", "orders", 1)
    assert spans is not None
    return spans


def test_step_spans_are_children_of_the_jobs_traceparent_and_replay_emits_none(exported):
    tp = new_traceparent()
    trace_id = int(tp.split("-")[1], 16)
    parent_id = int(tp.split("-")[2], 16)
    inner: list[Any] = []

    def charge() -> int:
        # Step code runs with the step's span current: its own spans nest under it.
        inner.append(trace.get_current_span().get_span_context().span_id)
        return 42

    rt = FakeRuntime()
    ctx = context(rt, [step(0, "fetch", {"order": 7})])
    ctx.spans = _job_spans(tp)

    async def workflow() -> None:
        await ctx.step("fetch", charge)  # replayed: recorded complete, emits nothing
        await ctx.step("charge", charge)
        assert exported.get_finished_spans() == ()  # ends once its checkpoint commits
        await ctx.flush()  # the runner's part at the end of a run

    asyncio.run(workflow())
    finished = exported.get_finished_spans()
    assert [s.name for s in finished] == ["step charge"]
    span = finished[0]
    assert span.context.trace_id == trace_id
    assert span.parent is not None and span.parent.span_id == parent_id
    assert span.attributes[tracing.JOB_ID] == "job-1"
    assert span.attributes[tracing.WORKFLOW] == "orders"
    assert span.attributes[tracing.ATTEMPT] == 1
    assert inner == [span.context.span_id]


def test_a_failed_attempt_is_an_error_span_and_the_retry_another(exported):
    from workflow_engine.definitions import RetryPolicy

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    rt = FakeRuntime()
    ctx = context(rt, [])
    ctx.spans = _job_spans(new_traceparent())

    async def workflow() -> None:
        await ctx.step("flaky", flaky, retries=RetryPolicy(limit=2, delay=0))
        await ctx.flush()

    asyncio.run(workflow())
    finished = exported.get_finished_spans()
    assert [(s.name, s.attributes[tracing.ATTEMPT]) for s in finished] == [
        ("step flaky", 1),
        ("step flaky", 2),
    ]
    assert finished[0].status.status_code == trace.StatusCode.ERROR
    assert finished[1].status.status_code == trace.StatusCode.UNSET


def test_no_spans_without_a_traceparent_or_when_off(exported):
    assert JobSpans.of(None, "j", "w", 1) is None
    assert JobSpans.of("", "j", "w", 1) is None
    rt = FakeRuntime()
    ctx = context(rt, [])  # the runner sets no spans when tracing is off

    async def workflow() -> None:
        await ctx.step("one", lambda: 1)

    asyncio.run(workflow())
    assert exported.get_finished_spans() == ()


def test_a_sleep_that_suspends_records_no_span_yet(exported):
    """The sleep's span is recorded once, by the run in which it ends."""
    rt = FakeRuntime()
    recorded = RecordedStep(0, "nap", StepStatus.SLEEPING, 0, None, StepKind.SLEEP)
    ctx = context(rt, [recorded])
    ctx.spans = _job_spans(new_traceparent())
    wake = rt.clock.db_now()

    async def begin_wait_not_due(fn, *args, **kwargs):
        return wake, False

    rt.call_db = begin_wait_not_due  # type: ignore[method-assign]

    async def workflow() -> None:
        await ctx.sleep("nap", 60)

    with pytest.raises(Suspend):
        asyncio.run(workflow())
    assert exported.get_finished_spans() == ()


def test_an_attempt_cut_off_by_a_crash_gets_an_error_span_when_the_step_runs_again(exported):
    """SIGKILL mid-step leaves the step running with no error and no span: the replay
    that runs it again records the lost attempt first."""
    rt = FakeRuntime()
    cut = RecordedStep(0, "charge", StepStatus.RUNNING, 1, None)
    ctx = context(rt, [cut])
    ctx.spans = _job_spans(new_traceparent())

    async def workflow() -> None:
        await ctx.step("charge", lambda: 42)
        await ctx.flush()

    asyncio.run(workflow())
    finished = exported.get_finished_spans()
    assert [s.name for s in finished] == ["step charge", "step charge"]
    lost = finished[0]
    assert lost.attributes[tracing.ATTEMPT] == 1 and lost.attributes["onceflow.cut_off"]
    assert lost.status.status_code == trace.StatusCode.ERROR
    assert finished[1].status.status_code == trace.StatusCode.UNSET


def test_a_retried_attempt_is_not_taken_for_a_cut_off_one(exported):
    rt = FakeRuntime()
    retried = RecordedStep(0, "charge", StepStatus.RUNNING, 1, None, error="boom")
    ctx = context(rt, [retried])
    ctx.spans = _job_spans(new_traceparent())

    async def workflow() -> None:
        await ctx.step("charge", lambda: 42)
        await ctx.flush()

    asyncio.run(workflow())
    assert [s.attributes.get("onceflow.cut_off") for s in exported.get_finished_spans()] == [None]


def test_with_tracing_on_the_whole_ingest_front_is_traced(exported, monkeypatch):
    """The request span wraps the submit front: a submission (answered before FastAPI)
    and a FastAPI route each get a SERVER span, the submission's send a child of it."""
    from fastapi.testclient import TestClient

    from producers.api import TracedFront, create_app
    from tests.unit.test_ingest_http import ScriptedProducer

    monkeypatch.setattr(tracing, "_enabled", True)
    settings = Settings(auth_disabled=True, ingest_validate_types=False)
    app = create_app(settings, ScriptedProducer())
    assert isinstance(app, TracedFront)
    with TestClient(app) as client:
        accepted = client.post("/v1/jobs", json={"workflow": "w"})
        health = client.get("/healthz")
    assert (accepted.status_code, health.status_code) == (202, 200)
    spans = {s.name: s for s in exported.get_finished_spans()}
    request, sent = spans["POST /v1/jobs"], spans[f"send {settings.jobs_topic}"]
    assert request.kind == trace.SpanKind.SERVER and sent.parent is not None
    assert sent.parent.span_id == request.context.span_id
    assert request.attributes["http.response.status_code"] == 202
    assert spans["GET /healthz"].attributes["http.route"] == "/healthz"
