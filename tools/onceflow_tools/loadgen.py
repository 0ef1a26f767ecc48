"""A load-generating process: post jobs to ingest as fast as allowed, record latencies.

Run as its own process (``python -m onceflow_tools.loadgen``) so that the client's work does
not share an interpreter with what it measures. Writes a JSON summary: requests,
statuses, accepted job ids count, latency percentiles, wall time.

The client is aiohttp on uvloop: with httpx this process topped out near 100 single-job
requests/s at 16-64 connections (its own CPU, p50 0.1-0.5 s), far below what ingest
answers, so it measured itself (BENCHMARKS.md, "Single-job requests").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import aiohttp
import orjson
import uvloop


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(
    url: str,
    key: str,
    jobs: int,
    batch: int,
    concurrency: int,
    prefix: str,
    rate: float,
    workflow: str = "noop-workflow",
) -> dict:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    accepted = 0
    next_index = 0
    interval = batch / rate if rate > 0 else 0.0
    started = time.perf_counter()

    async def worker(client: aiohttp.ClientSession) -> None:
        nonlocal next_index, accepted
        while next_index < jobs:
            first = next_index
            last = next_index = min(jobs, next_index + batch)  # taken before any await
            if interval:  # open-loop pacing for a target offered load
                due = started + (first / batch) * interval
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            body = {
                "jobs": [
                    {
                        "job_id": f"{prefix}{i:07d}",
                        "workflow": workflow,
                        "params": {"step_seconds": 0},
                    }
                    for i in range(first, last)
                ]
            }
            for _ in range(100):  # 429/503 are answered with Retry-After: honour them
                t0 = time.perf_counter()
                async with client.post("/v1/jobs", data=orjson.dumps(body)) as response:
                    answer = await response.read()
                latencies.append(time.perf_counter() - t0)
                statuses[response.status] = statuses.get(response.status, 0) + 1
                if response.status == 202:
                    accepted += len(orjson.loads(answer)["accepted"])
                    break
                if response.status not in (429, 503):
                    break
                await asyncio.sleep(float(response.headers.get("retry-after", "1")))

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        base_url=url,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=60),
        connector=aiohttp.TCPConnector(limit=concurrency),
    ) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {
        "jobs": jobs,
        "batch": batch,
        "concurrency": concurrency,
        "rate": rate,
        "wall_seconds": wall,
        "accepted": accepted,
        "accepted_per_second": accepted / wall if wall else 0.0,
        "requests": len(latencies),
        "statuses": statuses,
        "latency_p50": percentile(latencies, 0.50),
        "latency_p99": percentile(latencies, 0.99),
        "latency_max": max(latencies, default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument(
        "--key",
        default=os.environ.get("ONCEFLOW_LOADGEN_KEY", ""),
        help="API key (default: $ONCEFLOW_LOADGEN_KEY, kept out of ps)",
    )
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefix", default="load_")
    parser.add_argument("--rate", type=float, default=0.0, help="offered jobs/s (0: flat out)")
    parser.add_argument("--workflow", default="noop-workflow")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    summary = uvloop.run(
        run(
            args.url,
            args.key,
            args.jobs,
            args.batch,
            args.concurrency,
            args.prefix,
            args.rate,
            args.workflow,
        )
    )
    args.out.write_bytes(orjson.dumps(summary, option=orjson.OPT_NON_STR_KEYS))


if __name__ == "__main__":
    main()
