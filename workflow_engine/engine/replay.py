"""What replay raises for a failure the history recorded: a step's, a wait's time-out,
a child's.

Replay returns what history recorded, a completed entry its result and a failed one
its error, and runs nothing again (docs/architecture.md, "Replay"). A failed step is
the one whose error must be kept on purpose: a workflow may catch its ``StepFailed`` or
``NonRetryableError`` and go on, and its next replay (after a sleep, a crash, a pause)
has to take the same branch, or it runs the step again (a second charge) and then
meets a history recorded down the other branch (``NonDeterminismError``). So the
entry of a failed step keeps, in its ``result``, a :func:`step_failure` record, and
:func:`replayed_failure` raises it again from there, as it does a timed-out wait's
``EventTimeout`` and a failed child's ``ChildWorkflowFailed``.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import orjson

from onceflow.storable import storable_text
from onceflow.vocabulary import StepKind
from workflow_engine.errors import (
    ChildWorkflowFailed,
    EventTimeout,
    NonRetryableError,
    StepFailed,
    WorkflowError,
)
from workflow_engine.model import RecordedStep
from workflow_engine.store import writes

#: ``raised`` of a step's failure record: which of the two the workflow saw.
STEP_FAILED = "StepFailed"
NON_RETRYABLE = "NonRetryableError"
#: The longest message a failure record keeps (the entry's ``error`` text has the same).
MAX_MESSAGE = 2000


def type_name(cls: type) -> str:
    """``module:qualname``: unambiguous where module and class names both have dots."""
    return f"{cls.__module__}:{cls.__qualname__}"


def step_failure(error: StepFailed | NonRetryableError) -> bytes:
    """The record of a step's final failure that its history entry keeps: which error
    the workflow saw, its message, and the type of its cause (for ``StepFailed`` the
    last attempt's exception, for a ``NonRetryableError`` its own class)."""
    if isinstance(error, StepFailed):
        raised, cause = STEP_FAILED, error.cause_type
    else:
        raised, cause = NON_RETRYABLE, type_name(type(error))
    message = storable_text(str(error))[:MAX_MESSAGE]  # jsonb holds no NUL either
    return orjson.dumps({"raised": raised, "type": cause, "message": message})


def replayed_failure(job_id: str, recorded: RecordedStep) -> WorkflowError:
    """The error a failed entry of ``job_id``'s history raises again on replay."""
    if recorded.kind == StepKind.EVENT:
        return EventTimeout(recorded.error or f"timed out waiting for event ({recorded.name!r})")
    if recorded.kind == StepKind.CHILD:
        outcome = writes.recorded_outcome(recorded.status, recorded.result, recorded.error)
        child = recorded.child_job_id or writes.child_job_id(job_id, recorded.name)
        return ChildWorkflowFailed(child, outcome.child_status, outcome.error or "")
    return _step_error(recorded)


def _step_error(recorded: RecordedStep) -> WorkflowError:
    record: dict[str, Any] = recorded.result if isinstance(recorded.result, dict) else {}
    # An entry recorded before failure records existed: the StepFailed of that time had
    # exactly this message (a NonRetryableError it cannot tell apart: StepFailed).
    message = str(
        record.get("message")
        or f"step {recorded.name!r} failed after {recorded.attempts} attempts: {recorded.error}"
    )
    cause = record.get("type")
    if record.get("raised") == NON_RETRYABLE:
        return _rebuilt(cause, message)
    return StepFailed(message, cause_type=cause)


def _rebuilt(recorded_type: str | None, message: str) -> NonRetryableError:
    """The recorded ``NonRetryableError`` subclass, so ``except CardDeclined`` catches it
    on replay as it did live, with its recorded message. Only a class this process has
    already loaded is used (replay imports nothing), else ``NonRetryableError`` itself;
    its ``__init__`` is not run again, so attributes a custom ``__init__`` sets are not
    there on replay (the class and ``str()`` are)."""
    cls = _loaded_class(recorded_type) or NonRetryableError
    return cast(NonRetryableError, BaseException.__new__(cls, message))


def _loaded_class(recorded_type: str | None) -> type[NonRetryableError] | None:
    module_name, _, qualname = (recorded_type or "").partition(":")
    found: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if found is not None else ():
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, NonRetryableError):
        return found
    return None
