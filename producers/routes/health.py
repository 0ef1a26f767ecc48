"""``/healthz`` (the process answers) and ``/readyz`` (Kafka answers), on the API port.

The metrics port serves its own pair (``onceflow.core.health``) for orchestrators.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from producers.deps import IngestDep
from producers.responses import json_response

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(ingest: IngestDep) -> Response:
    ok = await asyncio.to_thread(ingest.sender().ready)
    return json_response({"kafka": "ok" if ok else "unavailable"}, 200 if ok else 503)
