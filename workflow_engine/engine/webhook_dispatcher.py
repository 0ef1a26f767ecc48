"""The webhook dispatcher: lifecycle events in, signed deliveries out (README "Webhooks").

Two loops and a gauge, in the engine process by default (one dispatcher per engine) or
on their own (``onceflow webhooks run``):

* **intake** reads the events topic in the consumer group ``ONCEFLOW_WEBHOOK_CONSUMER_GROUP``:
  per poll, the callbacks of the batch's job ids in one query, the deliveries the
  workflows' subscriptions and the jobs' callbacks ask for in one insert (duplicates of
  an at-least-once relay collapse on ``(event id, endpoint)``), and the offsets
  committed only after that transaction has. A database outage blocks the loop (retried
  with backoff): no event is skipped. A failed poll or offset commit (a rebalance, a
  broker away) is logged and the loop goes on; the offsets wait for the next commit.
* **delivery** claims due deliveries (``FOR UPDATE SKIP LOCKED``, a lease and a claim
  number), sends each attempt (:mod:`.webhook_sender`), at most ``concurrency`` at once,
  and records its outcome fenced by the claim. An attempt is sent only while the lease
  outlasts the attempt's whole timeout, measured from before the claim, so a dispatcher
  that paused past its lease (GC, SIGSTOP, a failpoint) gives the attempt up unsent,
  and another dispatcher can claim a delivery only once no request of its previous
  claim can still be in flight. A failure is retried after a random delay up to
  ``base * 2^(attempt-1)`` (capped; "full jitter"), until the retry window closes:
  then the delivery is dead. A refused address is dead at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition
from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.errors import ConfigurationError
from onceflow.service_config import require_positive
from onceflow.vocabulary import WebhookOutcome, WebhookStatus
from onceflow.webhooks import WebhookEndpoint
from workflow_engine.engine.metrics import (
    WEBHOOK_ATTEMPT_DURATION,
    WEBHOOK_ATTEMPTS,
    WEBHOOK_DEAD,
    WEBHOOK_DELIVERIES,
    WEBHOOK_EVENTS,
    WEBHOOK_PENDING,
)
from workflow_engine.engine.services import Service
from workflow_engine.engine.webhook_events import LifecycleEvent, deliveries_for, parse_event
from workflow_engine.engine.webhook_sender import SenderConfig, WebhookSender
from workflow_engine.model import Registry
from workflow_engine.store import is_transient
from workflow_engine.store.writes import (
    AttemptResult,
    ClaimedDelivery,
    add_webhook_deliveries,
    claim_webhook_deliveries,
    record_webhook_attempt,
    webhook_callbacks,
    webhook_counts,
)

log = logging.getLogger(__name__)

#: Kept free between the end of an attempt's timeout and the end of its lease.
LEASE_MARGIN_SECONDS = 1.0
_POLL_BATCH = 500
_GAUGE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    """The dispatcher's settings (``ONCEFLOW_WEBHOOK_*``, built by
    :func:`workflow_engine.engine.configs.webhook_config`)."""

    bootstrap_servers: str
    events_topic: str
    consumer_group: str
    concurrency: int
    connect_timeout: float
    read_timeout: float
    attempt_timeout: float
    backoff_base: float
    backoff_max: float
    retry_seconds: float
    lease_seconds: float
    poll_interval: float

    def __post_init__(self) -> None:
        numbers = [f.name for f in fields(self) if f.type in ("int", "float")]
        require_positive(self, *numbers)
        if self.lease_seconds <= self.attempt_timeout + LEASE_MARGIN_SECONDS:
            raise ConfigurationError(
                f"DispatcherConfig.lease_seconds ({self.lease_seconds!r}) must exceed the"
                f" attempt timeout ({self.attempt_timeout!r}) by more than"
                f" {LEASE_MARGIN_SECONDS} s: an attempt must end inside its lease"
            )

    def backoff(self, attempt: int) -> float:
        """Full jitter: a random delay up to ``base * 2^(attempt-1)``, capped at max."""
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** min(attempt - 1, 60))
        return random.uniform(0, ceiling)


class WebhookDispatcher(Service):
    """The intake and delivery loops (module docstring); ``stop()`` lets the attempts
    in flight end (each is bounded by the attempt timeout)."""

    def __init__(
        self,
        db: Engine,
        registry: Registry,
        endpoints: Mapping[str, WebhookEndpoint],
        config: DispatcherConfig,
        owner: str,
    ) -> None:
        super().__init__()
        registry.check_webhooks(endpoints)
        self.db = db
        self.registry = registry
        self.endpoints = dict(endpoints)
        self.config = config
        self.owner = owner
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        #: The intake's offsets to commit, by (topic, partition): kept until a commit
        #: succeeds (or the partition is revoked).
        self._uncommitted: dict[tuple[str, int], int] = {}

    async def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(
                task, self.config.attempt_timeout + 5 * self.config.poll_interval
            )
        except TimeoutError:
            log.warning("webhook dispatcher did not stop in time", extra={"event": "webhooks.stop"})

    async def run(self) -> None:
        c = self.config
        sender = WebhookSender(
            self.endpoints,
            SenderConfig(c.connect_timeout, c.read_timeout, c.attempt_timeout),
            c.concurrency,
        )
        log.info(
            "webhook dispatcher started",
            extra={"event": "webhooks.started", "endpoints": sorted(self.endpoints)},
        )
        intake = asyncio.create_task(self._intake(), name="webhooks-intake")
        delivery = asyncio.create_task(self._deliver(sender), name="webhooks-delivery")
        gauges = asyncio.create_task(self._gauges(), name="webhooks-gauges")
        try:
            await self._stopping.wait()
        finally:
            self._stopping.set()
            self._wake.set()
            gauges.cancel()
            # The loops end within a poll interval; the attempts in flight within
            # their timeout.
            await asyncio.gather(intake, delivery, gauges, return_exceptions=True)
            await asyncio.gather(*self._inflight, return_exceptions=True)
            await sender.aclose()
            log.info("webhook dispatcher stopped", extra={"event": "webhooks.stopped"})

    # --- intake -------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": self.config.bootstrap_servers,
                "group.id": self.config.consumer_group,
                "client.id": f"onceflow-webhooks-{self.owner}",
                "enable.auto.commit": False,
                # A new group starts at the oldest event the topic keeps: events
                # published before the first dispatcher started are not lost.
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10000,
            }
        )
        consumer.subscribe([self.config.events_topic], on_revoke=self._revoked)
        return consumer

    async def _intake(self) -> None:
        consumer = await asyncio.to_thread(self._consumer)
        delay = 0.1
        try:
            while not self._stopping.is_set():
                try:
                    await self._intake_batch(consumer)
                    delay = 0.1
                except Exception as exc:
                    if self._stopping.is_set():
                        raise
                    # A failed poll or offset commit (a rebalance, the coordinator
                    # moving, a broker down) must not end the intake: the deliveries
                    # are committed, the offsets are committed with the next poll's,
                    # and events read again collapse into their deliveries.
                    log.warning(
                        "webhook intake: %s (goes on)",
                        exc,
                        extra={"event": "webhooks.intake_error"},
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            await asyncio.to_thread(consumer.close)

    async def _intake_batch(self, consumer: Consumer) -> None:
        """One poll: its deliveries committed, then its offsets and any a failed commit
        left (:attr:`_uncommitted`)."""
        batch = await asyncio.to_thread(consumer.consume, _POLL_BATCH, self.config.poll_interval)
        records = [m for m in batch if m.error() is None]
        if records:
            await self._take(records)
            for tp in _next_offsets(records):
                self._uncommitted[(tp.topic, tp.partition)] = tp.offset
        if not self._uncommitted:
            return
        await failpoints.hit_async("webhooks.before_commit")
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(self._uncommitted.items())]
        await asyncio.to_thread(consumer.commit, offsets=offsets, asynchronous=False)
        for tp in offsets:
            if self._uncommitted.get((tp.topic, tp.partition)) == tp.offset:
                del self._uncommitted[(tp.topic, tp.partition)]

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """A partition given to another member: its offsets are that member's to commit."""
        for tp in partitions:
            self._uncommitted.pop((tp.topic, tp.partition), None)

    async def _take(self, records: list[Message]) -> None:
        """The batch's deliveries, committed; retried while the database cannot answer
        (the offsets wait: an event is never skipped)."""
        events: list[LifecycleEvent] = []
        for record in records:
            event = parse_event(record.headers() or None, record.value())  # type: ignore[arg-type]
            if event is None:
                WEBHOOK_EVENTS.labels("skipped").inc()
            else:
                events.append(event)
        delay = 0.1
        while True:
            try:
                created, subscribed = await asyncio.to_thread(self._store, events)
                break
            except Exception as exc:
                if self._stopping.is_set():
                    raise
                # The same batch again, never the next: its offsets are not committed,
                # and the consumer's position is already past it.
                level = logging.WARNING if is_transient(exc) else logging.ERROR
                log.log(
                    level,
                    "webhook intake retries its batch: %s",
                    exc,
                    extra={"event": "webhooks.intake_retry"},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        WEBHOOK_EVENTS.labels("subscribed").inc(subscribed)
        WEBHOOK_EVENTS.labels("unsubscribed").inc(len(events) - subscribed)
        if created:
            self._wake.set()

    def _store(self, events: list[LifecycleEvent]) -> tuple[int, int]:
        with self.db.begin() as conn:
            callbacks = webhook_callbacks(conn, [(e.job_id, e.run) for e in events])
            rows = deliveries_for(events, callbacks, self.registry, self.endpoints)
            created = add_webhook_deliveries(conn, rows, self.config.retry_seconds)
        return created, len({r.event_id for r in rows})

    # --- delivery -----------------------------------------------------------------

    async def _deliver(self, sender: WebhookSender) -> None:
        c = self.config
        while not self._stopping.is_set():
            free = c.concurrency - len(self._inflight)
            claimed: list[ClaimedDelivery] = []
            if free > 0:
                claimed_at = time.monotonic()  # before the claim: the lease starts later
                try:
                    claimed = await asyncio.to_thread(
                        claim_webhook_deliveries, self.db, self.owner, free, c.lease_seconds
                    )
                except Exception:
                    log.exception("webhook claim failed", extra={"event": "webhooks.claim_error"})
                for delivery in claimed:
                    task = asyncio.create_task(self._attempt(sender, delivery, claimed_at))
                    self._inflight.add(task)
                    task.add_done_callback(self._done)
            if free <= 0 or len(claimed) < free:  # full, or nothing more is due
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), c.poll_interval)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()

    async def _attempt(
        self, sender: WebhookSender, delivery: ClaimedDelivery, claimed_at: float
    ) -> None:
        c = self.config
        await failpoints.hit_async("webhooks.after_claim", delivery.job_id)
        send_by = claimed_at + c.lease_seconds - c.attempt_timeout - LEASE_MARGIN_SECONDS
        if time.monotonic() > send_by:
            # Another dispatcher may already hold the delivery: do not send.
            result = AttemptResult(
                WebhookOutcome.LOST, error="not sent: the lease ran out before the request"
            )
        else:
            result = await sender.send(delivery.endpoint, delivery.event_id, delivery.body)
            WEBHOOK_ATTEMPT_DURATION.labels(delivery.endpoint).observe(
                (result.latency_ms or 0.0) / 1000.0
            )
            if result.outcome == WebhookOutcome.FAILED:
                result = replace(result, retry_in=c.backoff(delivery.attempt))
        await failpoints.hit_async("webhooks.before_record", delivery.job_id)
        await self._record(delivery, result)

    async def _record(self, delivery: ClaimedDelivery, result: AttemptResult) -> None:
        WEBHOOK_ATTEMPTS.labels(delivery.endpoint, str(result.outcome)).inc()
        try:
            recorded = await asyncio.to_thread(record_webhook_attempt, self.db, delivery, result)
        except Exception:
            # The lease runs out; the next claim marks this attempt lost and retries.
            log.exception("webhook attempt not recorded", extra=_ids(delivery, "record_error"))
            return
        if recorded is None:
            log.warning(
                "webhook claim was taken over; outcome not recorded", extra=_ids(delivery, "fenced")
            )
            return
        status, reason = recorded
        if status in (WebhookStatus.DELIVERED, WebhookStatus.DEAD):
            WEBHOOK_DELIVERIES.labels(delivery.endpoint, str(status), str(reason or "")).inc()
        level = logging.WARNING if status == WebhookStatus.DEAD else logging.INFO
        log.log(
            level,
            "webhook %s %s: %s",
            delivery.endpoint,
            delivery.event_id,
            status,
            extra={
                **_ids(delivery, str(status)),
                "attempt": delivery.attempt,
                "code": result.response_code,
                "error": result.error,
                "reason": reason,
            },
        )

    async def _gauges(self) -> None:
        while True:
            try:
                counts = await asyncio.to_thread(webhook_counts, self.db)
                WEBHOOK_PENDING.set(counts.pending)
                WEBHOOK_DEAD.set(counts.dead)
            except Exception:
                log.exception("webhook gauges failed", extra={"event": "webhooks.gauge_error"})
            await asyncio.sleep(_GAUGE_SECONDS)


def _next_offsets(records: list[Message]) -> list[TopicPartition]:
    """The offset after the last record of each partition: what to commit."""
    last: dict[tuple[str, int], int] = {}
    for record in records:
        key = (str(record.topic()), int(record.partition() or 0))
        last[key] = max(last.get(key, -1), int(record.offset() or 0))
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]


def _ids(delivery: ClaimedDelivery, what: str) -> dict[str, Any]:
    return {
        "event": f"webhooks.{what}",
        "job_id": delivery.job_id,
        "endpoint": delivery.endpoint,
        "event_id": delivery.event_id,
    }
