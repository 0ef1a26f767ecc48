"""Flow control declared on a workflow: per-key concurrency, rate limits, fairness.

    from datetime import timedelta
    from workflow_engine import RateLimit, workflow

    @workflow(
        "charge-workflow",
        concurrency_key="params.customer_id", max_per_key=1,
        rate_limit=RateLimit(limit=100, period=timedelta(seconds=1), key="params.tenant"),
        fairness_key="params.tenant",
    )
    async def charge(ctx, params): ...

The engine enforces it when it claims (:mod:`workflow_engine.store.flow`), against the
database, so any number of engines respect it together. Priority is not declared here:
it is a property of each job (``priority`` 1-5 in its submission).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from workflow_engine.store.flow import FlowControl, KeyPath

_FLOWS: dict[str, FlowControl] = {}


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` instance starts per ``period`` per value of ``key`` (a dotted
    path on params; None: one budget for the whole workflow). A start is an instance's
    first claim (again after a restart); resuming after a sleep, an event or a crash is
    not a start. Instances over the limit wait, queued; none is dropped. The window
    slides: no interval of ``period`` holds more than ``limit`` starts."""

    limit: int
    period: timedelta | float = timedelta(seconds=1)
    key: str | None = None

    @property
    def seconds(self) -> float:
        period = self.period
        return period.total_seconds() if isinstance(period, timedelta) else float(period)


def key_path(expression: str) -> KeyPath:
    """``"params.customer.id"`` -> ``("customer", "id")``. A key is a dotted path on the
    job's params (a number selects an array element); its value is compared as text,
    and a missing key is one key of its own (null)."""
    parts = expression.split(".")
    if len(parts) < 2 or parts[0] != "params" or not all(parts[1:]):
        raise ValueError(f"a key is a dotted path on params, like 'params.tenant': {expression!r}")
    return tuple(parts[1:])


def declare(
    name: str,
    concurrency: int | None = None,
    concurrency_key: str | None = None,
    max_per_key: int | None = None,
    hold_while_waiting: bool = False,
    rate_limit: RateLimit | None = None,
    fairness_key: str | None = None,
) -> None:
    """Record the flow control of workflow ``name`` (from ``@workflow``'s arguments)."""
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if (max_per_key is not None or hold_while_waiting) and concurrency_key is None:
        raise ValueError("max_per_key and hold_while_waiting need a concurrency_key")
    per_key = 1 if max_per_key is None else max_per_key
    if per_key < 1:
        raise ValueError("max_per_key must be at least 1")
    if rate_limit is not None and (rate_limit.limit < 1 or rate_limit.seconds <= 0):
        raise ValueError("a rate limit needs limit >= 1 and a positive period")
    flow = FlowControl(
        concurrency=concurrency,
        concurrency_key=key_path(concurrency_key) if concurrency_key else None,
        max_per_key=per_key,
        hold_while_waiting=hold_while_waiting,
        rate_limit=rate_limit.limit if rate_limit else None,
        rate_period=rate_limit.seconds if rate_limit else 1.0,
        rate_key=key_path(rate_limit.key) if rate_limit and rate_limit.key else None,
        fairness_key=key_path(fairness_key) if fairness_key else None,
    )
    if flow != FlowControl():
        _FLOWS[name] = flow


def flow_controls() -> dict[str, FlowControl]:
    """Every registered workflow's flow control (the engine's claim takes it)."""
    return dict(_FLOWS)


def lane_path(workflow: str) -> KeyPath | None:
    """The key new instances of ``workflow`` store as their fairness lane: ``()`` for a
    workflow with flow control but no key (its lane is ''), None without flow control
    (no lane: the plain claim takes it)."""
    flow = _FLOWS.get(workflow)
    if flow is None:
        return None
    return flow.lane or ()
