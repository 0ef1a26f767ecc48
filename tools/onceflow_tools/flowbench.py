"""``onceflow bench engine-flow-control``: what flow control costs, and what fairness buys.

* **cost**: three-step no-op workflows completed per second by one engine (concurrency
  64) from a pre-filled table: ``noop-workflow`` (the plain claim) against
  ``bench-flow-workflow`` (per-key limit, rate limit, fairness, mixed priorities; none
  of the limits binds, so the difference is the flow-controlled claim's own cost).
* **fairness**: a burst of ``--jobs`` instances for tenant "big", then ONE job for
  tenant "small": the small job's submit -> first step, with fairness
  (``bench-flow-workflow``) and without (``noop-workflow``, FIFO), and alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx

from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from onceflow.vocabulary import InstanceStatus
from onceflow_tools import flow_workflows
from onceflow_tools.bench import _stack, _wait_for
from onceflow_tools.figures import count_instances, run_span_seconds, submit_to_first_step_seconds
from onceflow_tools.stack import Stack
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances

PLAIN = "noop-workflow"
FLOW = flow_workflows.NAME
_MODULES = '["onceflow_examples", "onceflow_tools.flow_workflows"]'


def _params(i: int) -> dict[str, Any]:
    return {
        "customer": f"c{i % flow_workflows.CUSTOMERS}",
        "tenant": f"t{i % flow_workflows.TENANTS}",
    }


def _fill(stack: Stack, workflow: str, ids: list[str], params: list[dict[str, Any]]) -> None:
    """Create queued instances as the streams worker would (priorities 1-5 mixed)."""
    assert stack.db is not None
    lane = REGISTRY.lane_path(workflow)
    for start in range(0, len(ids), 1000):
        create_instances(
            stack.db,
            [
                Delivery(
                    JobEnvelope(ids[i], workflow, params[i], priority=1 + i % 5),
                    "t",
                    0,
                    i,
                    lane_path=lane,
                )
                for i in range(start, min(len(ids), start + 1000))
            ],
        )


def _bench_stack(base: Settings, log_dir: Path, name: str) -> Stack:
    return _stack(
        base,
        log_dir,
        name,
        ONCEFLOW_ENGINE_CONCURRENCY="64",
        ONCEFLOW_WORKFLOW_MODULES=_MODULES,
    )


def _throughput(base: Settings, jobs: int, log_dir: Path, workflow: str) -> dict[str, Any]:
    stack = _bench_stack(base, log_dir, f"flowcost-{workflow[:5]}")
    try:
        ids = [f"fc{i:07d}" for i in range(jobs)]
        _fill(stack, workflow, ids, [_params(i) for i in range(jobs)])
        port = stack.start_engine("engine-0")
        assert stack.db is not None
        db = stack.db
        _wait_for("complete", lambda: count_instances(db, InstanceStatus.COMPLETE), jobs, 600)
        span = max(run_span_seconds(db), 1e-3)
        claims, claim_seconds = _claim_latency(port)
        return {
            "workflow": workflow,
            "workflows": jobs,
            "seconds": span,
            "per_second": jobs / span,
            "claims": claims,
            "claim_ms": 1000 * claim_seconds / max(claims, 1),
        }
    finally:
        stack.close()


def _claim_latency(port: int) -> tuple[int, float]:
    """The engine's claim count and total claim time (its own histogram)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        for part in found:
            if line.startswith(f"onceflow_engine_claim_latency_seconds_{part} "):
                found[part] = float(line.split()[1])
    return int(found["count"]), found["sum"]


def _small_tenant(base: Settings, burst: int, log_dir: Path, workflow: str) -> dict[str, Any]:
    """Seconds from the small tenant's submission to its first step, behind ``burst``."""
    stack = _bench_stack(base, log_dir, f"flowfair-{workflow[:5]}-{burst}")
    try:
        stack.start_engine("engine-0")
        ids = [f"big{i:07d}" for i in range(burst)]
        big = [{"customer": f"c{i % 64}", "tenant": "big"} for i in range(burst)]
        _fill(stack, workflow, ids, big)
        _fill(stack, workflow, ["small"], [{"customer": "s", "tenant": "small"}])
        assert stack.db is not None
        db = stack.db
        deadline = time.monotonic() + 600
        while (took := submit_to_first_step_seconds(db, "small")) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the small tenant's job never started")
            time.sleep(0.05)
        done = count_instances(db, InstanceStatus.COMPLETE)
        return {"workflow": workflow, "burst": burst, "seconds": took, "big_done_before": done}
    finally:
        stack.close()


def engine_flow_control(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    # Alternated, three times: on a shared machine the load drifts between runs.
    cost = [_throughput(base, jobs, log_dir, w) for _ in range(3) for w in (PLAIN, FLOW)]
    click.echo(f"  cost: {cost}", err=True)
    fairness = [
        _small_tenant(base, burst, log_dir, w) for w in (FLOW, PLAIN) for burst in (0, jobs)
    ]
    return {"scenario": "engine-flow-control", "cost": cost, "fairness": fairness}


def render(result: dict[str, Any]) -> list[str]:
    def rates(workflow: str, field: str = "per_second") -> list[float]:
        return [r[field] for r in result["cost"] if r["workflow"] == workflow]

    plain, flow = rates(PLAIN), rates(FLOW)
    plain_ms, flow_ms = rates(PLAIN, "claim_ms"), rates(FLOW, "claim_ms")
    ratio = (sum(flow) / len(flow)) / (sum(plain) / len(plain))
    lines = [
        "engine-flow-control: one engine, concurrency 64, three no-op steps, runs alternated",
        f"  plain claim ({PLAIN}): {' / '.join(f'{r:.0f}' for r in plain)} workflows/s",
        f"  all limits on ({FLOW}): {' / '.join(f'{r:.0f}' for r in flow)} workflows/s",
        f"  mean cost of flow control: {(1 - ratio) * 100:.1f}% fewer workflows/s",
        f"  mean claim: plain {' / '.join(f'{m:.1f}' for m in plain_ms)} ms,"
        f" flow control {' / '.join(f'{m:.1f}' for m in flow_ms)} ms",
        "  small tenant's submit -> first step, behind a burst of the big tenant:",
    ]
    for r in result["fairness"]:
        kind = "fairness" if r["workflow"] == FLOW else "FIFO"
        lines.append(
            f"    {kind:<8} burst {r['burst']:>7}: {r['seconds'] * 1000:8.0f} ms"
            f" ({r['big_done_before']} instances complete by then)"
        )
    return lines
