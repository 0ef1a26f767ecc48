"""Output streams from workflow code: the keys that make an emit replay-safe, and the
step side of ``emit``.

Every append carries a key, unique in its instance, that says where in the code it was
emitted; the store writes a key once (``ON CONFLICT`` / ``NOT EXISTS``,
:mod:`workflow_engine.store.writes.stream_values`):

* in the workflow body, ``b<branch path>@<local index>#<n>``: the branch (``""`` on
  the main line, see :class:`~workflow_engine.engine.branches.Cursor`), the local index
  of its next durable call, and the emit's number among those made since its last one.
  Replay runs the body again and makes the same emits at the same places, so they
  collapse: a value the body emitted before a crash is not appended twice;
* in step code, ``s<position>.<attempt>#<n>``: the step's history position, the attempt,
  and the emit's number within that attempt. A completed step is not run again by
  replay, so its values are never repeated; a new attempt (a retry, or the attempt a
  crash cut off run again) appends its values anew, after the earlier attempt's.

A key longer than :data:`MAX_KEY_CHARS` (branches nested very deep) is replaced by its
SHA-256, so it always fits its index entry.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from onceflow.output_streams import InvalidStreamValue, check_stream_name, encode_stream_value
from workflow_engine.errors import NonRetryableError, StreamValueRefused

MAX_KEY_CHARS = 200
#: How long step code's ``emit()`` waits for its append to commit before it raises:
#: the engine's writer answers within a round trip unless the database is unreachable.
EMIT_WAIT_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """The bounds of output streams: one value's JSON bytes; per instance, the values
    and the bytes in all."""

    value_max_bytes: int = 64 * 1024
    max_values: int = 10_000
    max_bytes: int = 16 * 1024 * 1024


def bounded_key(key: str) -> str:
    if len(key) <= MAX_KEY_CHARS:
        return key
    return "h" + hashlib.sha256(key.encode()).hexdigest()


def checked(stream: Any, value: Any, max_bytes: int) -> tuple[str, bytes]:
    """The stream name and the value's JSON, or :class:`StreamValueRefused` (nothing is
    written)."""
    try:
        return check_stream_name(stream), encode_stream_value(value, max_bytes)
    except InvalidStreamValue as exc:
        raise StreamValueRefused(exc.reason, str(exc.code)) from None


#: What appends a value in the engine's loop: ``append(stream, data, key)``.
Append = Callable[[str, bytes, str], Coroutine[Any, Any, int | None]]


class StepOutput:
    """The emits of one attempt of one step: its keys, and the way from the step's
    thread to the engine's loop (the context variable ``steps._step_output`` holds it
    while the attempt runs). Made for every attempt, so it does nothing until an emit
    (one object and a context variable per step is its whole cost)."""

    __slots__ = ("_append", "_count", "_limits", "_lock", "_loop", "attempt", "job_id", "position")

    def __init__(
        self,
        job_id: str,
        position: int,
        attempt: int,
        loop: asyncio.AbstractEventLoop,
        append: Append,
        limits: Callable[[], StreamLimits],
    ) -> None:
        self.job_id = job_id
        self.position = position
        self.attempt = attempt
        self._loop = loop
        self._append = append
        self._limits = limits
        self._count = 0
        self._lock = threading.Lock()  # step code may emit from threads of its own

    def next_key(self) -> str:
        with self._lock:
            n, self._count = self._count, self._count + 1
        return bounded_key(f"s{self.position}.{self.attempt}#{n}")

    async def emit_async(self, stream: Any, value: Any) -> int | None:
        name, data = checked(stream, value, self._limits().value_max_bytes)
        return await self._append(name, data, self.next_key())

    def emit_blocking(self, stream: Any, value: Any) -> int | None:
        """Append from sync step code running in a thread; returns once committed."""
        if _on_loop(self._loop):
            # a NonRetryableError: the step's next attempt would run there too
            raise NonRetryableError(
                "emit() in a step that runs on the engine's event loop (inline, or async"
                " step code) would block it: make the step async and `await ctx.emit(...)`,"
                " or run it in a thread (inline=False)"
            )
        name, data = checked(stream, value, self._limits().value_max_bytes)
        future = asyncio.run_coroutine_threadsafe(
            self._append(name, data, self.next_key()), self._loop
        )
        return future.result(EMIT_WAIT_SECONDS)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
