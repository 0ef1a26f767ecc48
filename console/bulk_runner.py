"""Bulk operations run in the background: ``store.bulk.start_bulk`` records one, a
thread here runs ``run_bulk`` to the end, and the page polls ``bulk_status``.

The operation's progress lives in the database, so a console restart loses only the
thread: the operation stays visible (its status says where it stopped).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.engine import Engine

from onceflow.vocabulary import BulkAction
from workflow_engine.store import bulk
from workflow_engine.store.listing import InstanceFilter

log = logging.getLogger(__name__)


class BulkRunner:
    """One thread per running operation; ``stop`` waits for them briefly."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def start(self, action: BulkAction, f: InstanceFilter) -> bulk.BulkOperation:
        op = bulk.start_bulk(self.engine, action, f)
        thread = threading.Thread(
            target=self._run, args=(op.id,), name=f"bulk-{op.id}", daemon=True
        )
        with self._lock:
            self._threads[op.id] = thread
        thread.start()
        return op

    def _run(self, op_id: int) -> None:
        try:
            bulk.run_bulk(self.engine, op_id)
            log.info("bulk operation finished", extra={"event": "console.bulk.done"})
        except Exception:
            log.exception("bulk operation failed", extra={"event": "console.bulk.error"})
        finally:
            with self._lock:
                self._threads.pop(op_id, None)

    def running(self) -> int:
        with self._lock:
            return len(self._threads)

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout)
