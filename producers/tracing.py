"""Ingest's spans: the HTTP request (SERVER) and the Kafka send (PRODUCER).

Both hooks exist only when tracing is on (:func:`onceflow.tracing.setup` said so):
``create_app`` wraps the whole front in :class:`TraceRequests` (``producers.api.TracedFront``)
and the producer in :class:`TracedSender`; with tracing off the request path has no
tracing code at all.

The send span's context becomes each job's ``traceparent`` (record header and body),
so the worker's and the engine's spans of a job land in the request's trace. The jobs
of one batch request share that trace; ``onceflow.job_id`` tells them apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onceflow import tracing
from onceflow.envelope import JobEnvelope
from producers.kafka import Ack, JobSender

_tracer = tracing.tracer("onceflow.ingest")


class TraceRequests:
    """One SERVER span per HTTP request, continuing a caller's ``traceparent``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parent = tracing.PROPAGATOR.extract(headers)
        method = scope["method"]
        span = _tracer.start_span(
            f"{method} {scope['path']}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        )
        token = context.attach(trace.set_span_in_context(span, parent))

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        try:
            await self.app(scope, receive, send_traced)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            route = scope.get("route")  # set by FastAPI's router: the path template
            if route is not None and hasattr(route, "path"):
                span.update_name(f"{method} {route.path}")
                span.set_attribute("http.route", route.path)
            context.detach(token)
            span.end()


class TracedSender:
    """A :class:`JobSender` that sends inside a PRODUCER span whose context each
    envelope carries as its ``traceparent``."""

    def __init__(self, inner: JobSender, topic: str) -> None:
        self.inner = inner
        self.topic = topic

    async def send(self, envelopes: Sequence[JobEnvelope]) -> list[Ack]:
        attributes: dict[str, str | int] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.destination.name": self.topic,
            "messaging.batch.message_count": len(envelopes),
        }
        if len(envelopes) == 1:
            attributes[tracing.JOB_ID] = envelopes[0].job_id
            attributes[tracing.WORKFLOW] = envelopes[0].workflow
        with _tracer.start_as_current_span(
            f"send {self.topic}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            if span.get_span_context().is_valid:
                traceparent = tracing.traceparent_of(span)
                envelopes = [dataclasses.replace(e, traceparent=traceparent) for e in envelopes]
            acks = await self.inner.send(envelopes)
            failed = [a for a in acks if not a.ok]
            if len(acks) == 1 and acks[0].ok:
                span.set_attribute(tracing.PARTITION, acks[0].partition or 0)
                span.set_attribute(tracing.OFFSET, acks[0].offset or 0)
            if failed:
                span.set_status(
                    Status(StatusCode.ERROR, f"{len(failed)} not acknowledged: {failed[0].error}")
                )
            return acks

    def ready(self) -> bool:
        return self.inner.ready()

    def close(self) -> int:
        return self.inner.close()
