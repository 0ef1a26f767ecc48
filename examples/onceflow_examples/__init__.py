"""onceflow's sample workflows, used by the demo, the benchmarks and the tests.

Opt-in: list ``onceflow_examples`` in ``ONCEFLOW_WORKFLOW_MODULES`` and apply its
migrations with ``onceflow migrate --with onceflow_examples`` (its tables are not
part of the product schema). ``MIGRATIONS`` below tells the migrator where they are.

The sample ``order-workflow``:

Each step performs a pretend side effect by writing one row per *execution* to
``onceflow_demo_side_effects`` (no unique constraint there), so a step that ran twice
would show as two rows: the demo's "exactly one side effect per step" check can fail.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.settings import get_settings
from workflow_engine.definitions import Context, RetryPolicy, task, workflow
from workflow_engine.errors import EventTimeout
from workflow_engine.model import Batch, Debounce, Singleton
from workflow_engine.steps import current_step
from workflow_engine.store import MigrationSet, shared_engine

#: The examples' own tables, migrated and granted separately from the product's.
MIGRATIONS = MigrationSet(
    name="onceflow_examples",
    package="onceflow_examples.migrations",
    table="onceflow_examples_migrations",
    tables=("onceflow_demo_side_effects", "onceflow_demo_applied_effects"),
)

ORDER_STEPS = ("charge payment", "reserve stock", "ship")

# Short delays so the demo finishes fast; real workflows keep the defaults.
DEMO_RETRY = RetryPolicy(limit=3, delay=0.2, backoff="exponential")


class TransientError(Exception):
    """A failure worth retrying (the sample's flaky warehouse)."""


def _record_side_effect(params: dict[str, Any]) -> dict[str, Any]:
    step = current_step()
    time.sleep(float(params.get("step_seconds", 0.05)))
    if params.get("flaky") and step.name == "reserve stock" and step.attempt == 1:
        raise TransientError("warehouse timed out")
    db = shared_engine(get_settings().database_url)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_demo_side_effects (job_id, step, idempotency_key,"
                " performed_by) VALUES (:j, :s, :k, :b)"
            ),
            {"j": step.job_id, "s": step.name, "k": step.idempotency_key, "b": str(step.attempt)},
        )
        # The "external system" dedupes by the idempotency key, as real ones should.
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_demo_applied_effects (idempotency_key, job_id, step)"
                " VALUES (:k, :j, :s) ON CONFLICT ON CONSTRAINT"
                " onceflow_demo_applied_effects_pkey DO UPDATE"
                " SET executions = onceflow_demo_applied_effects.executions + 1"
            ),
            {"j": step.job_id, "s": step.name, "k": step.idempotency_key},
        )
    return {"step": step.name, "key": step.idempotency_key}


@workflow("order-workflow")
async def order_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    receipt = await ctx.step("charge payment", _record_side_effect, params, retries=DEMO_RETRY)
    await ctx.step("reserve stock", _record_side_effect, params, retries=DEMO_RETRY)
    shipment = await ctx.step("ship", _record_side_effect, params, retries=DEMO_RETRY)
    return {"receipt": receipt["key"], "shipment": shipment["key"]}


def _noop(n: int) -> dict[str, int]:
    return {"step": n}


@workflow("noop-workflow")
async def noop_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Three durable steps that do nothing: what the engine benchmark measures (the
    engine's own cost per step, as DBOS's benchmark counterpart does)."""
    for n in range(3):
        await ctx.step(f"step {n + 1}", _noop, n)
    return {"steps": 3}


@workflow("noop-inline-workflow", inline_steps=True)
async def noop_inline_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """``noop-workflow`` with its sync steps run on the engine's event loop (no thread
    hop): what a workflow of quick steps gains by opting in."""
    for n in range(3):
        await ctx.step(f"step {n + 1}", _noop, n)
    return {"steps": 3}


def _pause(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@workflow("deadline-demo-workflow", execution_timeout=1.0)
async def deadline_demo_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Three steps of ``step_seconds`` each under a 1 s ``execution_timeout`` (README,
    "Time limits"): with 0.6 s steps the third never starts, the instance is errored
    ``timed_out`` at that step boundary; with short ones it completes."""
    seconds = float(params.get("step_seconds", 0))
    for n in range(3):
        await ctx.step(f"part {n + 1}", _pause, seconds)
    return {"parts": 3}


