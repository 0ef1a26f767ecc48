"""The engine process: claim runnable instances, run them durably, hold leases.

* Claims in batches with one ``FOR UPDATE SKIP LOCKED`` statement, up to the free
  slots of its bounded concurrency; several engines can share one database.
* Heartbeats extend the leases of everything in flight; a rescuer re-queues instances
  whose lease expired (their engine died), so another engine resumes them from their
  last checkpoint.
* Wakes on ``LISTEN onceflow_runnable`` (sent when instances are created or rescued),
  with a polling fallback.
* SIGTERM: stop claiming, let in-flight instances finish for a grace period, release
  the rest, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg2
from sqlalchemy.engine import Engine
from ulid import ULID

from onceflow.core.health import serve_metrics_and_health
from onceflow.core.logs import setup_logging
from onceflow.core.settings import Settings
from workflow_engine.clock import FakeClock, SystemClock
from workflow_engine.definitions import (
    RetryPolicy,
    concurrency_limits,
    get_workflow,
    load_workflow_modules,
)
from workflow_engine.engine.batcher import WriteBatcher
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.engine.metrics import (
    CLAIM_LATENCY,
    CLAIMED,
    FINISHED,
    INFLIGHT,
    INSTANCES_BY_STATUS,
    PRUNED,
    RESCUED,
    RUNNABLE_BACKLOG,
    SUBMIT_TO_COMPLETE,
)
from workflow_engine.errors import ControlRequested, LeaseLost, Suspend, WorkflowError
from workflow_engine.store import control as control_ops
from workflow_engine.store import execution as store
from workflow_engine.store import maintenance
from workflow_engine.store.db import check_connection, database_ready, make_engine
from workflow_engine.store.instances import RUNNABLE_CHANNEL

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineRunner:
    def __init__(
        self,
        settings: Settings,
        engine: Engine | None = None,
        default_retry: RetryPolicy | None = None,
        clock: SystemClock | FakeClock | None = None,
    ) -> None:
        self.settings = settings
        # Connections: the group-commit writers, the claim loop, the rescuer and
        # maintenance, and the rare single writes (sleeps, waits) — not one per instance.
        self.engine = engine or make_engine(
            settings.database_url, pool_size=max(6, min(settings.engine_concurrency, 16))
        )
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{str(ULID())[-6:]}"
        self.default_retry = default_retry
        self.clock = clock or SystemClock()
        self.max_result_bytes = settings.step_result_max_bytes
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self.batcher = WriteBatcher(self.engine, self.owner)

    async def write(self, kind: str, *args: Any) -> Any:
        """A lease-guarded write, committed together with other instances' writes."""
        return await self.batcher.write(kind, *args)

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store function off the event loop."""
        return await asyncio.to_thread(fn, self.engine, *args)

    # --- main loops ---------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        listener = threading.Thread(target=self._listen, args=(loop,), daemon=True)
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
        side = [
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._rescue_loop()),
            asyncio.create_task(self._maintenance_loop()),
        ]
        try:
            await self._claim_loop()
        finally:
            await self._drain()
            for task in side:
                task.cancel()
            writer.cancel()
            log.info("engine stopped", extra={"event": "engine.stopped", "engine_id": self.owner})

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._slot_free.set()

    async def _claim_loop(self) -> None:
        s = self.settings
        while not self._stopping.is_set():
            free = s.engine_concurrency - len(self._inflight)
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            self._wake.clear()
            started = time.perf_counter()
            try:
                claimed = await self.db(
                    store.claim,
                    self.owner,
                    min(free, s.engine_claim_batch),
                    s.engine_lease_seconds,
                    self.clock.db_now(),
                    concurrency_limits(),
                )
            except Exception:
                log.exception("claim failed; retrying", extra={"event": "engine.claim_error"})
                await self._wait_wake(s.engine_poll_interval_seconds)
                continue
            CLAIM_LATENCY.observe(time.perf_counter() - started)
            CLAIMED.inc(len(claimed))
            for inst in claimed:
                self._inflight[inst.job_id] = asyncio.create_task(self._run_instance(inst))
            INFLIGHT.set(len(self._inflight))
            if len(claimed) < min(free, s.engine_claim_batch):
                await self._wait_wake(await self._idle_wait())

    async def _idle_wait(self) -> float:
        """Sleep until the next timer falls due, a notification, or the poll interval."""
        poll = self.settings.engine_poll_interval_seconds
        try:
            due = await self.db(store.seconds_until_next_due, self.clock.db_now())
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

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.engine_lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            ids = list(self._inflight)
            try:
                kept = await self.write("heartbeat", ids, self.settings.engine_lease_seconds)
            except Exception:
                log.exception("heartbeat failed", extra={"event": "engine.heartbeat_error"})
                continue
            for lost in set(ids) - kept:
                task = self._inflight.get(lost)
                if task is not None and not task.done():
                    log.warning(
                        "lease lost; abandoning run",
                        extra={"event": "engine.lease_lost", "job_id": lost},
                    )
                    task.cancel()

    async def _rescue_loop(self) -> None:
        interval = max(1.0, self.settings.engine_lease_seconds / 2)
        while True:
            try:
                rescued = await self.db(store.rescue_expired)
            except Exception:
                log.exception("rescue failed", extra={"event": "engine.rescue_error"})
                rescued = []
            for job_id in rescued:
                RESCUED.inc()
                log.warning(
                    "expired lease re-queued",
                    extra={"event": "engine.lease_rescued", "job_id": job_id},
                )
            await asyncio.sleep(interval)

    async def _maintenance_loop(self) -> None:
        """Retention and the gauges that need a query; one engine at a time prunes."""
        s = self.settings
        while True:
            try:
                pruned = await self.db(
                    maintenance.prune, s.retention_instances_seconds, s.retention_job_ids_seconds
                )
                for kind, count in pruned.items():
                    PRUNED.labels(kind).inc(count)
                counts = await self.db(maintenance.status_counts)
                INSTANCES_BY_STATUS.clear()
                for (workflow, status), n in counts.by_workflow_status.items():
                    INSTANCES_BY_STATUS.labels(workflow, status).set(n)
                RUNNABLE_BACKLOG.set(counts.runnable_due)
            except Exception:
                log.exception("maintenance failed", extra={"event": "engine.maintenance_error"})
            await asyncio.sleep(s.maintenance_interval_seconds)

    async def _drain(self) -> None:
        """On shutdown: let in-flight instances finish for half a lease, then cancel the
        rest and release their leases so another engine resumes them at once."""
        if not self._inflight:
            return
        grace = self.settings.engine_lease_seconds / 2
        _, pending = await asyncio.wait(list(self._inflight.values()), timeout=grace)
        unfinished = [job for job, task in self._inflight.items() if task in pending]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        if unfinished:
            released = await self.db(store.release, self.owner, unfinished)
            log.info(
                "released unfinished instances",
                extra={"event": "engine.released", "count": released},
            )

    # --- one instance ----------------------------------------------------------------

    async def _run_instance(self, inst: store.Claimed) -> None:
        job = inst.job_id
        try:
            fn = get_workflow(inst.workflow)
            if fn is None:
                await self._finish(inst, "errored", error=f"unknown workflow {inst.workflow!r}")
                return
            ctx = WorkflowContext(self, job, inst.workflow, inst.history)
            log.info(
                "instance running",
                extra={
                    "event": "instance.running",
                    "job_id": job,
                    "workflow": inst.workflow,
                    "claim": inst.claim_count,
                },
            )
            try:
                value = await fn(ctx, inst.params)
                encoded = store.encode_result(value, self.max_result_bytes)
            except Suspend as wait:
                await self.db(
                    store.suspend,
                    self.owner,
                    job,
                    wait.status,
                    self.clock.db_now(),
                    wait.wake_at,
                    wait.delay,
                )
                log.info(
                    "instance %s",
                    wait.status,
                    extra={
                        "event": f"instance.{wait.status}",
                        "job_id": job,
                        "wake_at": wait.wake_at,
                        "delay": wait.delay,
                    },
                )
                return
            except ControlRequested as control:
                new_status = await self.db(
                    control_ops.apply_requested, self.owner, job, control.action
                )
                if new_status in ("terminated",):
                    FINISHED.labels(inst.workflow, new_status).inc()
                log.warning(
                    "operator %s applied",
                    control.action,
                    extra={
                        "event": f"instance.{control.action}",
                        "job_id": job,
                        "status": new_status,
                    },
                )
                return
            except LeaseLost:
                raise
            except WorkflowError as exc:
                await self._finish(inst, "errored", error=str(exc))
                return
            except Exception as exc:
                await self._finish(inst, "errored", error=f"{type(exc).__name__}: {exc}")
                return
            await self._finish(inst, "complete", result=encoded)
        except LeaseLost as exc:
            log.warning("%s", exc, extra={"event": "engine.lease_lost", "job_id": job})
        except asyncio.CancelledError:
            log.info("run cancelled", extra={"event": "instance.cancelled", "job_id": job})
        except Exception:
            # A database outage mid-run: leave the lease to expire so it is retried.
            log.exception("run crashed", extra={"event": "instance.crashed", "job_id": job})
        finally:
            self._inflight.pop(job, None)
            INFLIGHT.set(len(self._inflight))
            self._slot_free.set()

    async def _finish(
        self,
        inst: store.Claimed,
        status: str,
        result: bytes | None = None,
        error: str | None = None,
    ) -> None:
        await self.write("finish_instance", inst.job_id, status, result, error)
        FINISHED.labels(inst.workflow, status).inc()
        if inst.submitted_at is not None:
            SUBMIT_TO_COMPLETE.labels(inst.workflow).observe(
                (datetime.now(UTC) - inst.submitted_at).total_seconds()
            )
        level = logging.INFO if status == "complete" else logging.WARNING
        log.log(
            level,
            "instance %s",
            status,
            extra={
                "event": f"instance.{status}",
                "job_id": inst.job_id,
                "workflow": inst.workflow,
                "error": error,
            },
        )

    # --- LISTEN/NOTIFY ----------------------------------------------------------------

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking LISTEN in a thread; each notification wakes the claim loop."""
        dsn = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self._stopping.is_set():
            try:
                conn = psycopg2.connect(dsn)
                conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
                conn.cursor().execute(f"LISTEN {RUNNABLE_CHANNEL}")
                while not self._stopping.is_set():
                    if select.select([conn], [], [], 1.0)[0]:
                        conn.poll()
                        if conn.notifies:
                            conn.notifies.clear()
                            loop.call_soon_threadsafe(self._wake.set)
            except Exception:
                log.warning(
                    "LISTEN connection lost; polling until it is back",
                    extra={"event": "engine.listen_error"},
                )
                time.sleep(1.0)


def run_engine(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, "engine")
    names = load_workflow_modules(settings.workflow_modules)
    runner = EngineRunner(settings)
    check_connection(runner.engine)
    serve_metrics_and_health(
        settings.engine_metrics_port, lambda: {"postgres": database_ready(settings.database_url)}
    )
    log.info("workflows loaded: %s", ", ".join(names), extra={"event": "engine.workflows"})
    asyncio.run(_main(runner, settings.engine_concurrency))


async def _main(runner: EngineRunner, concurrency: int) -> None:
    # Sync step code and database calls run in threads: one per instance slot, plus
    # a few for the heartbeat, rescuer and claim loop.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=concurrency + 8, thread_name_prefix="engine")
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runner.stop)
    await runner.run()
