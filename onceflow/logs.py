"""Structured logging: one JSON object per line, always with an ``event`` name.

Use ``logging.getLogger(__name__)`` and pass the ids in ``extra``::

    log.info("instance created", extra={"event": "instance.created", "job_id": job_id})

so that ``grep job_01J…`` across the processes' logs reads as one story.

An event logged thousands of times a second (ingest's ``job.accepted``, one per
accepted job) goes through :class:`EventLog` instead: the same JSON line, built from a
plain dict and written without a ``LogRecord`` (BENCHMARKS.md, "Single-job requests").
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str = "") -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
            "msg": record.getMessage(),
        }
        if self.process_name:
            doc["process"] = self.process_name
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key != "event":
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup_logging(level: str = "INFO", fmt: str = "json", process_name: str = "") -> None:
    """Configure the root logger once per process."""
    handler: logging.Handler
    if fmt == "json":
        handler = JsonLines(sys.stderr, process_name)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiokafka", "faust", "mode", "uvicorn.access", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class JsonLines(logging.StreamHandler[TextIO]):
    """The JSON-lines handler :func:`setup_logging` installs, which also takes the
    ready-made lines of :class:`EventLog`. Those are written once per event-loop
    iteration, all together (one write instead of one per line); a record logged the
    ordinary way first writes what is waiting, so the order holds, and ``flush`` (which
    ``logging.shutdown`` calls at exit) writes it too. A process killed outright
    (SIGKILL) can lose the lines of its last loop iteration, under a millisecond's
    worth."""

    def __init__(self, stream: TextIO, process_name: str = "") -> None:
        super().__init__(stream)
        self.setFormatter(JsonFormatter(process_name))
        self.process_name = process_name
        self._waiting: list[str] = []

    def write_line(self, line: str) -> None:
        self.write_lines((line,))

    def write_lines(self, lines: Iterable[str]) -> None:
        # Under the handler's lock: another thread's record (librdkafka's logger, the
        # broker watcher) swaps the list in write_waiting; an append racing that swap
        # would land on the list already written, and the line would be lost.
        with self.lock:  # type: ignore[union-attr]
            first = not self._waiting
            self._waiting.extend(lines)
        if first:
            try:
                asyncio.get_running_loop().call_soon(self.write_waiting)
            except RuntimeError:  # no event loop in this thread: write it now
                self.write_waiting()

    def write_waiting(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            lines, self._waiting = self._waiting, []
            if lines:
                self.stream.write("".join(lines))
                super().flush()

    def flush(self) -> None:
        """Also what waits for the loop (``logging.shutdown`` at exit calls this)."""
        if self._waiting:
            self.write_waiting()
        else:
            super().flush()

    def emit(self, record: logging.LogRecord) -> None:
        if self._waiting:
            self.write_waiting()
        super().emit(record)


class EventLog:
    """The cheap path for one hot event of one logger: ``info(fields)`` writes the
    line :class:`JsonFormatter` would (``ts``, ``level``, ``logger``, ``event``,
    ``msg``, ``process``, then ``fields``) straight to the :class:`JsonLines` handler
    when that is where the record would go; anywhere else (text format, a test's
    capturing handler, a filter in the way) it is an ordinary ``logger.info``."""

    def __init__(self, logger: logging.Logger, event: str, msg: str) -> None:
        self.logger = logger
        self.event = event
        self.msg = msg
        self._ms = -1
        self._ts = ""

    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def info(self, fields: dict[str, Any]) -> None:
        """Log ``fields`` (the caller checked :meth:`enabled`)."""
        self.info_each({}, [fields])

    def info_each(self, common: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        """One line per row, each with ``common``'s fields then the row's (the caller
        checked :meth:`enabled`), e.g. the jobs of one request. The line's start
        (``ts`` to ``common``) is encoded once and each row's fields are spliced after
        it: one small ``orjson.dumps`` per line, where building and encoding a whole
        dict per job was ~10% of a 100-job batch's CPU (BENCHMARKS.md, "Third
        round")."""
        handler = _only_json_handler(self.logger)
        if handler is None:
            for row in rows:
                self.logger.info(self.msg, extra={"event": self.event, **common, **row})
            return
        doc: dict[str, Any] = {
            "ts": self._timestamp(),
            "level": "info",
            "logger": self.logger.name,
            "event": self.event,
            "msg": self.msg,
        }
        if handler.process_name:
            doc["process"] = handler.process_name
        doc.update(common)
        if len(rows) == 1:
            doc.update(rows[0])
            handler.write_lines((_line(doc),))
            return
        if not all(doc.keys().isdisjoint(row) for row in rows):
            # a field replacing one of the line's own: a dict per line
            handler.write_lines([_line({**doc, **row}) for row in rows])
            return
        start = _line(doc)[:-2]  # without "}\n"
        lines = [_splice(start, orjson.dumps(row, default=str).decode()) for row in rows]
        handler.write_lines(lines)

    def _timestamp(self) -> str:
        """The ``ts`` field, formatted once per millisecond."""
        ns = time.time_ns()
        ms = ns // 1_000_000
        if ms != self._ms:
            when = datetime.fromtimestamp(ms / 1000, UTC)
            self._ms, self._ts = ms, when.isoformat(timespec="milliseconds")
        return self._ts


def _line(doc: dict[str, Any]) -> str:
    return orjson.dumps(doc, default=str).decode() + "\n"


def _splice(start: str, fields: str) -> str:
    """``start`` (a JSON object without its closing brace) followed by the members of
    the JSON object ``fields``."""
    return f"{start},{fields[1:]}\n" if len(fields) > 2 else start + "}\n"


def _only_json_handler(logger: logging.Logger) -> JsonLines | None:
    """The one handler a record of ``logger`` would reach, if it is a filterless
    :class:`JsonLines` and nothing on the way filters; else None."""
    found: JsonLines | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if found is not None or type(handler) is not JsonLines:
                return None
            if handler.filters or handler.level > logging.INFO:
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found
