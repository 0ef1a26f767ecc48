"""``onceflow bench soak``: every process's memory while a million jobs go through
(issue 27, target 6).

``jobs`` (1,000,000 from the CLI's ``--jobs 1000000``) are posted in ten equal rounds,
in batches of 100, through ingest, one streams worker and one engine. The workflow is
``noop-inline-workflow`` (three no-op steps run inline) at engine concurrency 256, the
engine's fastest mode, so that a million jobs take minutes, not an hour, on two cores;
the path through ingest, Kafka, the worker's batches and the engine's claims and
checkpoints is the same as for any workflow. After each round the harness waits until
every instance so far is complete, then reads each process's resident memory (VmRSS)
and its peak (VmHWM) from ``/proc``: memory that grows with the jobs handled, not with
the jobs in flight, shows as RSS rising round after round at the same load. The first
round is the warm-up (pools, prepared statements, the allocator's arenas, imports done
on first use), so the growth is taken from the end of round 1 to the end of the last.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from onceflow.settings import Settings
from onceflow.vocabulary import InstanceStatus
from onceflow_tools.figures import count_instances

ROUNDS = 10
WORKFLOW = "noop-inline-workflow"


def soak(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    from onceflow_tools.bench import _loadgen, _stack, _wait_for, memory_mb

    per_round = max(1, jobs // ROUNDS)
    stack = _stack(base, log_dir, "soak", ONCEFLOW_ENGINE_CONCURRENCY="256")
    assert stack.db is not None and stack.group is not None
    db = stack.db
    rounds: list[dict[str, Any]] = []
    try:
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()
        done = 0
        for n in range(ROUNDS):
            t0 = time.monotonic()
            load = _loadgen(
                stack,
                per_round,
                100,
                4,
                f"soak{n:02d}_",
                log_dir / f"round{n}.json",
                workflow=WORKFLOW,
            )
            done += load["accepted"]
            _wait_for(
                f"round {n + 1}/{ROUNDS}: instances complete",
                lambda: count_instances(db, InstanceStatus.COMPLETE),
                done,
                1800,
            )
            seconds = time.monotonic() - t0
            memory = {name: memory_mb(proc.pid) for name, proc in sorted(stack.group.procs.items())}
            rounds.append(
                {
                    "round": n + 1,
                    "jobs_so_far": done,
                    "complete": count_instances(db, InstanceStatus.COMPLETE),
                    "seconds": seconds,
                    "jobs_per_second": load["accepted"] / seconds if seconds else 0.0,
                    "rss_mb": {name: rss for name, (rss, _) in memory.items()},
                    "hwm_mb": {name: hwm for name, (_, hwm) in memory.items()},
                }
            )
        return {"scenario": "soak", "jobs": jobs, "workflow": WORKFLOW, "rounds": rounds}
    finally:
        stack.close()


def growth(result: dict[str, Any]) -> dict[str, float]:
    """Each process's RSS at the end of the last round minus at the end of the first."""
    first, last = result["rounds"][0]["rss_mb"], result["rounds"][-1]["rss_mb"]
    return {name: last.get(name, 0.0) - mb for name, mb in first.items()}


def render(result: dict[str, Any]) -> list[str]:
    rounds = result["rounds"]
    names = sorted(rounds[0]["rss_mb"]) if rounds else []
    lines = [
        f"soak: {result['jobs']} jobs of {result['workflow']} in {len(rounds)} rounds"
        " (RSS in MB after each round's jobs completed)",
        "  round  jobs so far  complete  jobs/s  " + "  ".join(f"{n:>8}" for n in names),
    ]
    for r in rounds:
        lines.append(
            f"  {r['round']:>5}  {r['jobs_so_far']:>11}  {r['complete']:>8}"
            f"  {r['jobs_per_second']:>6.0f}  "
            + "  ".join(f"{r['rss_mb'][n]:>8.0f}" for n in names)
        )
    if rounds:
        peaks = ", ".join(f"{n} {rounds[-1]['hwm_mb'][n]:.0f}" for n in names)
        change = ", ".join(f"{n} {mb:+.0f}" for n, mb in sorted(growth(result).items()))
        lines.append(f"  peak RSS (VmHWM, MB): {peaks}")
        lines.append(f"  RSS from the end of round 1 to the end of the last (MB): {change}")
    return lines
