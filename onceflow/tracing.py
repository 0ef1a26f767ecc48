"""Traces (OpenTelemetry): off unless an OTLP endpoint is configured.

Every process calls :func:`setup` once at start. With no endpoint (the default) it
installs nothing: the OpenTelemetry API's tracer stays the no-op one and the processes
skip their tracing hooks entirely (one boolean, checked when they are built). With
``ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT`` (or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``
/ ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) it installs the SDK with a batch span processor
and an OTLP/HTTP exporter, and a parent-based ratio sampler (``ONCEFLOW_OTEL_SAMPLING_RATIO``,
unless ``OTEL_TRACES_SAMPLER`` names another one).

One job, one trace: ingest writes its span context into the record's ``traceparent``
header; the worker stores it in ``onceflow_jobs.traceparent``; the engine parents every
step, sleep, wait and completion span on it. The helpers here turn that W3C string (or
the Kafka headers) into an OpenTelemetry context and back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from onceflow.envelope import HEADER_TRACEPARENT
from onceflow.settings import Settings

log = logging.getLogger(__name__)

PROPAGATOR = TraceContextTextMapPropagator()
_enabled = False

#: Attribute names shared by the processes (OpenTelemetry's where one exists).
JOB_ID = "onceflow.job_id"
WORKFLOW = "onceflow.workflow"
ATTEMPT = "onceflow.attempt"
STEP = "onceflow.step"
PARTITION = "messaging.kafka.destination.partition"
OFFSET = "messaging.kafka.message.offset"


def endpoint(settings: Settings) -> str | None:
    """The OTLP/HTTP traces URL to export to, or None when tracing is off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    base = settings.otel_exporter_otlp_endpoint.strip()
    if base:
        return base if base.rstrip("/").endswith("/v1/traces") else base.rstrip("/") + "/v1/traces"
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip() or None


def setup(settings: Settings, process: str) -> bool:
    """Install the SDK for ``process`` if an endpoint is configured; say whether it did."""
    global _enabled
    url = endpoint(settings)
    if url is None:
        return False
    # Imported here: a process with tracing off never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    attributes = {"service.namespace": settings.otel_service_name_prefix}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = f"{settings.otel_service_name_prefix}-{process}"
    # OTEL_TRACES_SAMPLER, when set, wins (the SDK reads it when given no sampler).
    sampler = (
        None
        if os.environ.get("OTEL_TRACES_SAMPLER")
        else ParentBased(TraceIdRatioBased(settings.otel_sampling_ratio))
    )
    # The provider exports what is buffered at interpreter exit (shutdown_on_exit).
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    trace.set_tracer_provider(provider)
    _enabled = True
    log.info(
        "tracing to %s",
        url,
        extra={"event": "tracing.enabled", "sampling_ratio": settings.otel_sampling_ratio},
    )
    return True


def enabled() -> bool:
    """Has :func:`setup` installed the SDK in this process?"""
    return _enabled


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def context_from_traceparent(traceparent: str | None) -> Context | None:
    """The remote parent a stored W3C ``traceparent`` names (None if absent/invalid)."""
    if not traceparent:
        return None
    ctx = PROPAGATOR.extract({"traceparent": traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def context_from_headers(headers: Sequence[tuple[str, bytes]]) -> Context | None:
    """The remote parent in a Kafka record's ``traceparent`` header."""
    for key, value in headers:
        if key == HEADER_TRACEPARENT:
            return context_from_traceparent(value.decode("ascii", "replace"))
    return None


def traceparent_of(span: trace.Span) -> str:
    """The W3C ``traceparent`` naming ``span`` (its children continue its trace)."""
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"