@workflow("approval-workflow")
async def approval_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Waits (durably, holding no worker) for an 'approved' event, or times out."""
    await ctx.step("request approval", _record_side_effect, params, retries=DEMO_RETRY)
    try:
        decision = await ctx.wait_for_event(
            "approval", type="approved", timeout=float(params.get("timeout_seconds", 86400))
        )
    except EventTimeout:
        await ctx.step("cancel", _record_side_effect, params, retries=DEMO_RETRY)
        return {"approved": False}
    await ctx.step("fulfil", _record_side_effect, params, retries=DEMO_RETRY)
    return {"approved": True, "by": (decision or {}).get("by")}


# One example per run control (README, "Flow control"), small enough for the demo and
# the dashboard test to show each decision.


@workflow("report-workflow", singleton=Singleton(key="params.account", mode="skip"))
async def report_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """One report per account at a time: a job of an account whose report is still live
    is recorded ``skipped``, naming it."""
    await ctx.step("build report", _pause, float(params.get("step_seconds", 0)))
    return {"account": params.get("account")}


@workflow("reindex-workflow", debounce=Debounce(key="params.index", period=0.5, max_wait=5.0))
async def reindex_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """A burst of reindex requests for one index becomes one run, the last one's, 0.5 s
    after the burst (never more than 5 s after its first); the others are ``debounced``."""
    await ctx.step("reindex", _pause, 0.0)
    return {"index": params.get("index")}


@workflow("digest-workflow", batch=Batch(max_size=10, max_wait=0.5, key="params.tenant"))
async def digest_workflow(ctx: Context, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Up to 10 jobs of one tenant in one run (or whatever came within 0.5 s), one
    result per member, in member order."""
    members = params["members"]
    await ctx.step("send digest", _pause, 0.0)
    return [{"sent": m["job_id"], "of": len(members)} for m in members]


class CardDeclined(Exception):
    """``payment-workflow``'s failure (params ``{"decline": true}``)."""


def _charge(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("decline"):
        raise CardDeclined("card declined")
    return {"charged": params.get("amount", 0)}


@workflow("payment-workflow", id_reuse="after_failure")
async def payment_workflow(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """A payment whose failed run may be submitted again under the same job id: a new
    run (run 2, the first one's history kept). A completed one stays a duplicate."""
    return await ctx.step("charge", _charge, params, retries=RetryPolicy(limit=1))


class MailServerDown(Exception):
    """The sample task's failure (params ``{"fail": true}`` makes it permanent)."""


@task("send-welcome-email", max_retries=2, delay=0.1)
def send_welcome_email(params: dict[str, Any]) -> dict[str, Any]:
    """A single-step job: no workflow, just the queue's retries and a dead-letter topic."""
    if params.get("fail"):
        raise MailServerDown("mail server refused the connection")
    db = shared_engine(get_settings().database_url)
    key = f"{params.get('job_id', '')}:send-welcome-email"
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_demo_side_effects (job_id, step, idempotency_key,"
                " performed_by) VALUES (:j, 'send-welcome-email', :k, 'streams')"
            ),
            {"j": params.get("job_id", ""), "k": key},
        )
    return {"sent_to": params.get("email")}


# --- reading the samples' own tables (the demo's and the chaos run's proof) ----------


@dataclass(frozen=True, slots=True)
class EffectCounts:
    """Side effects per (job id, step) in one of the samples' tables."""

    rows: int  # rows in the table
    per_step: Mapping[tuple[str, str], int]  # (job id, step) -> rows
    re_executions: int = 0  # executions beyond the first (applied effects only)

    def not_exactly_once(self, job_ids: Iterable[str], steps: Sequence[str] = ORDER_STEPS) -> int:
        """How many (job id, step) pairs of ``job_ids`` x ``steps`` have not exactly one row."""
        return sum(1 for j in job_ids for s in steps if self.per_step.get((j, s), 0) != 1)


def side_effect_counts(db: Engine) -> EffectCounts:
    """Every execution of a side effect (``onceflow_demo_side_effects``): a step that
    ran twice shows as two rows."""
    with db.connect() as conn:
        per_step = {
            (j, s): int(n)
            for j, s, n in conn.execute(
                sa.text(
                    "SELECT job_id, step, count(*) FROM onceflow_demo_side_effects GROUP BY 1, 2"
                )
            )
        }
    return EffectCounts(sum(per_step.values()), per_step)


def applied_effect_counts(db: Engine) -> EffectCounts:
    """What the idempotent "external system" applied (``onceflow_demo_applied_effects``):
    one row per idempotency key, with how many times it was asked to apply it."""
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT job_id, step, count(*), coalesce(sum(executions - 1), 0)"
                " FROM onceflow_demo_applied_effects GROUP BY 1, 2"
            )
        ).all()
    per_step = {(j, s): int(n) for j, s, n, _ in rows}
    return EffectCounts(sum(per_step.values()), per_step, sum(int(r) for *_, r in rows))


# The fan-out sample (child workflows), registered with the others.
from onceflow_examples import checkout as checkout  # noqa: E402
