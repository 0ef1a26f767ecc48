"""How one run of an instance ended, as a value the runner then applies.

Running the workflow function and recording what came of it are two steps: the run
returns an :data:`Outcome`, and ``EngineRunner._settle`` writes it (finish, suspend,
carry out an operator's request) — one place per outcome instead of one ``except``
branch each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from onceflow.vocabulary import ControlAction, InstanceStatus, TimeoutKind


@dataclass(frozen=True, slots=True)
class Completed:
    """The workflow returned; ``result`` is its JSON."""

    result: bytes


@dataclass(frozen=True, slots=True)
class Failed:
    """The workflow raised (or is unknown); the instance errors with ``error``.
    ``position``: the history position of the step whose failure ended the run, if one
    did (what ``onceflow instances retry`` runs again)."""

    error: str
    position: int | None = None
    timeout: TimeoutKind | None = None  # a time limit ended it (timed_out)


@dataclass(frozen=True, slots=True)
class Suspended:
    """A sleep, retry delay or event wait: release the instance until it is due."""

    status: InstanceStatus
    wake_at: datetime | None
    delay: float | None


@dataclass(frozen=True, slots=True)
class ControlApplied:
    """An operator's pause/terminate/restart, seen at a step boundary."""

    action: ControlAction


@dataclass(frozen=True, slots=True)
class LostLease:
    """Another engine holds the instance now; write nothing more."""

    reason: str


Outcome = Completed | Failed | Suspended | ControlApplied | LostLease
