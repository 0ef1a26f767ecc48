"""What the ingest routes need, built once per app and handed to them by FastAPI.

``create_app`` puts one :class:`Ingest` on ``app.state``; routes ask for it, for the
caller's identity (``require(scope)``) or for the database with ``Depends``. The
dependency functions are ``async`` on purpose: FastAPI runs a plain ``def`` dependency
in its thread pool, a thread hop per request that the submit path does not need.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from onceflow.settings import SCOPES, Settings
from onceflow.vocabulary import ActionResult, IdReuse, OperatorAction
from producers.auth import Authenticator
from producers.kafka import JobSender
from producers.limits import ClientLimiter
from producers.models import RequestError, exact_json_object
from workflow_engine.model import Registry
from workflow_engine.store import operations
from workflow_engine.store.operations import Actor

if TYPE_CHECKING:
    from producers.stream_hub import StreamHub
    from producers.waiters import Waiters
    from workflow_engine.store.operations import BulkRunner


@dataclass(slots=True, eq=False)
class Ingest:
    """The long-lived parts of one ingest app."""

    settings: Settings
    auth: Authenticator
    limiter: ClientLimiter
    #: Workflow and task names this deployment knows (None: any name is accepted).
    known_types: frozenset[str] | None
    #: Given by the caller, or created by the app's lifespan (it starts a thread).
    producer: JobSender | None = None
    #: The admin API's bulk runner (started by the lifespan, or by the first bulk
    #: operation): it also resumes operations a dead process left running.
    bulk: BulkRunner | None = None
    #: Webhook endpoint names a job's callback may name (None: not checked at ingest).
    known_callbacks: frozenset[str] | None = None
    #: What the open output-stream readers share (created by the first one).
    streams: StreamHub | None = None
    #: Plain task names this deployment knows (not waited for: tasks have no events).
    task_types: frozenset[str] = frozenset()
    #: Start and wait (``ingest_max_wait_seconds`` > 0): created by the lifespan.
    waiters: Waiters | None = None
    #: Workflows whose jobs run in batches (``@workflow(batch=...)``): no start_within.
    batched: frozenset[str] = frozenset()
    #: Workflows whose ids may run again (``@workflow(id_reuse=...)`` not ``never``): a
    #: waiting resubmission waits for its own record's run. None: not known here (types
    #: not checked), so every workflow's may.
    may_reuse: frozenset[str] | None = frozenset()

    @classmethod
    def from_settings(
        cls, settings: Settings, registry: Registry, producer: JobSender | None = None
    ) -> Ingest:
        return cls(
            settings,
            Authenticator(settings),
            ClientLimiter(
                settings.ingest_rate_limit_per_second,
                settings.ingest_rate_limit_burst,
                settings.ingest_max_inflight_per_client,
            ),
            _known_types(registry) if settings.ingest_validate_types else None,
            producer,
            known_callbacks=(
                frozenset(settings.webhook_endpoints) if settings.ingest_validate_types else None
            ),
            task_types=frozenset(registry.task_names()),
            batched=frozenset(registry.batches()),
            may_reuse=_may_reuse(registry) if settings.ingest_validate_types else None,
        )

    def bulk_runner(self, db: Engine) -> BulkRunner:
        """The process's one bulk runner (created on first use, on ``db``)."""
        if self.bulk is None:
            from workflow_engine.store.operations import BulkRunner

            self.bulk = BulkRunner(db)
        return self.bulk

    def stream_hub(self, db: Engine) -> StreamHub:
        """The process's one :class:`~producers.stream_hub.StreamHub` (created on first
        use, on ``db``)."""
        if self.streams is None:
            from producers.stream_hub import StreamHub

            s = self.settings
            self.streams = StreamHub(db, s.ingest_stream_max_readers, s.ingest_stream_poll_seconds)
        return self.streams

    def sender(self) -> JobSender:
        if self.producer is None:
            raise RuntimeError("the ingest app is not started (its lifespan has not run)")
        return self.producer


