"""What every open ``GET /v1/jobs/{id}/stream`` of one ingest process shares.

A reader holds no database connection while it waits, and no reader polls PostgreSQL
on its own:

* one ``LISTEN`` connection per process, on the one channel every append notifies with
  its job id (``workflow_engine.store.writes.STREAM_CHANNEL``, sent when the append
  commits): it wakes the readers of that job at once. It is opened with the first
  reader (an ingest nobody streams from never opens it: submissions need Kafka only)
  and registered with the event loop (``add_reader``), no thread;
* one poll every ``ingest_stream_poll_seconds`` reads the status and last seq of every
  job that has a reader, in one statement, and wakes those whose state moved: how a
  reader learns its instance was created or finished (neither notifies), and the
  fallback for a notification lost while the LISTEN connection was down;
* a woken reader reads its new values in one short statement on the pooled engine
  (:func:`workflow_engine.store.views.read_values`) and waits again.

At most ``ingest_stream_max_readers`` readers are open at once (:meth:`StreamHub.admit`);
the route answers 503 past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import psycopg2
import psycopg2.extensions
from sqlalchemy.engine import Engine

from producers.metrics import STREAM_LISTENING, STREAM_READERS, STREAM_REFUSED
from workflow_engine.store import libpq_dsn
from workflow_engine.store.views import StreamState, stream_states
from workflow_engine.store.writes import STREAM_CHANNEL

log = logging.getLogger(__name__)
_RECONNECT_SECONDS = 1.0


@dataclass(eq=False)
class Waiter:
    """One reader's wake-up: set by a notification or by the poll."""

    job_id: str
    event: asyncio.Event = field(default_factory=asyncio.Event)
    #: The state the poll last woke it for (None: not yet).
    seen: StreamState | None = None
    left: bool = False

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait to be woken (at most ``timeout`` seconds); whether it was."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            return False
        return True


class StreamHub:
    def __init__(self, db: Engine, max_readers: int, poll_seconds: float) -> None:
        self.db = db
        self.max_readers = max_readers
        self.poll_seconds = poll_seconds
        self._waiters: dict[str, set[Waiter]] = {}
        self._open = 0
        self._task: asyncio.Task[None] | None = None
        self.listening = False  # the LISTEN connection is up (for tests and logs)

    @property
    def open_readers(self) -> int:
        return self._open

    def admit(self) -> bool:
        """Take a reader's slot; False when all are taken."""
        if self._open >= self.max_readers:
            STREAM_REFUSED.inc()
            return False
        self._open += 1
        STREAM_READERS.set(self._open)
        return True

    def release(self) -> None:
        self._open -= 1
        STREAM_READERS.set(self._open)

    def subscribe(self, job_id: str) -> Waiter:
        """Follow ``job_id`` (in an admitted slot, given back by :meth:`leave`)."""
        waiter = Waiter(job_id)
        self._waiters.setdefault(job_id, set()).add(waiter)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Stop following and give the slot back (once, however often it is called: the
        stream's end and the response's background task both call it, since a stream
        whose client left before it started never runs its own ``finally``)."""
        if waiter.left:
            return
        waiter.left = True
        self.release()
        waiters = self._waiters.get(waiter.job_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[waiter.job_id]

    def wake(self, job_id: str) -> None:
        for waiter in self._waiters.get(job_id, ()):
            waiter.event.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        listener = asyncio.get_running_loop().create_task(self._listen_forever())
        try:
            while True:
                await asyncio.sleep(self.poll_seconds)
                await self._poll()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _poll(self) -> None:
        """One statement for every job with a reader; wake those whose state moved."""
        if not self._waiters:
            return
        try:
            states = await asyncio.to_thread(stream_states, self.db, list(self._waiters))
        except Exception as exc:  # PostgreSQL away: readers wait, the next poll retries
            log.warning("stream poll failed: %s", exc, extra={"event": "ingest.stream_poll"})
            return
        for job_id, waiters in list(self._waiters.items()):
            state = states.get(job_id)
            if state is None:
                continue
            for waiter in waiters:
                if waiter.seen != state:
                    waiter.seen = state
                    waiter.event.set()

    async def _listen_forever(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "stream LISTEN connection lost (%s); readers rely on the poll until it is back",
                    exc,
                    extra={"event": "ingest.stream_listen_error"},
                )
            self._listening(False)
            await asyncio.sleep(_RECONNECT_SECONDS)

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        conn = await asyncio.to_thread(psycopg2.connect, libpq_dsn(self.db))
        lost: asyncio.Future[None] = loop.create_future()
        try:
            conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
            conn.cursor().execute(f"LISTEN {STREAM_CHANNEL}")
            loop.add_reader(conn.fileno(), self._readable, conn, lost)
            self._listening(True)
            for job_id in list(self._waiters):  # what was missed while it was down
                self.wake(job_id)
            await lost
        finally:
            with contextlib.suppress(Exception):
                loop.remove_reader(conn.fileno())
            with contextlib.suppress(Exception):
                conn.close()

    def _listening(self, up: bool) -> None:
        self.listening = up
        STREAM_LISTENING.set(1 if up else 0)

    def _readable(self, conn: psycopg2.extensions.connection, lost: asyncio.Future[None]) -> None:
        try:
            conn.poll()
        except Exception as exc:
            if not lost.done():
                lost.set_exception(exc)
            return
        for note in conn.notifies:
            self.wake(note.payload)
        conn.notifies.clear()
