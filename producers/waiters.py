"""Start and wait: holding a request open until its jobs' instances finish, without a
database connection per request and without polling.

One ingest process keeps a map job id -> the futures of the requests waiting for it.
The futures are resolved by the process's one consumer of the events topic
(:class:`producers.events_watch.EventsWatcher`), from the final lifecycle events'
own data (status, result, error): no query per event.

Why no wakeup can be lost. A waiter is registered *first*, and only then is the job's
status read from PostgreSQL once (:meth:`Waiters.wait`). The relay publishes an event
only after the change it tells of committed (the outbox row is written in that
transaction, and read by the relay after it). Take a final change and the read:

- the change committed before the read: the read sees the final status, and the
  request is answered from it at once;
- it committed after the read: its event reaches the topic after the read, so after
  the registration, and the watcher, which was ready (assigned at offsets read from the
  broker before it said so) when the waiter registered, consumes it and resolves the
  waiter's future.

There is no third case, so a final status is never missed in the window between
"Kafka acknowledged the job" and "the waiter is registered" (the failpoint
``ingest.before_wait_register`` sits in that window for the test that proves it). What
cannot be watched is not waited for: the watcher not ready (topic missing, broker
down, not yet assigned), the process shutting down, or the status read failing
(PostgreSQL down) is answered with the plain 202 at once ("degraded"); a request
that would take the jobs waited for past ``ingest_max_waiters`` (a batch counts each of
its jobs: the map holds a future per job), with a 202 at once too ("refused").

Reads are batched: the status reads of every request that registered while the
previous read ran go in the next statement, so a burst of waiting requests costs a few
queries on one connection at a time, each returned to the pool at once.

A resubmission may start a new run of its id (id reuse), so "the id's run is final" is
not its answer until the worker has written its record down: run 1 complete, read
before the worker took the record, says nothing of the run 2 that record starts. For a
submission whose workflow may reuse ids, the request passes its record's Kafka position
(``records``) and the read answers the run that record belongs to, or *pending* (never
final) while the record is not written down (workflow_engine/store/views/outcomes.py).
The record's id is in :attr:`Waiters.records` (the watcher hands over its
record-written events, ``instance.created`` / ``duplicate``) from before the first read
on, the same order as above, so the wakeup that says "written down" cannot be lost
either; and each of its final events is checked by a read, as a restarted instance's
are (an earlier run's may still be delivered).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.settings import Settings
from onceflow.vocabulary import JobKind
from producers.events_watch import EventsWatcher, Finals
from producers.metrics import WAIT_OUTCOMES, WAITING_REQUESTS
from workflow_engine.store.views import JobOutcome, Record, submission_outcomes

log = logging.getLogger(__name__)

#: Most ids in one status read.
_READ_CHUNK = 2000


class WaitOutcome(StrEnum):
    """How a wait ended (``onceflow_ingest_wait_outcomes_total{outcome}``)."""

    #: Every job waited for is final: answered 200.
    FINAL = "final"
    #: Not all final within the time asked for: 202.
    TIMEOUT = "timeout"
    #: The outcome cannot be watched (events consumer not ready, PostgreSQL down,
    #: shutting down): 202 at once.
    DEGRADED = "degraded"
    #: The jobs waited for would be over ``ingest_max_waiters``: 202 at once.
    REFUSED = "refused"


@dataclass(slots=True)
class Waited:
    """What a wait found: how it ended and each job's outcome known by then (final or
    not; a job with no instance yet is absent)."""

    how: WaitOutcome
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    #: Why it was degraded (a log's reason, never parsed).
    reason: str = ""

    def final(self, job_id: str) -> JobOutcome | None:
        found = self.outcomes.get(job_id)
        return found if found is not None and found.final else None


@dataclass(slots=True)
class _Wait:
    """One waiting request's state."""

    deadline: float
    #: The records of its submissions that may start a new run (producers/waiters.py).
    records: dict[str, Record]
    futures: dict[str, asyncio.Future[Any]] = field(default_factory=dict)
    #: Ids whose final events are checked by a read (restarted before the read).
    checked: set[str] = field(default_factory=set)
    #: The run each gated id's record belongs to, once a read found it written down.
    runs: dict[str, int] = field(default_factory=dict)
    #: Ids registered in ``Waiters.records`` by this request (woken by record events).
    gated: set[str] = field(default_factory=set)


