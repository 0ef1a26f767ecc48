"""Exceptions of the workflow engine."""

from typing import Protocol

from onceflow.errors import OnceflowError


class WorkflowError(OnceflowError):
    """Base class of engine errors."""


#: The attributes that mark a step's failure with its history position (``at_step``),
#: and with the cursor it was raised on and that cursor's next index then.
_POSITION = "onceflow_step_position"
_MARK = "onceflow_step_mark"


class _Cursor(Protocol):
    """What a failure's mark reads of a history cursor (``engine.branches.Cursor``)."""

    next: int


def at_step(error: BaseException, position: int, cursor: _Cursor | None = None) -> BaseException:
    """Mark ``error`` (a step's ``StepFailed`` or ``NonRetryableError``, raised live or
    again on replay) as the failure of the step at history ``position``: if it ends the
    run, the instance records that position (``onceflow_instances.failed_position``),
    the step ``onceflow instances retry`` runs again. ``cursor``: the cursor the step
    took its position from; if it (or, once the failure has left a gather, the cursor
    that gathered: :func:`rebase_step_failure`) takes another position before the run
    ends, the workflow handled the failure (:func:`failed_step_position`)."""
    setattr(error, _POSITION, position)
    setattr(error, _MARK, None if cursor is None else (cursor, cursor.next))
    return error


def rebase_step_failure(error: BaseException, cursor: _Cursor) -> None:
    """A step failure that left a gather's branch goes on on ``cursor``, the gather's:
    what counts as handling it from there is a durable call on that cursor."""
    marked = _marked(error)
    if marked is not None and getattr(marked, _MARK, None) is not None:
        setattr(marked, _MARK, (cursor, cursor.next))


def _marked(error: BaseException) -> BaseException | None:
    """``error`` itself, or the step failure it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(getattr(current, _POSITION, None), int):
            return current
        current = current.__cause__ or current.__context__
    return None


def failed_step_position(error: BaseException) -> int | None:
    """The position of the step failure that ended a run: ``error`` itself, or the
    failure it was raised from or while handling (``raise Refund() from exc``, a
    ``raise`` in an ``except StepFailed``); None when no step failure is in the chain
    (the workflow's own code failed), and None when the workflow made a durable call
    after the failure on its path (a compensation, an alert step): those entries
    were recorded because the step failed, so running the step again (a retry) would
    repeat its side effect under a history that says its failure was handled, and the
    replay would take the other branch into those entries (found in review). A retry
    of such an instance replays it as recorded."""
    marked = _marked(error)
    if marked is None:
        return None
    mark = getattr(marked, _MARK, None)
    if mark is not None and mark[0].next != mark[1]:
        return None
    position: int = getattr(marked, _POSITION)
    return position


class NonRetryableError(WorkflowError):
    """Raise from step code to fail the step and the instance at once, without retries."""


class StepFailed(WorkflowError):
    """A step exhausted its retries; the instance errors with this message.

    ``cause_type`` names the class of the last attempt's exception (``module:qualname``).
    Replay raises a recorded StepFailed again from the history, with the same message and
    ``cause_type``, without running the step: only its ``__cause__`` (that exception
    object) is not rebuilt."""

    def __init__(self, message: str, cause_type: str | None = None) -> None:
        super().__init__(message)
        self.cause_type = cause_type


class NonDeterminismError(WorkflowError):
    """On replay the workflow asked for a different step than the one recorded there."""


class StepResultError(NonRetryableError):
    """A step returned something that is not JSON-serialisable or is too large."""


class StreamValueRefused(NonRetryableError):
    """``emit`` was given a stream name or value the rule refuses
    (:mod:`onceflow.output_streams`): not JSON, too large, a bad name. Nothing was
    written. ``code`` is the :class:`~onceflow.output_streams.StreamRefusal`."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class InvalidAttributes(NonRetryableError):
    """``ctx.set_attributes`` was given an update that, merged into the instance's
    attributes, the rule refuses (:func:`onceflow.envelope.check_attributes`: a bad key
    or value, too many keys, too large). Nothing was written."""


class StreamLimitReached(NonRetryableError):
    """``emit`` past the instance's bound on its output streams (values or bytes in all,
    ``ONCEFLOW_STREAM_MAX_VALUES`` / ``ONCEFLOW_STREAM_MAX_BYTES``): nothing was written,
    and no later emit of the instance can be either. Like any ``NonRetryableError`` it
    fails a step at once; workflow code may catch it and go on without streaming."""


class DatabaseRefused(WorkflowError):
    """The database refused one of the instance's writes for good (by SQLSTATE, the row
    is at fault: a value too large for its index, data it cannot store): retrying cannot
    help, so the instance errors with this message. The other writes of its batch are
    not affected (``workflow_engine.store.writes.execution.write_each``).

    ``checkpoint_committed``: the refused write followed the previous step's checkpoint
    in one chain, and that checkpoint committed on its own before it."""

    def __init__(self, message: str, checkpoint_committed: bool = False) -> None:
        super().__init__(message)
        self.checkpoint_committed = checkpoint_committed


class LeaseLost(WorkflowError):
    """This engine no longer holds the instance's lease; another engine owns it now."""


class EventTimeout(WorkflowError):
    """``wait_for_event`` reached its timeout before an event of that type arrived."""


class ChildWorkflowFailed(WorkflowError):
    """``ctx.child_result`` of a child that errored or was terminated: carries the
    child's job id, its final status and its error. The parent may catch it; uncaught,
    the parent errors with it."""

    def __init__(self, child_job_id: str, status: str, error: str) -> None:
        super().__init__(f"child {child_job_id} {status}: {error}")
        self.child_job_id = child_job_id
        self.status = status
        self.error = error


class ControlRequested(BaseException):
    """Internal: an operator asked for pause/terminate/restart while the instance ran.

    A BaseException so that workflow code's ``except Exception`` cannot swallow it.
    """

    def __init__(self, action: str) -> None:
        super().__init__(action)
        self.action = action


class DeadlinePassed(ControlRequested):
    """Internal: the instance's execution deadline (``execution_timeout``) has passed: a
    step's start found it so under the lease, and the run stops at that boundary to be
    errored ``timed_out``. A :class:`ControlRequested` so that it stops the run as an
    operator's request does: workflow code cannot catch it, a gather's branches stop,
    and the checkpoint written before it stays committed."""

    def __init__(self, message: str) -> None:
        super().__init__("timed_out")
        self.message = message


class Suspend(BaseException):
    """Internal: the instance waits (sleep, retry delay, event) without holding a worker."""

    def __init__(self, status: str, wake_at: object | None, delay: float | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.wake_at = wake_at
        self.delay = delay
