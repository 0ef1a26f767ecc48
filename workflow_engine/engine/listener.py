"""``LISTEN onceflow_runnable`` in a thread: each notification wakes the claim loop.

Instances are created and rescued with a ``NOTIFY``; an idle engine claims them at once
instead of at its next poll. The listener owns its psycopg2 connection (autocommit,
blocking ``select``) and closes it on stop; a lost connection is retried every second
while the claim loop falls back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

import psycopg2
import psycopg2.extensions

from workflow_engine.store.writes import RUNNABLE_CHANNEL

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, dsn: str, on_notify: Callable[[], None]) -> None:
        self.dsn = dsn
        self.on_notify = on_notify
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # A pipe whose write end ``stop`` pokes, so the blocking select returns at once.
        self._wake_r, self._wake_w = os.pipe()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="engine-listen", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Stop listening, close the connection, and wait for the thread to end."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self._stopping.is_set():
            try:
                self._listen(loop)
            except Exception:
                log.warning(
                    "LISTEN connection lost; polling until it is back",
                    extra={"event": "engine.listen_error"},
                )
                self._stopping.wait(1.0)

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
            conn.cursor().execute(f"LISTEN {RUNNABLE_CHANNEL}")
            while not self._stopping.is_set():
                if conn in select.select([conn, self._wake_r], [], [], 1.0)[0]:
                    conn.poll()
                    if conn.notifies:
                        conn.notifies.clear()
                        loop.call_soon_threadsafe(self.on_notify)
        finally:
            with contextlib.suppress(Exception):
                conn.close()
