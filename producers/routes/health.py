"""``/healthz`` (the process answers) and ``/readyz`` (Kafka answers), on the API port.

The metrics port serves its own pair (``onceflow.health``) for orchestrators.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from producers.deps import IngestDep
from producers.models import ErrorBody
from producers.responses import error_response, json_response

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(ingest: IngestDep) -> Response:
    """Ready when Kafka is: PostgreSQL is not asked (the queue exists for its outages)."""
    if await asyncio.to_thread(ingest.sender().ready):
        return json_response({"kafka": "ok"}, 200)
    body = ErrorBody(
        error="not_ready",
        message="Kafka is unavailable",
        details={"kafka": "unavailable"},
    )
    return error_response(503, body, count=False)
