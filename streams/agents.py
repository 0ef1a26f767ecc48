"""The agent: consume job records in batches and create one instance per job id."""

from __future__ import annotations

import asyncio
import logging
import os
from functools import lru_cache
from typing import Any

from confluent_kafka import Producer

from onceflow.core.envelope import KafkaHeaders
from streams.app import app, settings
from streams.batch import BatchHandler
from streams.records import RawRecord
from streams.topics import jobs_topic
from workflow_engine.definitions import load_workflow_modules
from workflow_engine.store.db import make_engine

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def handler() -> BatchHandler:
    # Registered names decide what a record is: a workflow, a task, or a dead letter.
    load_workflow_modules(settings.workflow_modules)
    engine = make_engine(settings.database_url, pool_size=settings.streams_concurrency + 1)
    dlq = Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "client.id": "onceflow-streams-dlq",
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
        }
    )
    return BatchHandler(settings, engine, dlq)


def _headers(raw: Any) -> KafkaHeaders:
    if not raw:
        return []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(str(k), bytes(v or b"")) for k, v in items]


@app.agent(jobs_topic, concurrency=1)
async def create_instances(stream):
    """One batch at a time; faust acks a batch's records only after handle() returned.

    faust-streaming acks the batch in a ``finally`` even when the body raises or is
    cancelled, so the body never raises, and a cancellation (shutdown, rebalance) waits
    for the in-flight database work; if that cannot finish within the grace period the
    process exits at once *without* committing, which is always safe.
    """
    work = handler()
    async for events in stream.take_events(
        settings.streams_batch_size, within=settings.streams_batch_within_seconds
    ):
        records = [
            RawRecord(
                e.message.topic,
                e.message.partition,
                e.message.offset,
                e.message.key,
                e.message.value,
                _headers(e.message.headers),
                e.message.timestamp,
            )
            for e in events
        ]
        task = asyncio.ensure_future(work.handle(records))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            try:
                await asyncio.wait_for(
                    asyncio.shield(task), settings.streams_shutdown_grace_seconds
                )
            except BaseException:
                log.critical(
                    "in-flight batch did not commit before shutdown; exiting without"
                    " committing offsets",
                    extra={"event": "streams.hard_exit"},
                )
                logging.shutdown()
                os._exit(70)
            raise
        except Exception:
            # handle() retries database outages forever and dead-letters bad records,
            # so this is a bug: stop without acking rather than lose the batch.
            log.critical(
                "batch handler failed; exiting without committing offsets",
                exc_info=True,
                extra={"event": "streams.hard_exit"},
            )
            logging.shutdown()
            os._exit(70)