def _known_types(registry: Registry) -> frozenset[str] | None:
    """Workflow and task names registered by the configured modules (None: no check)."""
    names = frozenset(registry.workflow_names()) | frozenset(registry.task_names())
    return names or None


def _may_reuse(registry: Registry) -> frozenset[str]:
    return frozenset(
        name for name in registry.workflow_names() if registry.id_reuse(name) is not IdReuse.NEVER
    )


async def get_ingest(request: Request) -> Ingest:
    ingest: Ingest = request.app.state.ingest
    return ingest


IngestDep = Annotated[Ingest, Depends(get_ingest)]


#: What a refused admin request was trying to do: an action, or one named by the request.
AuditAs = OperatorAction | Callable[[Request], OperatorAction]


def require(scope: str, audit_as: AuditAs | None = None) -> Callable[..., Awaitable[str]]:
    """A dependency giving the caller's identity, if its API key holds ``scope``.

    With ``audit_as`` (the admin routes), a refusal (401/403) is recorded in the
    operators' audit trail as that action before it is answered; without it (the
    submit path, which must not need PostgreSQL), it is not."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def caller(request: Request, ingest: IngestDep) -> str:
        try:
            return ingest.auth.authenticate(request, scope)
        except RequestError as exc:
            if audit_as is not None:
                action = audit_as if isinstance(audit_as, OperatorAction) else audit_as(request)
                await run_in_threadpool(_record_refusal, ingest, request, action, exc)
            raise

    return caller


def operator(action: AuditAs) -> Callable[..., Awaitable[Actor]]:
    """A dependency giving the :class:`Actor` of a control request (its key must hold
    ``instances:control``; a refusal is recorded as ``action``): what the route hands
    the store, which records the action itself."""
    # A default, not Annotated[str, Depends(check)]: the annotations are strings (PEP
    # 563) that FastAPI resolves in the module's globals, where ``check`` is not.
    check = Depends(require("instances:control", audit_as=action))

    async def actor(request: Request, name: str = check) -> Actor:
        return Actor.admin_api(name, _peer(request))

    return actor


def _peer(request: Request) -> str | None:
    return request.client.host if request.client else None


def _record_refusal(
    ingest: Ingest, request: Request, action: OperatorAction, exc: RequestError
) -> None:
    """One row and one log line for a refused admin request (best effort: the answer
    is the refusal whether or not the database takes the row)."""
    from workflow_engine.store import shared_engine

    who = Actor.admin_api(ingest.auth.claimed_name(request.headers), _peer(request))
    refused = operations.entry(
        who,
        action,
        ActionResult.REFUSED,
        workflow=request.path_params.get("workflow"),
        job_id=request.path_params.get("job_id"),
        detail=f"{exc.status} {request.method} {request.url.path}: {exc.body.message}",
    )
    operations.record_quietly(
        shared_engine(ingest.settings.database_url, ingest.settings.lifecycle_events), refused
    )


async def get_db(ingest: IngestDep) -> Engine:
    """The process's pooled engine for the admin and job-status routes."""
    from workflow_engine.store import shared_engine

    return shared_engine(ingest.settings.database_url, ingest.settings.lifecycle_events)


DbDep = Annotated[Engine, Depends(get_db)]


async def exact_body(request: Request) -> None:
    """The body under the job submissions' JSON rule (``exact_json_object``), before
    FastAPI's own parse takes it: that one (Python's json) reads NaN, a lone surrogate,
    an integer past 64 bits, ``-0.0``, ``1e-400`` and a repeated key, so what an operator
    sent (a schedule's params, an event's payload) was stored as other values or
    answered 500. A dependency of the routes whose body is user data; the fields it
    names are the body's (``body.payload.x``), as the routes' own validation names them."""
    try:
        exact_json_object(await request.body())
    except RequestError as exc:
        for field in exc.body.fields:
            if field.field != "body":
                field.field = f"body.{field.field}"
        raise
