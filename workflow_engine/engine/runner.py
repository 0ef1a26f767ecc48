"""The engine process: claim runnable instances, run them durably, hold leases.

* Claims in batches (``FOR UPDATE SKIP LOCKED``, in claim order), up to the free slots
  of its bounded concurrency; several engines can share one database.
* Runs each instance as a coroutine whose lease-guarded writes are group-committed
  (:mod:`workflow_engine.engine.batcher`); a run ends in an
  :data:`~workflow_engine.engine.outcomes.Outcome` that one method applies.
* Its services (:mod:`workflow_engine.engine.services`): the heartbeat extends the
  leases of everything in flight; a rescuer re-queues instances whose lease expired
  (their engine died), so another engine resumes them from their last checkpoint;
  maintenance prunes and counts.
* Wakes on ``LISTEN onceflow_runnable`` (:mod:`workflow_engine.engine.listener`, sent
  when instances are created or rescued), with a polling fallback.
* SIGTERM: stop claiming, let in-flight instances finish for a grace period, release
  the rest, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from sqlalchemy.engine import Engine
from sqlalchemy.pool import QueuePool
from ulid import ULID

from onceflow import failpoints, tracing
from onceflow.health import serve_metrics_and_health
from onceflow.heap import settle_heap
from onceflow.ids import BATCH_SUFFIX
from onceflow.logs import setup_logging
from onceflow.settings import Settings
from onceflow.vocabulary import ControlAction, InstanceStatus, Process, TimeoutKind
from workflow_engine.clock import FakeClock, SystemClock
from workflow_engine.definitions import RetryPolicy, load_workflow_modules
from workflow_engine.engine.backpressure import Backpressure
from workflow_engine.engine.batch_former import BatchFormer
from workflow_engine.engine.batcher import PostgresWrites, WriteBatcher
from workflow_engine.engine.configs import engine_configs
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.engine.emits import StreamLimits
from workflow_engine.engine.job_spans import JobSpans
from workflow_engine.engine.listener import Listener
from workflow_engine.engine.metrics import (
    CLAIM_LATENCY,
    CLAIMED,
    FINISHED,
    INFLIGHT,
    SUBMIT_TO_COMPLETE,
    TIME_LIMITS,
    labelled,
)
from workflow_engine.engine.outcomes import (
    Completed,
    ControlApplied,
    Failed,
    LostLease,
    Outcome,
    Suspended,
)
from workflow_engine.engine.presence import Presence
from workflow_engine.engine.relay import RelayService
from workflow_engine.engine.scheduler import Scheduler
from workflow_engine.engine.services import LeaseKeeper, Maintenance, Rescuer, Run, Service
from workflow_engine.engine.webhook_dispatcher import WebhookDispatcher
from workflow_engine.errors import (
    ControlRequested,
    DeadlinePassed,
    LeaseLost,
    Suspend,
    WorkflowError,
    failed_step_position,
)
from workflow_engine.model import Registry, batch_result_problem
from workflow_engine.store import (
    check_connection,
    database_ready,
    is_transient,
    libpq_dsn,
    make_engine,
    writes,
)
from workflow_engine.store.writes import FinishInstance, Lease, Write

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")


class EngineRunner:
    """The real :class:`~workflow_engine.engine.runtime.Runtime` of workflow contexts."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        db: Engine | None = None,
        default_retry: RetryPolicy | None = None,
        clock: SystemClock | FakeClock | None = None,
    ) -> None:
        self.settings = settings
        #: The workflows this engine runs (and claims: their versions, flow control).
        self.registry = registry
        self.configs = engine_configs(settings)  # the services' configs, checked here
        if settings.webhook_endpoints:  # a subscription to an unknown endpoint stops here
            registry.check_webhooks(settings.webhook_endpoints)
        # Connections: the group-commit writers, the claim loop, the rescuer and
        # maintenance, and the rare single writes (sleeps, waits) — not one per instance.
        pool_size = max(6, min(settings.engine_concurrency, 16))
        self.db = db or make_engine(
            settings.database_url, pool_size=pool_size, lifecycle_events=settings.lifecycle_events
        )
        #: The single writes (``call_db``: sleeps, waits, children, attributes...) in
        #: flight at once: the pool less what the group-commit writers and the engine's
        #: own loops (claim, rescuer, maintenance, backpressure) hold. Past the pool the
        #: engine's calls took overflow connections, each opened for one transaction and
        #: closed after it (a new backend, its prepared statements planned again): at 64
        #: in flight a workflow with one ``ctx.set_attributes`` ran at 0.24 of the plain
        #: one (BENCHMARKS.md, "What each run control costs"). Waiting here is free.
        pool = getattr(self.db, "pool", None)  # a test's stand-in may have none
        pooled = pool.size() if isinstance(pool, QueuePool) else pool_size
        self._single_writes = asyncio.Semaphore(max(2, pooled - self.configs.batcher.writers - 3))
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{str(ULID())[-6:]}"
        self.default_retry = default_retry
        self.clock = clock or SystemClock()
        self.max_result_bytes = settings.step_result_max_bytes
        # Sync step code and database calls run in threads: one per instance slot, plus
        # a few for the heartbeat, rescuer and claim loop (also the loop's default
        # executor, ``_main``).
        self.step_executor = ThreadPoolExecutor(
            max_workers=settings.engine_concurrency + 8, thread_name_prefix="engine"
        )
        self.stream_limits = StreamLimits(
            settings.stream_value_max_bytes, settings.stream_max_values, settings.stream_max_bytes
        )
        self._init_runs(settings.engine_concurrency)
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self.batcher = WriteBatcher(PostgresWrites(self.db, self.owner), self.configs.batcher)
        #: Holds the claims back while the outbox is too deep (None: events off).
        self.backpressure = (
            Backpressure(self.db, self.configs.backpressure) if self.configs.backpressure else None
        )
        self._traced = tracing.enabled()

    def _init_runs(self, concurrency: int) -> None:
        """The bookkeeping of the runs this engine holds, each by ``(job_id, claim)``."""
        #: The runs in flight by job id, each with the claim it runs under: a run that
        #: ends removes only its own entry (``_run_instance``), and the claim skips
        #: these ids (``writes.claim``'s ``inflight``).
        self._inflight: dict[str, Run] = {}
        #: At most ``concurrency`` runs execute at once: a run holds one of these from
        #: its start until it is forgotten (``_forget``), lingering step code too.
        self._slots = asyncio.Semaphore(concurrency)
        self._holding: set[tuple[str, int]] = set()
        #: Runs past their workflow code with only their finish to commit: their slots
        #: are as good as free, so the claim loop claims for them too, and an instance
        #: claimed for one waits for the first slot to free (``_settles_alone``,
        #: ``_take_slot``). A run whose finish raised leaves this set at once; all leave
        #: it when a run waiting for a slot times out (a finish is stuck).
        self._settling: set[tuple[str, int]] = set()
        #: Claimed runs that did not start because the engine is stopping (cancelled by
        #: the drain, their slot came after SIGTERM, or timed out then): the drain gives
        #: them back with the runs it cut.
        self._unstarted: list[tuple[str, int]] = []
        #: The runs that ended (cancelled) while their sync step code still runs in a
        #: thread, by ``(job_id, claim)``: done once that code has returned.
        self._lingering: dict[tuple[str, int], asyncio.Future[Any]] = {}

    async def write(self, write: Write[T]) -> T:
        """A lease-guarded write, committed together with other instances' writes."""
        return await self.batcher.write(write)

    async def call_db(
        self, fn: Callable[Concatenate[Engine, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run a blocking store function for an instance off the event loop (at most
        ``_single_writes`` at once)."""
        async with self._single_writes:
            return await asyncio.to_thread(fn, self.db, *args, **kwargs)

    async def _loop_db(
        self, fn: Callable[Concatenate[Engine, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``call_db`` for the claim loop's own calls (claim, expiry, next timer): one at
        a time, counted in the pool's reserve, never queued behind the instances'."""
        return await asyncio.to_thread(fn, self.db, *args, **kwargs)

    # --- main loops ---------------------------------------------------------------

    async def run(self) -> None:
        listener = Listener(libpq_dsn(self.db), self._wake.set)
        listener.start()
        log.info(
            "engine started",
            extra={
                "event": "engine.started",
                "engine_id": self.owner,
                "concurrency": self.settings.engine_concurrency,
            },
        )
        writer = asyncio.create_task(self.batcher.run())
        services = self._services()
        for service in services:
            service.start()
        try:
            await self._claim_loop()
        finally:
            await listener.stop()
            await self._drain()
            for service in services:
                await service.stop()
            writer.cancel()
            log.info("engine stopped", extra={"event": "engine.stopped", "engine_id": self.owner})

    def _services(self) -> list[Service]:
        c = self.configs
        extra: list[Service] = [] if self.backpressure is None else [self.backpressure]
        if c.relay is not None:
            extra.append(RelayService(self.db, c.relay))
        if c.webhooks is not None:
            extra.append(
                WebhookDispatcher(
                    self.db,
                    self.registry,
                    self.settings.webhook_endpoints,
                    c.webhooks,
                    f"{self.owner}:webhooks",
                )
            )
        if batched := self.registry.batches():
            extra.append(BatchFormer(self.db, self.clock, batched))
        return [
            *extra,
            LeaseKeeper(self.batcher, self._inflight, c.lease_keeper),
            Rescuer(self.db, c.rescuer),
            Maintenance(self.db, c.maintenance),
            Presence(self.db, self.owner, self.registry.versions(), c.presence),
            Scheduler(
                self.db,
                self.clock,
                c.scheduler,
                self.registry.schedules(),
                self.registry,
            ),
        ]

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._slot_free.set()

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            free = self.settings.engine_concurrency - len(self._inflight) + len(self._settling)
            if free <= 0:
                self._slot_free.clear()
                await self._full_wait()
                continue
            if self.backpressure is not None and not self.backpressure.open:
                # The outbox is too deep: no new work until the relay catches up.
                await self.backpressure.wait_open(self.settings.engine_poll_interval_seconds)
                continue
            self._wake.clear()
            want = min(free, self.settings.claim_batch_size)
            got = await self._claim(want)
            if got is None:
                await self._wait_wake(self.settings.engine_poll_interval_seconds)
                continue
            claimed, expired = got
            for inst in claimed:
                task = asyncio.create_task(self._run_instance(inst))
                self._inflight[inst.job_id] = Run(inst.claim_count, task)
            INFLIGHT.set(len(self._inflight))
            # A short claim whose expiry errored some is not an empty queue: its pick
            # may have spent the batch on instances past their start limit (never
            # leased) with work due behind them, so it claims again at once.
            if len(claimed) < want and not expired:
                await self._wait_wake(await self._idle_wait())

    async def _claim(self, limit: int) -> tuple[list[writes.Claimed], bool] | None:
        """Claim up to ``limit`` instances, and whether the claim's expiry errored any
        (start_within); ``None`` if the claim failed."""
        started = time.perf_counter()
        expired: list[tuple[str, str]] = []
        try:
            claimed = await self._loop_db(
                writes.claim,
                self.owner,
                limit,
                self.settings.engine_lease_seconds,
                self.clock.db_now(),
                self.registry.versions(),
                self.registry.flows(),
                tuple(self._inflight),
                self.registry.execution_timeouts(),
                expired,
            )
            await failpoints.hit_async("engine.after_claim")
        except Exception:
            log.exception("claim failed; retrying", extra={"event": "engine.claim_error"})
            return None
        _count_expired(expired)
        CLAIM_LATENCY.observe(time.perf_counter() - started)
        CLAIMED.inc(len(claimed))
        return claimed, bool(expired)

    async def _full_wait(self) -> None:
        """No free slot: wait for one; each poll interval without one, run the start
        limit expiry on its own (a full engine claims nothing, so the instances it
        could not start in time would otherwise wait for a slot to be errored)."""
        poll = self.settings.engine_poll_interval_seconds
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._slot_free.wait(), poll)
            return
        try:
            expired = await self._loop_db(writes.expire_due)
        except Exception:
            log.exception("expiry failed", extra={"event": "engine.expiry_error"})
            return
        _count_expired(expired)

    async def _idle_wait(self) -> float:
        """Sleep until the next timer falls due, a notification, or the poll interval."""
        poll = self.settings.engine_poll_interval_seconds
        try:
            due = await self._loop_db(writes.seconds_until_next_due, self.clock.db_now())
        except Exception:
            return poll
        if due is None or due <= 0:
            # Nothing timed, or due work that this engine could not claim (another engine
            # holds it, or a concurrency limit is full): wait for a wake-up or the poll.
            return poll
        return min(poll, due)

    async def _wait_wake(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _drain(self) -> None:
        """On shutdown: let in-flight instances finish for half a lease, then cancel the
        rest and release their leases so another engine resumes them at once."""
        if not self._inflight and not self._unstarted:
            return
        grace = self.settings.engine_lease_seconds / 2
        runs = dict(self._inflight)
        # Claimed, not started: cut now, and given back whatever their task got to do
        # (one cancelled before its first step never reaches ``_not_started``).
        waiting = [
            (job, run.claim) for job, run in runs.items() if (job, run.claim) not in self._holding
        ]
        for job, _ in waiting:
            runs[job].task.cancel()
        pending: set[asyncio.Task[None]] = set()
        if runs:  # (the only claimed runs may all be unstarted and forgotten already)
            _, pending = await asyncio.wait([run.task for run in runs.values()], timeout=grace)
        unfinished = [(job, run.claim) for job, run in runs.items() if run.task in pending]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        unfinished = list(dict.fromkeys((*unfinished, *waiting, *self._unstarted)))
        await self._step_code_returned(unfinished)
        if unfinished:
            await failpoints.hit_async("engine.before_release")
            released = await self.call_db(writes.release, self.owner, unfinished)
            log.info(
                "released unfinished instances",
                extra={"event": "engine.released", "count": released},
            )

    async def _step_code_returned(self, runs: list[tuple[str, int]]) -> None:
        """Wait until the sync step code of cancelled ``runs`` has returned. A thread
        cannot be stopped: a run given back while its step still executes here would be
        claimed by the next engine and run that step a second time beside it (found in
        review). The process could not exit before that code returns anyway (the
        executor's threads are joined at exit), and the heartbeat, still running during
        the drain, keeps the leases meanwhile."""
        lingering = [self._lingering[run] for run in runs if run in self._lingering]
        if not lingering:
            return
        log.warning(
            "waiting for step code still running in %d cancelled run(s) before giving them back",
            len(lingering),
            extra={"event": "engine.drain_waits_for_steps", "count": len(lingering)},
        )
        await asyncio.wait(lingering)

    # --- one instance ----------------------------------------------------------------

    async def _run_instance(self, inst: writes.Claimed) -> None:
        job = inst.job_id
        if not await self._take_slot(inst):
            return
        try:
            ctx = self._context(inst)
        except BaseException:
            self._forget(inst)
            raise
        try:
            outcome = await self._execute(inst, ctx)
            if self._settles_alone(inst, outcome, ctx):
                # The claim loop is not woken for it: it claims for settling slots when
                # a slot really frees or it polls. Woken at every settle, it made claims
                # of one or two at a time, each a few round trips (0.82-0.99 of the
                # throughput at 256 in flight; BENCHMARKS.md, "Where a workflow's time
                # goes at concurrency 16").
                self._settling.add((job, inst.claim_count))
            try:
                await self._settle(inst, outcome, ctx)
            except BaseException:
                # its finish failed: what follows (a give-back through an outage, an
                # errored finish) is not one commit away, so nothing more is claimed
                # for the slot meanwhile
                self._settling.discard((job, inst.claim_count))
                raise
        except LeaseLost as exc:
            log.warning("%s", exc, extra={"event": "engine.lease_lost", "job_id": job})
        except asyncio.CancelledError:
            log.info("run cancelled", extra={"event": "instance.cancelled", "job_id": job})
        except Exception as exc:
            log.exception("run crashed", extra={"event": "instance.crashed", "job_id": job})
            if is_transient(exc):
                await self._give_back(job, inst.claim_count)
            else:
                await self._fail_crashed(inst, exc)
        finally:
            lingering = ctx.step_threads()
            if lingering:
                # A cancelled run (its lease lost) whose step code still runs in its
                # thread: a thread cannot be stopped, so the id stays in flight, and this
                # engine does not claim it again, until that code returns.
                waiting = asyncio.gather(*lingering, return_exceptions=True)
                self._lingering[(job, inst.claim_count)] = waiting
                waiting.add_done_callback(lambda _: self._forget(inst))
            else:
                self._forget(inst)

    async def _fail_crashed(self, inst: writes.Claimed, exc: Exception) -> None:
        """A run that failed outside the workflow's code for a reason that is not the
        database's outage (settling it raised): error the instance, so it is not left
        ``running`` to be rescued and crash again on every lease, forever (found in
        review). Whatever its last write carried is lost with the run; the error says
        what happened."""
        error = f"engine error while running it: {type(exc).__name__}: {exc}"[:2000]
        finish = FinishInstance(inst.job_id, inst.claim_count, InstanceStatus.ERRORED, None, error)
        try:
            await self.write(finish)
        except Exception:
            log.exception(
                "could not mark the crashed run errored; the rescuer will re-queue it",
                extra={"event": "instance.crash_unrecorded", "job_id": inst.job_id},
            )
            return
        labelled(FINISHED, inst.workflow, InstanceStatus.ERRORED).inc()

    async def _take_slot(self, inst: writes.Claimed) -> bool:
        """Wait for a slot to run ``inst`` in; False if it is not to run. A run claimed
        for a settling slot waits for the first slot to free (FIFO), normally that run's
        finish; if none frees within a heartbeat interval, the run is given back before
        any of its code ran, for any engine to take, instead of waiting here leased. (To
        the database it had started: its claim set ``started_at``, its deadline, its
        ``instance.started`` event.)"""
        key = (inst.job_id, inst.claim_count)
        try:
            try:
                if not self._slots.locked():
                    await self._slots.acquire()  # a slot is free: taken without a wait
                else:
                    # asyncio.timeout, not wait_for: 3.11's wait_for can drop a permit
                    # its inner acquire got just as it was cancelled; a cancelled acquire
                    # passes it on
                    async with asyncio.timeout(self.configs.lease_keeper.heartbeat_seconds):
                        await self._slots.acquire()
            except TimeoutError:
                # A finish is stuck (blocked on a lock, say): no settling slot is lent
                # any more, or the claim loop would claim again for it at once, this same
                # instance likely, and bounce it every heartbeat (found in review).
                self._settling.clear()
                if not self._stopping.is_set():  # (during a drain, the drain gives it back)
                    await self._give_back(inst.job_id, inst.claim_count)
                self._not_started(inst)
                return False
        except asyncio.CancelledError:
            # Abandoned (its lease lost) or cut by the drain: nothing of it ran.
            self._not_started(inst)
            return False
        self._holding.add(key)
        if self._stopping.is_set():  # the slot came after SIGTERM: start nothing new
            self._not_started(inst)
            return False
        return True

    def _not_started(self, inst: writes.Claimed) -> None:
        """A claimed run that never started: during a shutdown the drain gives it back
        with the runs it cut; otherwise it was given back already (``_take_slot`` timed
        out) or its lease is gone (the heartbeat found it taken)."""
        if self._stopping.is_set():
            self._unstarted.append((inst.job_id, inst.claim_count))
        self._forget(inst)

    def _settles_alone(self, inst: writes.Claimed, outcome: Outcome, ctx: WorkflowContext) -> bool:
        """Whether the claim may take ``inst``'s slot before its last write commits: a
        finish (complete or errored) of a workflow without flow control, with none of
        its step code still running. The claim (a few round trips) then overlaps that
        commit instead of following it: at 16 in flight a slot stood empty ~12 ms
        between two runs, a third of a run's time (BENCHMARKS.md, "Where a workflow's
        time goes at concurrency 16"). Never while step code still runs in a thread:
        that slot is not free until the code returns, which may be long, and an
        instance claimed for it would wait (its execution deadline running) where
        another engine could have run it. Not a flow-controlled one: its finish frees a slot
        of its key that a queued instance of higher priority waits for, and a claim made
        before that commit would pass it over for lower-priority work (found in review).
        Not a suspension or an operator's action, which may make ``inst`` itself runnable
        again at once (a claim skips the ids in flight)."""
        if not isinstance(outcome, Completed | Failed) or not ctx.steps_returned():
            return False
        definition = self.registry.workflow(inst.workflow)
        return definition is None or definition.flow is None

    def _forget(self, inst: writes.Claimed) -> None:
        """The run of ``inst``'s claim is over: free its slot (a newer run's is kept)."""
        key = (inst.job_id, inst.claim_count)
        self._settling.discard(key)
        if key in self._holding:
            self._holding.discard(key)
            self._slots.release()
        self._lingering.pop(key, None)
        run = self._inflight.get(inst.job_id)
        if run is not None and run.claim == inst.claim_count:
            del self._inflight[inst.job_id]
        INFLIGHT.set(len(self._inflight))
        self._slot_free.set()
        definition = self.registry.workflow(inst.workflow)
        if definition is not None and definition.flow is not None:
            self._wake.set()  # it freed a limited slot: an instance it held may go

    def _context(self, inst: writes.Claimed) -> WorkflowContext:
        definition = self.registry.workflow(inst.workflow)
        ctx = WorkflowContext(
            self,
            Lease(self.owner, inst.claim_count),
            inst.job_id,
            inst.workflow,
            inst.history,
            version=inst.version,
            engine_version=definition.version if definition else None,
            inline_steps=definition.inline_steps if definition else False,
            run=inst.run,
        )
        if self._traced:
            ctx.spans = JobSpans.of(inst.traceparent, inst.job_id, inst.workflow, inst.claim_count)
        return ctx

    async def _execute(self, inst: writes.Claimed, ctx: WorkflowContext) -> Outcome:
        """Run the workflow function (from the top: replay) and say how it ended."""
        definition = self.registry.workflow(inst.workflow)
        if definition is None:
            return Failed(f"unknown workflow {inst.workflow!r}")
        if inst.overdue:
            # Claimed past its deadline (a sleep or wait woken at it, a rescue, a
            # resume): errored at this boundary, without replaying it.
            return _timed_out("execution deadline passed before it ran again", inst)
        if definition.batch is not None and not inst.job_id.endswith(BATCH_SUFFIX):
            # a member created as a plain instance: its worker did not load the module,
            # or a schedule made with the CLI or API ticked (a tick is never a member)
            return Failed(
                f"{inst.workflow!r} runs its jobs in batches, but this job was created to run"
                " on its own (by a worker that does not load the workflow's module, or a"
                " schedule's tick)"
            )
        fn = definition.fn
        log.info(
            "instance running",
            extra={
                "event": "instance.running",
                "job_id": inst.job_id,
                "workflow": inst.workflow,
                "claim": inst.claim_count,
                "run": inst.run,
            },
        )
        try:
            value = await fn(ctx, inst.params)
            if definition.batch is not None and (wrong := batch_result_problem(value, inst.params)):
                return Failed(wrong)
            return Completed(writes.encode_result(value, self.max_result_bytes))
        except Suspend as wait:
            wake_at = cast("datetime | None", wait.wake_at)
            return Suspended(InstanceStatus(wait.status), wake_at, wait.delay)
        except DeadlinePassed as passed:
            return _timed_out(passed.message, inst)
        except ControlRequested as control:
            return ControlApplied(ControlAction(control.action))
        except LeaseLost as exc:
            return LostLease(str(exc))
        except WorkflowError as exc:
            return Failed(str(exc), failed_step_position(exc))
        except Exception as exc:
            if is_transient(exc):
                raise  # the database failed, not the workflow: _run_instance gives it back
            return Failed(f"{type(exc).__name__}: {exc}", failed_step_position(exc))

    async def _give_back(self, job_id: str, claim: int) -> None:
        """A database outage or failover cut a run: its last write may or may not have
        committed, so it is not retried; the instance goes back to the queue and its next
        claim replays it from what did commit (a step whose checkpoint was lost runs
        again, with the same idempotency key). Tried until the database answers; if the
        lease expires first, the rescuer re-queues it and this release changes nothing
        (it is guarded by the lease owner), so trying longer is harmless."""
        delay = 0.1
        while not self._stopping.is_set():
            try:
                given = await self.call_db(writes.release, self.owner, [(job_id, claim)])
            except Exception as exc:
                if not is_transient(exc):
                    return
            else:
                if given:
                    log.info(
                        "run given back", extra={"event": "engine.gave_back", "job_id": job_id}
                    )
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)

    async def _settle(self, inst: writes.Claimed, outcome: Outcome, ctx: WorkflowContext) -> None:
        """Record how a run ended. The last step's checkpoint, if the run still holds
        it, commits with the finish, or before a suspension or a control action."""
        match outcome:
            case Completed(result):
                await self._finish(inst, ctx, InstanceStatus.COMPLETE, result=result)
            case Failed(error, position, timeout):
                await self._finish(
                    inst,
                    ctx,
                    InstanceStatus.ERRORED,
                    error=error,
                    failed_position=position,
                    timeout=timeout,
                )
            case Suspended():
                await ctx.flush()
                await self._suspend(inst, outcome)
            case ControlApplied(action):
                await ctx.flush()
                await self._apply_control(inst, action)
            case LostLease(reason):
                log.warning(
                    "%s", reason, extra={"event": "engine.lease_lost", "job_id": inst.job_id}
                )

    async def _suspend(self, inst: writes.Claimed, wait: Suspended) -> None:
        await failpoints.hit_async("engine.before_suspend", inst.job_id)
        try:
            runnable = await self.call_db(
                writes.suspend,
                Lease(self.owner, inst.claim_count),
                inst.job_id,
                wait.status,
                self.clock.db_now(),
                wait.wake_at,
                wait.delay,
            )
        except ControlRequested as control:
            # An operator's request came in after the run's last write: the suspend
            # re-checked it under the row lock and left it to apply, not to wait on.
            await self._apply_control(inst, ControlAction(control.action))
            return
        self._wake_for(inst, wait)
        log.info(
            "instance %s",
            wait.status,
            extra={
                "event": f"instance.{wait.status}",
                "job_id": inst.job_id,
                "run": inst.run,
                "wake_at": wait.wake_at,
                "delay": wait.delay,
                "runnable": runnable,  # what it waits for was already there
            },
        )

    def _wake_for(self, inst: writes.Claimed, wait: Suspended) -> None:
        """Wake the claim loop when a suspension falls due before the loop's next poll
        (its timer, or the execution deadline the store woke it at): the loop computed
        its wait before this run suspended. Later ones the loop's next wait sees. On the
        real clock only (a test clock's time is the test's to move)."""
        if self.clock.db_now() is not None:
            return
        now = datetime.now(UTC)
        timer = now + timedelta(seconds=wait.delay) if wait.delay is not None else wait.wake_at
        due = [t for t in (timer, inst.deadline) if t is not None]
        if not due:
            return
        seconds = max((min(due) - now).total_seconds(), 0.0)
        if seconds < self.settings.engine_poll_interval_seconds:
            asyncio.get_running_loop().call_later(seconds + 0.005, self._wake.set)

    async def _apply_control(self, inst: writes.Claimed, seen: ControlAction) -> None:
        """Apply the request the run stopped for (``seen``), or what replaced it."""
        await failpoints.hit_async("engine.before_control_apply", inst.job_id)
        new_status, action = await self.call_db(
            writes.apply_requested, Lease(self.owner, inst.claim_count), inst.job_id
        )
        if new_status == InstanceStatus.TERMINATED:
            labelled(FINISHED, inst.workflow, new_status).inc()
        if action is None and new_status != writes.LOST:
            log.info(
                "operator %s withdrawn; instance re-queued",
                seen,
                extra={"event": "instance.request_withdrawn", "job_id": inst.job_id},
            )
            return
        log.warning(
            "operator %s applied",
            action or seen,
            extra={
                "event": f"instance.{action or seen}",
                "job_id": inst.job_id,
                "run": inst.run,
                "status": new_status,
            },
        )

    async def _finish(
        self,
        inst: writes.Claimed,
        ctx: WorkflowContext,
        status: InstanceStatus,
        result: bytes | None = None,
        error: str | None = None,
        failed_position: int | None = None,
        timeout: TimeoutKind | None = None,
    ) -> None:
        await failpoints.hit_async("engine.before_finish", inst.job_id)
        finish = FinishInstance(
            inst.job_id, inst.claim_count, status, result, error, failed_position, timeout
        )
        await ctx.commit(finish)
        labelled(FINISHED, inst.workflow, status).inc()
        if timeout is not None:
            labelled(TIME_LIMITS, inst.workflow, timeout).inc()
        if self._traced and (spans := JobSpans.of(inst.traceparent, *_ids(inst))):
            spans.finished(status, error)
        if inst.submitted_at is not None:
            labelled(SUBMIT_TO_COMPLETE, inst.workflow).observe(
                (datetime.now(UTC) - inst.submitted_at).total_seconds()
            )
        level = logging.INFO if status == InstanceStatus.COMPLETE else logging.WARNING
        log.log(
            level,
            "instance %s",
            status,
            extra={
                "event": f"instance.{status}",
                "job_id": inst.job_id,
                "workflow": inst.workflow,
                "run": inst.run,
                "error": error,
            },
        )


def run_engine(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, "engine")
    tracing.setup(settings, Process.ENGINE)
    registry = load_workflow_modules(settings.workflow_modules)
    names = registry.workflow_names()
    runner = EngineRunner(settings, registry)
    check_connection(runner.db)
    serve_metrics_and_health(
        settings.engine_metrics_port, lambda: {"postgres": database_ready(settings.database_url)}
    )
    log.info("workflows loaded: %s", ", ".join(names), extra={"event": "engine.workflows"})
    # What is loaded by now (modules, the registry, settings, the pool) lives as long as
    # the process: moved out of the collector's generations (onceflow.heap).
    settle_heap()
    asyncio.run(_main(runner))


async def _main(runner: EngineRunner) -> None:
    asyncio.get_running_loop().set_default_executor(runner.step_executor)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runner.stop)
    await runner.run()


def _count_expired(expired: list[tuple[str, str]]) -> None:
    """The instances a claim errored for their start limit (start_timeout)."""
    for job_id, workflow in expired:
        labelled(FINISHED, workflow, InstanceStatus.ERRORED).inc()
        labelled(TIME_LIMITS, workflow, TimeoutKind.START_TIMEOUT).inc()
        log.warning(
            "instance not started within its start limit",
            extra={"event": "instance.start_timeout", "job_id": job_id, "workflow": workflow},
        )


def _timed_out(why: str, inst: writes.Claimed) -> Failed:
    """The outcome of a run stopped by its execution deadline (``timed_out``)."""
    deadline = inst.deadline.isoformat() if inst.deadline is not None else "?"
    error = f"{TimeoutKind.TIMED_OUT}: {why} (deadline {deadline})"
    return Failed(error, None, TimeoutKind.TIMED_OUT)


def _ids(inst: writes.Claimed) -> tuple[str, str, int]:
    return inst.job_id, inst.workflow, inst.claim_count
