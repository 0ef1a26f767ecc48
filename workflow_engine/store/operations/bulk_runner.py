"""The one runner of bulk operations in a process: the console's and the admin API's.

One thread, one loop. It runs the operations this process starts (:meth:`BulkRunner.
submit` wakes it at once) and every ``running`` operation whose lease nobody holds: one
cut off by a process that was killed, crashed or stopped between batches (SIGTERM), or
by a CLI run interrupted. It looks for those every ``poll_seconds``, and resumes each
after its last committed batch (:mod:`workflow_engine.store.operations.bulk`). Runners in several
processes share the work through the lease: one runs an operation at a time, and one
that dies hands it over by dying (the lease is its connection's advisory lock).

Operations run one after another, not side by side: a batch is one short transaction
(500 instances by default), so one runner keeps up with what operators start, and the
runner holds one connection while it runs.

A runner :meth:`~BulkRunner.start` ed (by its process's lifespan) stays and polls; one
only woken by :meth:`~BulkRunner.submit` (an app used without its lifespan, as tests
do) runs what there is and its thread ends.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.engine import Engine

from onceflow.vocabulary import BulkAction
from workflow_engine.store.db import is_transient
from workflow_engine.store.operations import bulk
from workflow_engine.store.operator_audit import Actor
from workflow_engine.store.views.listing import InstanceFilter

log = logging.getLogger(__name__)

#: How often a runner looks for operations that lost their runner.
RESUME_POLL_SECONDS = 5.0


class BulkRunner:
    """Runs bulk operations in a background thread; ``start``, ``submit``, ``stop``."""

    def __init__(
        self, db: Engine, poll_seconds: float = RESUME_POLL_SECONDS, batch: int = 500
    ) -> None:
        self.db = db
        self.poll_seconds = poll_seconds
        self.batch = batch
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failing = False  # the last round failed: log the next failure quietly
        self._resident = False  # started to stay (start), not only woken (submit)

    def start(self) -> None:
        """Start the loop, to run until :meth:`stop` (once; later calls do nothing)."""
        with self._lock:
            self._resident = True
            self._spawn()

    def _spawn(self) -> None:
        """Start the thread if none runs (``self._lock`` held)."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="onceflow-bulk-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the batch in progress commits; an operation not finished stays
        ``running``, its lease released, for the next runner to resume."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._wake.set()
        thread.join(timeout)

    def submit(
        self, action: BulkAction, f: InstanceFilter, *, actor: Actor | None = None
    ) -> bulk.BulkOperation:
        """Record an operation (:func:`~workflow_engine.store.operations.bulk.start_bulk`, which
        refuses an empty filter and records the ``actor``'s start in the audit trail)
        and have the loop run it now."""
        op = bulk.start_bulk(self.db, action, f, actor=actor)
        if not op.finished:
            with self._lock:  # the loop's exit checks the wake-up under the same lock
                self._wake.set()
                self._spawn()
        return op

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def run_once(self) -> int:
        """Run every unleased ``running`` operation to its end (or until stopped);
        how many this call ran."""
        ran = 0
        for op_id in bulk.unleased(self.db):
            if self._stopping.is_set():
                break
            ran += self._run(op_id)
        return ran

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            ran = 0
            try:
                ran = self.run_once()
                self._failing = False
            except Exception as exc:
                self._report(exc)
            if not self._resident and not ran:
                with self._lock:
                    if not self._wake.is_set():  # nothing submitted meanwhile: done
                        self._thread = None
                        return
            self._wake.wait(self.poll_seconds)

    def _run(self, op_id: int) -> int:
        with bulk.leased(self.db, op_id) as conn:
            if conn is None:  # another process took it up between the look and the lock
                return 0
            op = bulk.run_leased(conn, op_id, self.batch, should_stop=self._stopping.is_set)
        log.info(
            "%s",
            op.describe(),
            extra={"event": "bulk.run", "bulk_id": op.id, "status": op.status},
        )
        return 1

    def _report(self, exc: Exception) -> None:
        """A database outage is logged once per outage (the loop tries again every
        ``poll_seconds``); anything else with its traceback."""
        if is_transient(exc):
            if not self._failing:
                log.warning(
                    "bulk runner: database unavailable (%s); retrying",
                    exc,
                    extra={"event": "bulk.runner_unavailable"},
                )
            self._failing = True
            return
        log.exception("bulk runner round failed", extra={"event": "bulk.runner_error"})
