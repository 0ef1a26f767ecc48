"""The agent: consume job records in batches and create one instance per job id.

``register(app, settings)`` declares the jobs topic on the app and attaches the agent;
the agent's body is an :class:`InstanceCreator` holding the settings it was given and
the :class:`~streams.batch.BatchHandler` it feeds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, cast

import faust
from confluent_kafka import Producer
from faust.types import AgentT, EventT, StreamT

from onceflow.envelope import KafkaHeaders
from onceflow.kafka_producer import idempotent_producer_config
from onceflow.settings import Settings
from streams.batch import BatchHandler, StoppedRetrying
from streams.gather import batches
from streams.records import RawRecord
from streams.topics import jobs_topic
from workflow_engine.definitions import load_workflow_modules
from workflow_engine.store import make_engine

log = logging.getLogger(__name__)

#: The agent's name (faust's default would be the qualified name of its function).
AGENT_NAME = "streams.agents.create_instances"


def register(app: faust.App, settings: Settings) -> AgentT:
    """Declare the jobs topic on ``app`` and attach the agent that consumes it."""
    creator = InstanceCreator(settings, stopped=app.wait_until_stopped)
    agent: AgentT = app.agent(jobs_topic(app, settings), name=AGENT_NAME, concurrency=1)(
        creator.consume
    )
    return agent


class InstanceCreator:
    def __init__(
        self, settings: Settings, stopped: Callable[[], Awaitable[Any]] | None = None
    ) -> None:
        self.settings = settings
        #: Returns once the app is stopping (faust's ``App.wait_until_stopped``).
        self._stopped = stopped
        self._handler: BatchHandler | None = None
        self._inflight: asyncio.Future[Any] | None = None  # the batch being handled

    def handler(self) -> BatchHandler:
        """The batch handler, built on first use: inside the running worker, not when
        the agent is registered."""
        if self._handler is None:
            self._handler = _build_handler(self.settings)
        return self._handler

    async def consume(self, stream: StreamT) -> None:
        """One batch at a time; a batch's records are acked only after handle() returned.

        The batches (:mod:`streams.gather`) are taken as soon as nothing more is queued.
        Like faust-streaming's ``take_events``, they ack the batch in a ``finally`` even
        when the body raises or is
        cancelled, so the body never raises, and a cancellation (shutdown, rebalance)
        waits for the in-flight database work; if that cannot finish within the grace
        period the process exits at once *without* committing, which is always safe.
        (The agent runs with ``concurrency=1``: see faust-streaming #606.)
        """
        work = self.handler()
        watch = asyncio.ensure_future(self._keep_the_grace(work)) if self._stopped else None
        taken = batches(
            cast(faust.Stream, stream),
            self.settings.streams_batch_size,
            self.settings.streams_batch_within_seconds,
        )
        try:
            async for events in taken:
                await self._handle(work, [_raw_record(e) for e in events])
        except Exception:
            # Never expected (the body does not raise). faust would restart the agent
            # on this same stream, past records gathered but never handled: exit
            # instead, committing nothing, so they are redelivered.
            _exit_without_commit("the agent's batches failed; exiting without committing", True)
        finally:
            await taken.aclose()
            if watch is not None:
                watch.cancel()

    async def _keep_the_grace(self, work: BatchHandler) -> None:
        """Stop within the shutdown grace, whatever the database does.

        On SIGTERM faust first waits, with no time limit, for every record in flight to
        be acked (``Consumer.wait_empty``), and only then cancels this agent: a batch
        retrying an unreachable database kept the worker alive until it was killed. So
        once the app is stopping, the batch stops retrying (the transaction under way
        may still commit), and if it has not finished within the grace the process
        exits without committing."""
        assert self._stopped is not None
        await self._stopped()
        work.stop_retrying()
        task = self._inflight
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=self.settings.streams_shutdown_grace_seconds)
        if not done:
            _exit_without_commit(
                "in-flight batch did not commit within the shutdown grace;"
                " exiting without committing offsets"
            )

    async def _handle(self, work: BatchHandler, records: list[RawRecord]) -> None:
        task = self._inflight = asyncio.ensure_future(work.handle(records))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await self._finish_or_exit(task)
            raise
        except StoppedRetrying as stopped:
            # Stopping while the database could not take the batch: it is not acked,
            # so its records are redelivered to whoever takes the partition next.
            _exit_without_commit(f"{stopped}; exiting without committing offsets")
        except Exception:
            # handle() retries database outages forever and dead-letters bad records,
            # so this is a bug: stop without acking rather than lose the batch.
            _exit_without_commit(
                "batch handler failed; exiting without committing offsets", exc_info=True
            )

    async def _finish_or_exit(self, task: asyncio.Future[Any]) -> None:
        """Cancelled: give the in-flight batch the grace period to commit, or exit."""
        try:
            await asyncio.wait_for(
                asyncio.shield(task), self.settings.streams_shutdown_grace_seconds
            )
        except BaseException:
            _exit_without_commit(
                "in-flight batch did not commit before shutdown; exiting without committing offsets"
            )


def _build_handler(settings: Settings) -> BatchHandler:
    registry = load_workflow_modules(settings.workflow_modules)
    db = make_engine(
        settings.database_url,
        pool_size=settings.streams_concurrency + 1,
        lifecycle_events=settings.lifecycle_events,
    )
    return BatchHandler(settings, db, lambda: dlq_producer(settings), registry)


def dlq_producer(settings: Settings) -> Producer:
    """The dead-letter producer: its record limit is the topics' (README, "The record
    format"); the writer keeps each letter under it."""
    return Producer(
        idempotent_producer_config(
            settings.kafka_bootstrap_servers,
            "onceflow-streams-dlq",
            max_message_bytes=settings.kafka_max_message_bytes,
        )
    )


def _raw_record(event: EventT) -> RawRecord:
    m = event.message
    return RawRecord(
        m.topic, m.partition, m.offset, m.key, m.value, _headers(m.headers), m.timestamp
    )


def _headers(raw: Any) -> KafkaHeaders:
    if not raw:
        return []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(str(k), bytes(v or b"")) for k, v in items]


def _exit_without_commit(message: str, exc_info: bool = False) -> NoReturn:
    """Stop at once: faust would otherwise ack (and later commit) the batch."""
    log.critical(message, exc_info=exc_info, extra={"event": "streams.hard_exit"})
    logging.shutdown()
    os._exit(70)
