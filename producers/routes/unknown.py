"""The answer about a job id that has no instance or task run: 410 when its record was
dead-lettered (why and where), else 404 with how far the queue is behind (it may still
be on its way). ``GET /v1/jobs/{job_id}`` and ``GET /v1/jobs/{job_id}/result`` share it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from fastapi import HTTPException
from sqlalchemy.engine import Engine

from onceflow.settings import Settings
from producers.deps import Ingest
from workflow_engine.store.views import DeadLetterView, dead_letters_for


def not_found(ingest: Ingest, db: Engine, job_id: str) -> NoReturn:
    """The 410 of a dead-lettered job id, else the 404 with the queue's lag."""
    dead = dead_letters_for(db, job_id)
    if dead:
        raise HTTPException(410, _dead_lettered(job_id, dead))
    try:
        lag: dict[str, Any] = queue_lag(ingest.settings, job_id)
    except Exception as exc:  # Kafka down: still answer the question we can
        lag = {"error": str(exc)}
    raise HTTPException(
        404,
        {
            "error": "not_found",
            "job_id": job_id,
            "message": "no instance or task run with this job id (yet): if it was accepted,"
            " it is still in the queue behind consumer_lag records; retry later",
            "consumer_lag": lag,
        },
    )


def _dead_lettered(job_id: str, dead: list[DeadLetterView]) -> dict[str, Any]:
    """The 410 body: the same shape as the 404's, with every dead letter of the id
    (reason code, detail, source position, dead-letter topic position)."""
    last = dead[-1]
    return {
        "error": "dead_lettered",
        "job_id": job_id,
        "message": f"the record of this job id was dead-lettered ({last.reason}:"
        f" {last.detail}) from {last.source} to {last.dlq}; it has no instance and will"
        " not get one from that record: fix it and resubmit",
        "dead_letters": [d.to_dict() for d in dead],
    }


def queue_lag(settings: Settings, job_id: str) -> dict[str, Any]:
    """The streams workers' lag in total and on the partition this job id lands on."""
    from onceflow.lag import consumer_lag
    from onceflow.partitioning import partition_for

    lags = consumer_lag(
        settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic, timeout=5.0
    )
    partition = partition_for(job_id, len(lags)) if lags else None
    return {
        "total": sum(p.lag for p in lags),
        "partition": partition,
        "partition_lag": next((p.lag for p in lags if p.partition == partition), None),
    }
