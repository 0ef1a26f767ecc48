"""What a workflow's ``ctx`` needs from the engine that runs it.

:class:`~workflow_engine.engine.context.WorkflowContext` sees the runner only through
this :class:`Runtime` protocol, so replay can be tested with a fake runtime and a
recorded history, without PostgreSQL; :class:`~workflow_engine.engine.runner.EngineRunner`
is the real one.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from datetime import datetime
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy.engine import Engine

from workflow_engine.definitions import RetryPolicy
from workflow_engine.engine.emits import StreamLimits
from workflow_engine.model import Registry
from workflow_engine.store.writes import Write

T = TypeVar("T")
P = ParamSpec("P")


class Clock(Protocol):
    """The time timers compare against: ``None`` means the database's ``now()``."""

    def db_now(self) -> datetime | None: ...


class Runtime(Protocol):
    @property
    def owner(self) -> str:
        """The engine id that holds the leases (``lease_owner``)."""
        ...

    @property
    def clock(self) -> Clock: ...

    @property
    def registry(self) -> Registry:
        """The workflows this engine has (a child's version and fairness lane)."""
        ...

    @property
    def default_retry(self) -> RetryPolicy | None:
        """The engine's retry policy for steps that name none (``None``: the default)."""
        ...

    @property
    def max_result_bytes(self) -> int:
        """The size bound of a step's JSON result."""
        ...

    @property
    def step_executor(self) -> Executor:
        """The threads sync step code runs in."""
        ...

    @property
    def stream_limits(self) -> StreamLimits:
        """The bounds of the instances' output streams (``ctx.emit``)."""
        ...

    async def write(self, write: Write[T]) -> T:
        """A lease-guarded write, group-committed with other instances' writes."""
        ...

    async def call_db(
        self, fn: Callable[Concatenate[Engine, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run a blocking store function (``fn(db, *args)``) off the event loop."""
        ...
