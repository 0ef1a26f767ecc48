"""``onceflow bench engine-policies``: what each run control of issue 26 costs.

Each run pre-fills ``jobs`` instances through the worker's own create (the batch insert
with the workflow's policies, as ``streams.records`` builds its deliveries) into a fresh
database, timing it, then runs one engine at concurrency 64 until all are complete:
instances/s created, workflows/s completed, the engine's mean claim (its own
histogram). The plain ``noop-workflow`` and the policy workflows of
:mod:`onceflow_tools.policy_workflows` (each policy set so that it never binds; the
batched one runs its jobs 50 to a batch run, and its workflows/s counts members) are
interleaved, three rounds, so a noisy neighbour hits all of them; each round gives each
policy's ratio to the plain run of the same round. Lifecycle events are off (their cost
is :mod:`onceflow_tools.events_bench`'s), so the figures are the policies' own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click

from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from onceflow.vocabulary import InstanceStatus, JobKind
from onceflow_tools import policy_workflows as pw
from onceflow_tools.bench import _stack, _wait_for
from onceflow_tools.figures import count_instances, run_span_seconds
from onceflow_tools.flowbench import _claim_latency
from onceflow_tools.stack import Stack
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery
from workflow_engine.store import make_engine
from workflow_engine.store.writes import create_instances

PLAIN = "noop-workflow"
#: What each run measures: the plain claim, then one policy each.
WORKFLOWS = (
    PLAIN,
    pw.SINGLETON_QUEUE,
    pw.SINGLETON_SKIP,
    pw.TIME_LIMITS,
    pw.ATTRIBUTES,
    pw.DEBOUNCE,
    pw.ID_REUSE,
    pw.BATCH,
)
_MODULES = '["onceflow_examples", "onceflow_tools.policy_workflows"]'


def _envelope(workflow: str, i: int) -> JobEnvelope:
    params = {"customer": f"c{i}", "step_seconds": 0}  # a key per job: never binds
    if workflow == pw.ATTRIBUTES:
        return JobEnvelope(f"pb{i:07d}", workflow, params, attributes={"tenant": f"t{i % 8}"})
    return JobEnvelope(f"pb{i:07d}", workflow, params)


def _delivery(workflow: str, i: int) -> Delivery:
    """As ``streams.records`` builds it from a record: the workflow's version, lane,
    defaults and singleton policy from the registry."""
    return Delivery(
        _envelope(workflow, i),
        "t",
        0,
        i,
        JobKind.WORKFLOW,
        None,
        REGISTRY.version(workflow),
        lane_path=REGISTRY.lane_path(workflow),
        start_after=REGISTRY.start_after(workflow),
        start_within=REGISTRY.start_within(workflow),
        singleton=REGISTRY.singleton(workflow),
        id_reuse=REGISTRY.id_reuse(workflow),
        batch_key=REGISTRY.batch_key(workflow),
        debounce=REGISTRY.debounce(workflow),
    )


def _fill(stack: Stack, workflow: str, jobs: int) -> float:
    """Create the instances in batches of 500 (the worker's default); seconds taken."""
    assert stack.settings is not None
    db = make_engine(stack.settings.database_url, pool_size=2, lifecycle_events=False)
    try:
        started = time.perf_counter()
        for start in range(0, jobs, 500):
            create_instances(
                db, [_delivery(workflow, i) for i in range(start, min(jobs, start + 500))]
            )
        return time.perf_counter() - started
    finally:
        db.dispose()


def _run(base: Settings, jobs: int, log_dir: Path, workflow: str) -> dict[str, Any]:
    stack = _stack(
        base,
        log_dir,
        f"policy-{workflow[6:14]}",
        ONCEFLOW_ENGINE_CONCURRENCY="64",
        ONCEFLOW_WORKFLOW_MODULES=_MODULES,
        ONCEFLOW_LIFECYCLE_EVENTS="false",
    )
    try:
        fill_seconds = _fill(stack, workflow, jobs)
        port = stack.start_engine("engine-0")
        assert stack.db is not None
        db = stack.db
        # a batched workflow's batch runs complete too, beside its members
        runs = -(-jobs // pw.BATCH_SIZE) if workflow == pw.BATCH else 0
        done = jobs + runs
        _wait_for("complete", lambda: count_instances(db, InstanceStatus.COMPLETE), done, 600)
        span = max(run_span_seconds(db), 1e-3)
        claims, claim_seconds = _claim_latency(port)
        return {
            "workflow": workflow,
            "workflows": jobs,
            "created_per_second": jobs / fill_seconds,
            "per_second": jobs / span,
            "claim_ms": 1000 * claim_seconds / max(claims, 1),
            "load": os.getloadavg()[0],
        }
    finally:
        stack.close()


def engine_policies(
    base: Settings, jobs: int, log_dir: Path, rounds_wanted: int = 3
) -> dict[str, Any]:
    rounds = []
    for n in range(rounds_wanted):
        runs = [_run(base, jobs, log_dir, w) for w in WORKFLOWS]
        click.echo(f"  round {n + 1}: {runs}", err=True)
        rounds.append(runs)
    return {"scenario": "engine-policies", "rounds": rounds}


def render(result: dict[str, Any]) -> list[str]:
    lines = [
        "engine-policies: one engine, concurrency 64, three no-op steps, events off,"
        " runs interleaved; per round: created/s, workflows/s (ratio to plain), claim ms",
    ]
    for n, runs in enumerate(result["rounds"], 1):
        plain = next(r for r in runs if r["workflow"] == PLAIN)
        lines.append(f"  round {n} (load {plain['load']:.1f}):")
        for r in runs:
            lines.append(
                f"    {r['workflow']:<22} {r['created_per_second']:7.0f} created/s"
                f" ({r['created_per_second'] / plain['created_per_second']:.2f})"
                f"  {r['per_second']:6.0f} wf/s ({r['per_second'] / plain['per_second']:.2f})"
                f"  claim {r['claim_ms']:.1f} ms"
            )
    return lines
