"""Handling one batch of consumed records: the part of the worker that must be right.

Guarantees (see docs/architecture.md, "Offsets after commits"):

* A batch's records are acked to Faust only when :meth:`BatchHandler.handle` returns,
  and it returns only after every record is either committed to Postgres (instance
  created or duplicate recorded) or acknowledged by Kafka on the dead-letter topic.
* Database outages block and retry with backoff; nothing is skipped.
* Bounded concurrency lives *inside* a batch: up to ``streams_concurrency``
  transactions in parallel, one per group of whole partitions. The next batch is not
  taken until all of them committed, so no offset can pass an uncommitted record
  (the trap of faust-streaming's agent ``concurrency>1``, issue #606).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy.exc as sa_exc
from confluent_kafka import Producer
from sqlalchemy.engine import Engine
from tenacity import Retrying, retry_if_exception, stop_never, wait_exponential_jitter

from onceflow import failpoints, tracing
from onceflow.settings import Settings
from onceflow.vocabulary import DeadLetterReason, JobKind
from streams.dead_letters import DeadLetterWriter
from streams.metrics import (
    BATCH_SIZE,
    CREATED,
    DB_LATENCY,
    DB_RETRIES,
    DUPLICATES,
    IN_FLIGHT,
    MISMATCHES,
    RECORDS,
)
from streams.records import (
    DeadLetter,
    RawRecord,
    classify,
    registered_kind,
    split_by_partition,
)
from streams.tasks import run_task
from streams.tracing import record_spans
from workflow_engine.store import task_runs
from workflow_engine.store.db import is_transient
from workflow_engine.store.instances import CreateResult, Delivery, create_instances

log = logging.getLogger(__name__)
T = TypeVar("T")

# "The database cannot answer right now" (unreachable, failing over, a server that is no
# longer the primary): block and retry (workflow_engine.store.db.is_transient). The
# create is an upsert keyed by job id and Kafka position, so a retry after a commit
# whose answer was lost changes nothing.

MAX_RECORD_BYTES = 1024 * 1024


class BatchHandler:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        make_dlq_producer: Callable[[], Producer],
        kind_of: Callable[[str], str | None] = registered_kind,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.dead_letters = DeadLetterWriter(
            settings, engine, make_dlq_producer, self.with_db_retry
        )
        self.kind_of = kind_of
        # The records of the batch being handled, by position: a delivery that must be
        # dead-lettered later (refused by the database, a failed task) goes as it came.
        self._records: dict[tuple[str, int, int], RawRecord] = {}
        self._commits = 0
        self._lock = threading.Lock()
        self._failpoint_after = _parse_failpoint(settings.failpoint, "streams.after_db_commit")
        self._traced = tracing.enabled()

    async def handle(self, records: list[RawRecord]) -> CreateResult:
        IN_FLIGHT.set(len(records))
        BATCH_SIZE.observe(len(records))
        for rec in records:
            RECORDS.labels(rec.topic, str(rec.partition)).inc()
        self._records = {(r.topic, r.partition, r.offset): r for r in records}
        deliveries, dead = classify(records, MAX_RECORD_BYTES, self.kind_of)
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
        todo = await asyncio.to_thread(
            self.with_db_retry, task_runs.pending, self.engine, list(first)
        )
        slots = asyncio.Semaphore(self.settings.streams_concurrency)

        def dead_letter(job_id: str, reason: DeadLetterReason, detail: str) -> None:
            self._dead_letter([DeadLetter(self._as_record(first[job_id]), reason, detail, job_id)])

        async def one(pending: task_runs.PendingTask) -> None:
            async with slots:
                await asyncio.to_thread(
                    run_task, self.engine, pending, dead_letter, self.with_db_retry
                )

        await asyncio.gather(*(one(p) for p in todo))

    def with_db_retry(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn``; while the database is unreachable, wait and call it again."""
        for attempt in Retrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential_jitter(initial=0.1, max=5.0),
            stop=stop_never,
            before_sleep=_log_retry,
            reraise=True,
        ):
            with attempt:
                return fn(*args)
        raise AssertionError("unreachable")

    # --- in worker threads ---------------------------------------------------------

    def _create(self, chunk: list[Delivery]) -> CreateResult:
        try:
            started = time.perf_counter()
            started_ns = time.time_ns()
            result = self.with_db_retry(create_instances, self.engine, chunk)
            DB_LATENCY.observe(time.perf_counter() - started)
        except sa_exc.DBAPIError as exc:
            # The database refused the batch for a reason that retrying will not fix:
            # isolate the offending record(s), dead-letter them, keep the rest.
            log.error(
                "batch rejected (%s); retrying record by record",
                exc.orig,
                extra={"event": "streams.batch_rejected"},
            )
            result = self._create_one_by_one(chunk)
        self._after_commit()
        self._report(chunk, result)
        if self._traced:
            record_spans(chunk, result, started_ns, time.time_ns())
        return result

    def _create_one_by_one(self, chunk: list[Delivery]) -> CreateResult:
        total = CreateResult()
        for delivery in chunk:
            try:
                total.add(self.with_db_retry(create_instances, self.engine, [delivery]))
            except sa_exc.DBAPIError as exc:
                letter = DeadLetter(
                    self._as_record(delivery),
                    DeadLetterReason.DATABASE_REFUSED,
                    f"database rejected: {exc.orig}",
                    delivery.envelope.job_id,
                )
                self._dead_letter([letter])
        return total

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
        # Two ways to stop here: the test-armed failpoint (tests/failpoint_main.py) and
        # the older ``failpoint`` setting the chaos run's worker is started with.
        failpoints.hit("streams.after_db_commit")
        with self._lock:
            self._commits += 1
            commits = self._commits
        if self._failpoint_after is not None and commits >= self._failpoint_after:
            log.critical(
                "failpoint streams.after_db_commit reached: SIGKILL",
                extra={"event": "streams.failpoint"},
            )
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def _report(self, chunk: list[Delivery], result: CreateResult) -> None:
        CREATED.inc(result.created)
        DUPLICATES.labels("redelivery").inc(result.redeliveries)
        DUPLICATES.labels("resubmission").inc(result.duplicates - result.redeliveries)
        MISMATCHES.inc(result.mismatches)
        first = _first_by_job(chunk)
        for job_id in result.created_ids:
            d = first[job_id]
            what = "instance" if d.kind == "workflow" else "task_run"
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


def _log_retry(retry_state) -> None:
    DB_RETRIES.inc()
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    log.warning(
        "database unavailable (%s); retrying in %.1fs",
        exc,
        retry_state.next_action.sleep if retry_state.next_action else 0,
        extra={"event": "streams.db_retry", "attempt": retry_state.attempt_number},
    )


def _parse_failpoint(spec: str, name: str) -> int | None:
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition(":")
        if key == name:
            return int(value or 1)
    return None
