"""The no-buffer baseline: an HTTP service that writes each job straight into PostgreSQL.

This is the design onceflow's README warns against: the request handler holds a pooled
database connection for the length of an INSERT and its synchronous commit, so a burst of
requests is absorbed by the connection pool, not by a log. When the pool runs dry,
requests wait ``pool_timeout`` seconds and are then refused with 503 and ``Retry-After``.
The benchmarks drive it with the same load generator as onceflow's ingest.

It is written fairly, as a careful team would write it: it speaks ingest's HTTP shape
(``POST /v1/jobs``, one job or ``{"jobs": [...]}``, validated by ingest's own parser), it
keeps a bounded connection pool, and it writes a whole request with ONE statement in ONE
transaction (``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING``). Resubmitting
an id is idempotent: the id is answered as accepted and also listed in ``duplicates``.
The Authorization header is accepted and ignored. Run it with
``python -m onceflow_tools.baselines.direct_http --database-url postgresql://...``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool

from onceflow.ids import new_job_id
from producers.models import JobIn, RequestError, parse_jobs
from workflow_engine.store import sqlalchemy_url

MAX_BATCH = 1000
MAX_PARAMS_BYTES = 65536
MAX_BODY_BYTES = 4 * 1024 * 1024

CREATE_TABLE = text(
    """CREATE TABLE IF NOT EXISTS onceflow_baseline_jobs (
        job_id text PRIMARY KEY,
        workflow text NOT NULL,
        params jsonb NOT NULL,
        status text NOT NULL DEFAULT 'queued',
        created_at timestamptz NOT NULL DEFAULT now())"""
)
INSERT_JOBS = text(
    """INSERT INTO onceflow_baseline_jobs (job_id, workflow, params)
    SELECT j, w, p::jsonb
    FROM unnest(CAST(:ids AS text[]), CAST(:workflows AS text[]), CAST(:params AS text[]))
        AS t(j, w, p)
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id"""
)


def _json(body: object, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def insert_jobs(db: Engine, jobs: list[JobIn]) -> tuple[list[str], list[str]]:
    """Insert the jobs in one statement and one transaction: (all ids, ids already there)."""
    unique: dict[str, JobIn] = {}
    for job in jobs:  # the same id twice in one request: written once, first wins
        unique.setdefault(job.job_id or new_job_id(), job)
    ids = list(unique)
    with db.begin() as conn:  # waits up to pool_timeout for a pooled connection
        inserted = set(
            conn.execute(
                INSERT_JOBS,
                {
                    "ids": ids,
                    "workflows": [job.workflow for job in unique.values()],
                    "params": [orjson.dumps(job.params).decode() for job in unique.values()],
                },
            ).scalars()
        )
    return ids, [job_id for job_id in ids if job_id not in inserted]


def stored_jobs(db: Engine, id_prefix: str) -> int:
    """Jobs the baseline stored whose id starts with ``id_prefix`` (its own table)."""
    with db.connect() as conn:
        n = conn.execute(
            text("SELECT count(*) FROM onceflow_baseline_jobs WHERE starts_with(job_id, :p)"),
            {"p": id_prefix},
        ).scalar()
    return int(n or 0)


def create_app(database_url: str, pool_size: int, pool_timeout: float) -> FastAPI:
    # psycopg2, as the rest of onceflow. No pool_pre_ping: a dead connection costs one 503
    # (the pool is then invalidated and refilled), not a round trip on every request.
    db = create_engine(
        sqlalchemy_url(database_url), pool_size=pool_size, max_overflow=0, pool_timeout=pool_timeout
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with db.begin() as conn:
            conn.execute(CREATE_TABLE)
        yield
        db.dispose()

    app = FastAPI(title="onceflow no-buffer baseline", lifespan=lifespan)

    @app.post("/v1/jobs", status_code=202)
    async def submit(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return _json({"error": "body_too_large", "message": "send fewer jobs"}, 413)
        try:
            jobs = parse_jobs(body, MAX_BATCH, MAX_PARAMS_BYTES)
        except RequestError as exc:
            return _json(exc.body.model_dump(), exc.status, exc.headers)
        try:  # blocking DB work on the threadpool, as a sync FastAPI endpoint would run it
            ids, duplicates = await run_in_threadpool(insert_jobs, db, jobs)
        except (PoolTimeout, OperationalError, InterfaceError) as exc:
            reason = "pool_timeout" if isinstance(exc, PoolTimeout) else "database_unavailable"
            message = str(exc).splitlines()[0]
            return _json({"error": reason, "message": message}, 503, {"Retry-After": "1"})
        accepted = [{"job_id": job_id} for job_id in ids]
        return _json({"accepted": accepted, "duplicates": duplicates}, 202)

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("ONCEFLOW_DATABASE_URL"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18099)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--pool-timeout", type=float, default=5.0)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url (or $ONCEFLOW_DATABASE_URL) is required")
    app = create_app(args.database_url, args.pool_size, args.pool_timeout)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
