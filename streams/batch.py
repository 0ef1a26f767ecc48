"""Handling one batch of consumed records: the part of the worker that must be right.

Guarantees (see docs/architecture.md, "Offsets after commits"):

* A batch's records are acked to Faust only when :meth:`BatchHandler.handle` returns,
  and it returns only after every record is either committed to Postgres (instance
  created or duplicate recorded) or acknowledged by Kafka on the dead-letter topic.
* Database outages block and retry with backoff; nothing is skipped. Errors are told
  apart by SQLSTATE (:func:`workflow_engine.store.db.classify`): a record the database
  refuses for good (a value too large for an index, bad data, a constraint) is isolated
  and dead-lettered (``database_refused``), and the rest of the batch is created.
* A worker that is stopping no longer retries: a batch waiting for the database is
  abandoned, unacked (:meth:`BatchHandler.stop_retrying`).
* Bounded concurrency lives *inside* a batch: up to ``streams_concurrency``
  transactions in parallel, one per group of whole partitions. The next batch is not
  taken until all of them committed, so no offset can pass an uncommitted record
  (the trap of faust-streaming's agent ``concurrency>1``, issue #606).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy.exc as sa_exc
from confluent_kafka import Producer
from sqlalchemy.engine import Engine

from onceflow import failpoints, tracing
from onceflow.settings import Settings
from onceflow.vocabulary import DeadLetterReason, JobKind
from streams.dead_letters import DeadLetterWriter
from streams.metrics import (
    BATCH_SIZE,
    CREATED,
    DB_LATENCY,
    DB_RETRIES,
    DEBOUNCE_DECISIONS,
    DUPLICATES,
    ID_REUSE,
    IN_FLIGHT,
    MISMATCHES,
    RECORDS,
    SINGLETON_DECISIONS,
)
from streams.records import (
    DeadLetter,
    RawRecord,
    classify,
    split_by_partition,
)
from streams.tasks import run_task
from streams.tracing import record_spans
from workflow_engine.model import CreateResult, Delivery, Registry
from workflow_engine.store import ErrorClass, refusal, sqlstate, writes
from workflow_engine.store import classify as error_class
from workflow_engine.store.writes import create_instances

log = logging.getLogger(__name__)
T = TypeVar("T")

# "The database cannot answer right now" (unreachable, failing over, a server that is no
# longer the primary) and "the transaction was rolled back for a conflict" (deadlock,
# serialization failure): block and retry. The create is an upsert keyed by job id and
# Kafka position, so a retry after a commit whose answer was lost changes nothing.
# Anything else the database says is the row's fault: retrying it would wedge the
# partition (SQLSTATE 54000, "index row too large", raised as an OperationalError like a
# dropped connection, was retried forever before: issue 23).
_RETRIED = frozenset({ErrorClass.TRANSIENT, ErrorClass.RETRY_TRANSACTION})
#: Backoff between retries: 0.1 s doubling up to 5 s, plus up to 1 s of jitter.
_RETRY_INITIAL_SECONDS, _RETRY_MAX_SECONDS, _RETRY_JITTER_SECONDS = 0.1, 5.0, 1.0

MAX_RECORD_BYTES = 1024 * 1024


class StoppedRetrying(Exception):
    """The worker is stopping while a transaction waits for the database: the batch is
    abandoned (its records are not acked, so their offsets are not committed, and they
    are redelivered to whoever consumes the partition next)."""


class BatchHandler:
    def __init__(
        self,
        settings: Settings,
        db: Engine,
        make_dlq_producer: Callable[[], Producer],
        registry: Registry,
    ) -> None:
        self.settings = settings
        self.db = db
        self.dead_letters = DeadLetterWriter(settings, db, make_dlq_producer, self.with_db_retry)
        #: Registered names decide what a record is: a workflow, a task, or a dead letter.
        self.registry = registry
        #: The webhook endpoints a job's callback may name.
        self._callbacks = frozenset(settings.webhook_endpoints)
        # The records of the batch being handled, by position: a delivery that must be
        # dead-lettered later (refused by the database, a failed task) goes as it came.
        self._records: dict[tuple[str, int, int], RawRecord] = {}
        self._traced = tracing.enabled()
        self._stopping = threading.Event()

    def stop_retrying(self) -> None:
        """The worker is stopping: a transaction that fails for a transient reason now
        raises :class:`StoppedRetrying` instead of waiting for the database, and a wait
        between two attempts ends at once. A transaction under way is not interrupted:
        it commits (and its batch is acked) or fails."""
        self._stopping.set()

    async def handle(self, records: list[RawRecord]) -> CreateResult:
        IN_FLIGHT.set(len(records))
        BATCH_SIZE.observe(len(records))
        for (topic, partition), n in Counter((r.topic, r.partition) for r in records).items():
            RECORDS.labels(topic, str(partition)).inc(n)  # per partition: labels() is dear
        self._records = {(r.topic, r.partition, r.offset): r for r in records}
        deliveries, dead = classify(records, MAX_RECORD_BYTES, self.registry, self._callbacks)
        if dead:
            await asyncio.to_thread(self._dead_letter, dead)
        chunks = split_by_partition(deliveries, self.settings.streams_concurrency)
        results = await asyncio.gather(*(asyncio.to_thread(self._create, c) for c in chunks))
        total = CreateResult()
        for r in results:
            total.add(r)
        await self._run_tasks([d for d in deliveries if d.kind == JobKind.TASK])
        IN_FLIGHT.set(0)
        return total

    async def _run_tasks(self, deliveries: list[Delivery]) -> None:
        """Run the batch's tasks that have not succeeded yet (new, or interrupted)."""
        if not deliveries:
            return
        first = _first_by_job(deliveries)
        todo = await asyncio.to_thread(self.with_db_retry, writes.pending, self.db, list(first))
        slots = asyncio.Semaphore(self.settings.streams_concurrency)

        def dead_letter(job_id: str, reason: DeadLetterReason, detail: str) -> None:
            self._dead_letter([DeadLetter(self._as_record(first[job_id]), reason, detail, job_id)])

        async def one(pending: writes.PendingTask) -> None:
            async with slots:
                await asyncio.to_thread(
                    run_task,
                    self.db,
                    self.registry.task(pending.task),
                    pending,
                    dead_letter,
                    self.with_db_retry,
                )

        await asyncio.gather(*(one(p) for p in todo))

    def with_db_retry(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn``; while the database is unreachable (or rolled the transaction back
        for a conflict), wait and call it again, with backoff, until the worker stops
        (:class:`StoppedRetrying`). An error that is the row's fault is raised at once."""
        attempt = 0
        while True:
            try:
                return fn(*args)
            except Exception as exc:
                if error_class(exc) not in _RETRIED:
                    raise
                if self._stopping.is_set():
                    raise StoppedRetrying(f"stopping; the database: {refusal(exc)}") from exc
                attempt += 1
                delay = _backoff(attempt)
                _log_retry(exc, attempt, delay)
                if self._stopping.wait(delay):
                    raise StoppedRetrying(f"stopping; the database: {refusal(exc)}") from exc

    # --- in worker threads ---------------------------------------------------------

    def _create(self, chunk: list[Delivery]) -> CreateResult:
        try:
            started = time.perf_counter()
            started_ns = time.time_ns()
            result = self.with_db_retry(create_instances, self.db, chunk)
            DB_LATENCY.observe(time.perf_counter() - started)
        except sa_exc.DBAPIError as exc:
            # The database refused the batch for a reason that retrying will not fix
            # (with_db_retry retried every other): isolate the offending record(s),
            # dead-letter them, keep the rest.
            log.error(
                "batch refused (%s); isolating the refused records",
                refusal(exc),
                extra={"event": "streams.batch_rejected", "sqlstate": sqlstate(exc)},
            )
            result = self._create_isolating(chunk, exc)
        self._after_commit()
        self._report(chunk, result)
        if self._traced:
            record_spans(chunk, result, started_ns, time.time_ns())
        return result

    def _create_isolating(self, chunk: list[Delivery], refused: sa_exc.DBAPIError) -> CreateResult:
        """Create ``chunk``, which the database refused as a whole (``refused``): in two
        halves, in order, each its own transaction, splitting again whichever is
        refused, down to the single records it refuses, which are dead-lettered. One
        culprit among n records costs about 2 log2(n) transactions instead of n."""
        if len(chunk) == 1:
            self._dead_letter([self._refused(chunk[0], refused)])
            return CreateResult()
        total = CreateResult()
        middle = len(chunk) // 2
        for half in (chunk[:middle], chunk[middle:]):
            try:
                total.add(self.with_db_retry(create_instances, self.db, half))
            except sa_exc.DBAPIError as exc:
                total.add(self._create_isolating(half, exc))
        return total

    def _refused(self, delivery: Delivery, exc: sa_exc.DBAPIError) -> DeadLetter:
        """The dead letter of a record the database refused: the SQLSTATE and the
        server's message in its detail."""
        return DeadLetter(
            self._as_record(delivery),
            DeadLetterReason.DATABASE_REFUSED,
            f"database rejected: {refusal(exc)}",
            delivery.envelope.job_id,
        )

    def _dead_letter(self, dead: list[DeadLetter]) -> None:
        """Write dead letters and wait for Kafka's acknowledgement (retrying forever)."""
        if dead:
            self.dead_letters.write(dead)

    def _as_record(self, d: Delivery) -> RawRecord:
        """The record a delivery came from, as consumed (for the dead-letter topic)."""
        found = self._records.get((d.topic, d.partition, d.offset))
        if found is not None:
            return found
        env = d.envelope
        return RawRecord(d.topic, d.partition, d.offset, env.key(), env.encode(), env.headers())

    def _after_commit(self) -> None:
        # The window between the database commit and the offset commit: tests and the
        # chaos run arm it (onceflow_tools.failpoint_main) to SIGKILL the worker here.
        failpoints.hit("streams.after_db_commit")

    def _report(self, chunk: list[Delivery], result: CreateResult) -> None:
        CREATED.inc(result.created)
        DUPLICATES.labels("redelivery").inc(result.redeliveries)
        DUPLICATES.labels("resubmission").inc(result.duplicates - result.redeliveries)
        MISMATCHES.inc(result.mismatches)
        for workflow, decision in result.singleton_decisions:
            SINGLETON_DECISIONS.labels(workflow, decision).inc()
        for workflow, decision in result.id_reuse_decisions:
            ID_REUSE.labels(workflow, decision).inc()
        for workflow, decision in result.debounce_decisions:
            DEBOUNCE_DECISIONS.labels(workflow, decision).inc()
        first = _first_by_job(chunk)
        new_runs = set(result.new_runs)
        for job_id in result.created_ids:
            d = first[job_id]
            what = "instance" if d.kind == JobKind.WORKFLOW else "task_run"
            log.info(
                f"{what.replace('_', ' ')} created",
                extra={
                    "event": f"{what}.created",
                    "job_id": job_id,
                    "workflow": d.envelope.workflow,
                    "request_id": d.envelope.request_id,
                    "topic": d.topic,
                    "partition": d.partition,
                    "offset": d.offset,
                    "new_run": job_id in new_runs,
                },
            )
        mismatched = set(result.mismatch_ids)
        for job_id in result.duplicate_ids:
            log.info(
                "duplicate delivery collapsed",
                extra={
                    "event": "delivery.duplicate",
                    "job_id": job_id,
                    "params_match": job_id not in mismatched,
                },
            )


def _first_by_job(deliveries: list[Delivery]) -> dict[str, Delivery]:
    """The earliest delivery of each job id (the one that can create it)."""
    first: dict[str, Delivery] = {}
    for d in deliveries:
        first.setdefault(d.envelope.job_id, d)
    return first


def _backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based)."""
    exponential = _RETRY_INITIAL_SECONDS * 2 ** min(attempt - 1, 32)
    return min(_RETRY_MAX_SECONDS, exponential + random.uniform(0, _RETRY_JITTER_SECONDS))


def _log_retry(exc: BaseException, attempt: int, delay: float) -> None:
    DB_RETRIES.inc()
    log.warning(
        "database unavailable (%s); retrying in %.1fs",
        refusal(exc),
        delay,
        extra={"event": "streams.db_retry", "attempt": attempt, "sqlstate": sqlstate(exc)},
    )
