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
from typing import Any

import sqlalchemy as sa

from onceflow.core.settings import get_settings
from workflow_engine.definitions import RetryPolicy, task, workflow
from workflow_engine.errors import EventTimeout
from workflow_engine.steps import current_step
from workflow_engine.store.db import shared_engine
from workflow_engine.store.schema import MigrationSet

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
    engine = shared_engine(get_settings().database_url)
    with engine.begin() as conn:
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
async def order_workflow(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    receipt = await ctx.step("charge payment", _record_side_effect, params, retries=DEMO_RETRY)
    await ctx.step("reserve stock", _record_side_effect, params, retries=DEMO_RETRY)
    shipment = await ctx.step("ship", _record_side_effect, params, retries=DEMO_RETRY)
    return {"receipt": receipt["key"], "shipment": shipment["key"]}


def _noop(n: int) -> dict[str, int]:
    return {"step": n}


@workflow("noop-workflow")
async def noop_workflow(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Three durable steps that do nothing: what the engine benchmark measures (the
    engine's own cost per step, as DBOS's benchmark counterpart does)."""
    for n in range(3):
        await ctx.step(f"step {n + 1}", _noop, n)
    return {"steps": 3}


@workflow("approval-workflow")
async def approval_workflow(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
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


class MailServerDown(Exception):
    """The sample task's failure (params ``{"fail": true}`` makes it permanent)."""


@task("send-welcome-email", max_retries=2, delay=0.1)
def send_welcome_email(params: dict[str, Any]) -> dict[str, Any]:
    """A single-step job: no workflow, just the queue's retries and a dead-letter topic."""
    if params.get("fail"):
        raise MailServerDown("mail server refused the connection")
    engine = shared_engine(get_settings().database_url)
    key = f"{params.get('job_id', '')}:send-welcome-email"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_demo_side_effects (job_id, step, idempotency_key,"
                " performed_by) VALUES (:j, 'send-welcome-email', :k, 'streams')"
            ),
            {"j": params.get("job_id", ""), "k": key},
        )
    return {"sent_to": params.get("email")}