class DatabaseUnavailable(Exception):
    """The status read failed: PostgreSQL cannot say how the jobs stand."""


#: What a waiter's future is resolved with when an event gave no usable data (read
#: the status instead) or the process is shutting down (stop waiting).
_REREAD = object()
_CLOSING = object()


class Waiters:
    """The process's waiting requests. ``start`` (on the running loop) starts the
    events consumer; ``close`` lets every waiting request go with its 202."""

    def __init__(self, settings: Settings, db: Callable[[], Engine]) -> None:
        self.max_seconds = settings.ingest_max_wait_seconds
        self.max_waiting = settings.ingest_max_waiters
        self._settings = settings
        self._db = db
        self._waiting: dict[str, list[asyncio.Future[Any]]] = {}
        #: Job ids whose waiting submission's record is not known to be written down
        #: yet, and by how many waits: their record-written events wake them.
        self.records: dict[str, int] = {}
        #: Jobs waited for now, over every waiting request (what ``max_waiting`` bounds).
        self._jobs = 0
        self._closing = False
        self._reads: list[
            tuple[list[str], Mapping[str, Record], asyncio.Future[dict[str, JobOutcome]]]
        ] = []
        self._reader: asyncio.Task[None] | None = None
        self.watcher: EventsWatcher | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.watcher = EventsWatcher(
            self._settings, self._waiting, self._resolve, loop, self._reread_all, self.records
        )
        self.watcher.start()

    def close(self) -> None:
        """Stop waiting (SIGTERM): every waiting request answers 202 now, new ones at once."""
        self._closing = True
        for futures in list(self._waiting.values()):
            for future in futures:
                if not future.done():
                    future.set_result(_CLOSING)

    def stop(self) -> None:
        self.close()
        if self.watcher is not None:
            self.watcher.stop()

    def waiting(self, job_id: str) -> int:
        """How many requests wait for ``job_id`` now."""
        return len(self._waiting.get(job_id, ()))

    @property
    def watchable(self) -> bool:
        return not self._closing and self.watcher is not None and self.watcher.ready

    def applied(self, wanted: int | float) -> float:
        """The wait granted for ``wanted`` seconds (capped to ``ingest_max_wait_seconds``)."""
        return max(0.0, min(float(wanted), float(self.max_seconds)))

    async def wait(
        self,
        job_ids: Sequence[str],
        seconds: float,
        records: Mapping[str, Record] | None = None,
    ) -> Waited:
        """Wait up to ``seconds`` for every one of ``job_ids`` to be final; for those in
        ``records`` (submissions that may start a new run of their id), final in the run
        their record belongs to."""
        if not self.watchable:
            return self._count(Waited(WaitOutcome.DEGRADED, reason="events not watched"))
        if self._jobs + len(job_ids) > self.max_waiting:
            return self._count(Waited(WaitOutcome.REFUSED))
        loop = asyncio.get_running_loop()
        self._jobs += len(job_ids)
        WAITING_REQUESTS.inc()
        w = _Wait(loop.time() + seconds, dict(records or {}))
        try:
            # The window the module's docstring is about: acknowledged, not registered.
            await failpoints.hit_async("ingest.before_wait_register", job_ids[0])
            w.futures = {job_id: self._register(job_id, loop) for job_id in job_ids}
            for job_id in w.records:
                self._gate(w, job_id)
            return self._count(await self._wait_registered(w))
        finally:
            self._jobs -= len(job_ids)
            WAITING_REQUESTS.dec()
            for job_id, future in w.futures.items():
                self._unregister(job_id, future)
            for job_id in list(w.gated):
                self._ungate(w, job_id)

    async def read(
        self, job_ids: Sequence[str], records: Mapping[str, Record] | None = None
    ) -> dict[str, JobOutcome]:
        """The jobs' outcomes (those in ``records``: of their record's run, or pending),
        from one (batched) status read; DatabaseUnavailable if PostgreSQL did not answer."""
        future: asyncio.Future[dict[str, JobOutcome]] = asyncio.get_running_loop().create_future()
        self._reads.append((list(job_ids), records or {}, future))
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_batches())
        return await future

    def _gate(self, w: _Wait, job_id: str) -> None:
        """Wake ``w`` on ``job_id``'s record-written events (before the read that may
        find its record not written down: the order the module's docstring keeps)."""
        self.records[job_id] = self.records.get(job_id, 0) + 1
        w.gated.add(job_id)

    def _ungate(self, w: _Wait, job_id: str) -> None:
        w.gated.discard(job_id)
        if self.records[job_id] > 1:
            self.records[job_id] -= 1
        else:
            del self.records[job_id]

    def _learn(self, w: _Wait, job_id: str, outcome: JobOutcome | None) -> None:
        """What a read said of a gated id: once its record is written down, the run it
        belongs to is known, a final event of that run is its answer as it is (no read),
        and its record-written events need not wake it any more (found in review: a
        first submission of such a workflow paid a read per event)."""
        if job_id not in w.records or outcome is None or outcome.pending:
            return
        w.runs[job_id] = outcome.run
        if job_id in w.gated:
            self._ungate(w, job_id)

    async def _wait_registered(self, w: _Wait) -> Waited:
        try:
            async with asyncio.timeout_at(w.deadline):
                outcomes = await self.read(list(w.futures), w.records)
        except (DatabaseUnavailable, TimeoutError):
            return Waited(WaitOutcome.DEGRADED, reason="status read failed")
        if any(o.kind is JobKind.TASK and not o.final for o in outcomes.values()):
            # plain tasks have no lifecycle events: nothing would wake this request
            return Waited(WaitOutcome.DEGRADED, outcomes, "a task is not finished")
        # Restarted before the read: a final event of an earlier run may still be
        # delivered (the relay publishes at least once, and this consumer may be behind),
        # so such an id's final events are checked against its status, not taken as they
        # are. (With the outbox's per-instance sequence in the read, "the event's
        # sequence is above the one read" says it at no cost.)
        w.checked = {j for j, o in outcomes.items() if o.restarts > 0}
        for job_id, outcome in outcomes.items():
            self._learn(w, job_id, outcome)
        pending = {j: f for j, f in w.futures.items() if j not in outcomes or not outcomes[j].final}
        return await self._until_final(w, pending, outcomes)

    def _take_as_is(self, w: _Wait, job_id: str, got: Any) -> bool:
        """A final event's outcome is the answer without a read: not a restarted id's,
        and, for a submission that may start a new run, of the run its record is known
        to belong to."""
        if got is _REREAD or job_id in w.checked:
            return False
        return job_id not in w.records or w.runs.get(job_id) == got.run

    async def _until_final(
        self, w: _Wait, pending: dict[str, asyncio.Future[Any]], outcomes: dict[str, JobOutcome]
    ) -> Waited:
        loop = asyncio.get_running_loop()
        while pending:
            done, _ = await asyncio.wait(pending.values(), timeout=w.deadline - loop.time())
            if not done:
                return Waited(WaitOutcome.TIMEOUT, outcomes)
            for job_id in [j for j, f in pending.items() if f in done]:
                got = pending.pop(job_id).result()
                if got is _CLOSING:
                    return Waited(WaitOutcome.DEGRADED, outcomes, "shutting down")
                if not self._take_as_is(w, job_id, got):
                    read, got = await self._check(w, job_id)
                    if not read:
                        return Waited(WaitOutcome.TIMEOUT, outcomes)
                    self._learn(w, job_id, got)
                    if got is not None and got.restarts > 0:
                        w.checked.add(job_id)
                    if got is None or not got.final:
                        # not final after all: wait on, on the future registered anew
                        if got is not None:
                            outcomes[job_id] = got
                        pending[job_id] = w.futures[job_id]
                        continue
                outcomes[job_id] = got
        return Waited(WaitOutcome.FINAL, outcomes)

    async def _check(self, w: _Wait, job_id: str) -> tuple[bool, JobOutcome | None]:
        """A final event not to be taken as it is (its data not the contract's, or maybe
        an earlier run's): the status, read once, and whether the read answered. The
        job is registered anew *before* the read (the order :meth:`wait` keeps), so a
        final change after the read is not missed if this one was not final."""
        old = w.futures[job_id]
        w.futures[job_id] = self._register(job_id, asyncio.get_running_loop())
        self._unregister(job_id, old)
        try:
            async with asyncio.timeout_at(w.deadline):
                mine = {job_id: w.records[job_id]} if job_id in w.records else None
                return True, (await self.read([job_id], mine)).get(job_id)
        except (DatabaseUnavailable, TimeoutError):
            return False, None

    async def _read_batches(self) -> None:
        while self._reads:
            batch, self._reads = self._reads[:_READ_CHUNK], self._reads[_READ_CHUNK:]
            ids = sorted({job_id for wanted, _, _ in batch for job_id in wanted})
            # every submission apart: two resubmissions of one id, each by its record
            submissions = {(j, r) for _, mine, _ in batch for j, r in mine.items()}
            try:
                found, answered = await asyncio.to_thread(
                    submission_outcomes, self._db(), ids, submissions
                )
            except Exception as exc:
                log.warning(
                    "status read failed: %s",
                    exc,
                    extra={"event": "ingest.wait_read_failed", "job_id": ids[0]},
                )
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(DatabaseUnavailable(str(exc)))
                continue
            for wanted, mine, future in batch:
                if not future.done():
                    future.set_result(_answer(wanted, mine, found, answered))

    def _register(self, job_id: str, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.setdefault(job_id, []).append(future)
        return future

    def _unregister(self, job_id: str, future: asyncio.Future[Any]) -> None:
        futures = self._waiting.get(job_id)
        if futures is None:
            return
        futures.remove(future)
        if not futures:
            del self._waiting[job_id]

    def _resolve(self, finals: Finals) -> None:
        """On the loop: the watcher's final events of job ids someone waits for."""
        for job_id, data in finals:
            outcome = outcome_of_event(job_id, data)
            for future in self._waiting.get(job_id, ()):
                if not future.done():
                    future.set_result(outcome if outcome is not None else _REREAD)

    def _reread_all(self) -> None:
        """On the loop: the watcher skipped what was published while it had lost its
        partitions; every waiting request reads its job's status again."""
        for futures in list(self._waiting.values()):
            for future in futures:
                if not future.done():
                    future.set_result(_REREAD)

    @staticmethod
    def _count(waited: Waited) -> Waited:
        WAIT_OUTCOMES.labels(waited.how).inc()
        return waited


def _answer(
    wanted: list[str],
    mine: Mapping[str, Record],
    found: dict[str, JobOutcome],
    answered: dict[tuple[str, Record], JobOutcome],
) -> dict[str, JobOutcome]:
    """One read's outcomes out of its batch's: an id it names with its record, that
    record's (absent while the id has no instance); any other, the id's."""
    out: dict[str, JobOutcome] = {}
    for job_id in wanted:
        record = mine.get(job_id)
        got = found.get(job_id) if record is None else answered.get((job_id, record))
        if got is not None:
            out[job_id] = got
    return out


def outcome_of_event(job_id: str, data: dict[str, Any] | None) -> JobOutcome | None:
    """A final event's data (the contract: ``status``, ``workflow``, ``version``,
    ``time``, and ``result`` or ``error``) as the job's outcome; None when it is not
    the contract's, or tells of another job than the record's key (the waiter then
    reads the status)."""
    if data is None or data.get("job_id") != job_id:
        return None
    try:
        status, workflow, when = data["status"], data["workflow"], data.get("time")
        finished = datetime.fromisoformat(when) if isinstance(when, str) else None
    except (KeyError, ValueError):
        return None
    if not isinstance(status, str) or not isinstance(workflow, str):
        return None
    error = data.get("error")
    return JobOutcome(
        job_id,
        JobKind.WORKFLOW,
        workflow,
        status,
        data.get("result"),
        error if isinstance(error, str) or error is None else str(error),
        data.get("version"),
        finished,
        run=data["run"] if isinstance(data.get("run"), int) else 1,
    )
