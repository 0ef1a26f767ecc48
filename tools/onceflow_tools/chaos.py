"""``onceflow chaos``: the property under faults, on the real services.

A seeded run: a few thousand jobs, each submitted 1-3 times (some resubmissions with
different params) from concurrent clients, while a fault schedule runs against two
streams workers and two engines: SIGKILL a worker, a worker that SIGKILLs itself
between its database commit and its offset commit, restart the Kafka broker, restart
PostgreSQL (with ``--postgres-ha``: SIGKILL the primary of the pg_auto_failover
formation, so the standby takes over), SIGKILL an engine mid-step, SIGSTOP the other
engine for longer than its lease and SIGCONT it (a zombie that wakes up to write under
claims another engine took over). Then it waits for
everything to finish and checks, with the store's figures and the audit:

* every job id that got a 202 has exactly one instance, and no other instance exists;
* every instance completes; no step checkpoint was written twice;
* every side effect was applied once per (job id, step) through its idempotency key
  (re-executions after crashes are counted and shown, not hidden);
* the audit is clean and the consumer lag returns to 0;
* the interleaving harness's history checker finds nothing
  (:func:`onceflow_tools.interleavings.history.check_history`: no overlapping attempts,
  no completed step or recorded failure run again, no event or request left over).

The seed fixes the workload and the fault schedule, so a failing seed can be rerun.
"""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import httpx

from onceflow.lag import consumer_lag
from onceflow.partitioning import partition_for
from onceflow.settings import Settings
from onceflow.vocabulary import InstanceStatus
from onceflow_cli.audit import run_audit
from onceflow_examples import applied_effect_counts
from onceflow_tools.figures import (
    checkpoints_written_twice,
    count_instances,
    instance_job_ids,
    running_by_owner,
)
from onceflow_tools.interleavings.history import check_history
from onceflow_tools.stack import Stack
from producers.client import SubmitError

if TYPE_CHECKING:
    from onceflow_tools.dev import DevServices

SIZES = {"ci": 600, "large": 5000}


@dataclass
class ChaosResult:
    seed: int
    jobs: int
    submissions: int = 0
    duplicates_sent: int = 0
    mismatches_sent: int = 0
    accepted: int = 0
    faults: list[str] = field(default_factory=list)
    instances: int = 0
    complete: int = 0
    re_executions: int = 0
    elapsed: float = 0.0
    violations: list[str] = field(default_factory=list)
    fault_errors: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [
            f"chaos run  seed={self.seed}  ({self.elapsed:.1f}s)",
            f"  jobs {self.jobs}, submissions {self.submissions} "
            f"(duplicates {self.duplicates_sent}, different params {self.mismatches_sent})",
            f"  accepted job ids (202) {self.accepted}",
            f"  faults injected ({len(self.faults)}): {', '.join(self.faults) or '-'}",
            f"  instances {self.instances}, complete {self.complete}",
            f"  step re-executions after crashes (absorbed by idempotency keys): "
            f"{self.re_executions}",
            f"  violations: {len(self.violations)}",
        ]
        lines += [f"  fault not injected: {e}" for e in self.fault_errors]
        lines += [f"    - {v}" for v in self.violations]
        return "\n".join(lines)


class _Faults:
    """The fault actions, each recorded by name when it happens."""

    def __init__(
        self,
        stack: Stack,
        dev: DevServices | None,
        log: Callable[[str], None],
        submit: Callable[[list[dict[str, Any]]], None],
    ) -> None:
        self.stack = stack
        self.dev = dev
        self.log = log
        self.submit = submit
        self.extra_jobs = 0
        self.done: list[str] = []
        self._generation = 0

    def _note(self, what: str) -> None:
        self.done.append(what)
        self.log(f"  fault: {what}")

    def _restart(self, name: str, start: Callable[..., Any], **env: str) -> None:
        group = self.stack.group
        assert group is not None
        group.stop(name, signal.SIGKILL)
        time.sleep(0.5)
        start(name, **env)

    def kill_worker(self) -> None:
        self._restart("streams-1", self.stack.start_worker)
        self._note("SIGKILL streams worker")

    def worker_dies_after_commit(self) -> None:
        """The second worker is restarted with a failpoint (two rebalances), and SIGKILLs
        itself right after its first database commit, before any offset commit; then it
        is started again normally.

        It replaces a worker rather than joining as a third: Faust's assignor gives a
        third member of a group over four partitions none of them (2 + 2 + 0), so a
        third worker would never see a record.
        """
        assert self.stack.group is not None
        self._generation += 1
        name = "streams-2"
        self.stack.group.stop(name)  # SIGTERM: a clean leave, not a fault of its own
        port = self.stack.start_worker(
            name,
            failpoints="streams.after_db_commit=kill",
            ONCEFLOW_STREAMS_COMMIT_INTERVAL_SECONDS="30",
        )
        held = _wait_for_assignment(port, timeout=30)
        partitions = self.stack.partitions
        # Fresh jobs whose ids hash to the partitions the new worker holds (every
        # partition if it reported none), spread over a few seconds.
        candidates = (f"chaos_fp{self._generation}_{n:05d}" for n in itertools.count())
        targeted = list(
            itertools.islice(
                (j for j in candidates if not held or partition_for(j, partitions) in held), 80
            )
        )
        for part in range(4):
            extra = [
                {"job_id": job_id, "workflow": "order-workflow", "params": {"step_seconds": 0.03}}
                for job_id in targeted[part * 20 : (part + 1) * 20]
            ]
            self.extra_jobs += len(extra)
            self.submit(extra)
            if self.stack.group.procs[name].poll() is not None:
                break
            time.sleep(1.0)
        deadline = time.monotonic() + 30
        proc = self.stack.group.procs[name]
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            self.stack.group.stop(name, signal.SIGKILL)
            self._note("SIGKILL streams worker (it got no records in time)")
        else:
            self.stack.group.procs.pop(name, None)
            self._note("streams worker killed between DB commit and offset commit")
        self.stack.start_worker(name)

    def kill_engine(self) -> None:
        self._restart("engine-1", self.stack.start_engine)
        self._note("SIGKILL engine mid-step")

    def zombie_engine(self) -> None:
        """SIGSTOP the second engine for longer than its lease, then SIGCONT it: the other
        engine's rescuer re-queues what it held and runs it on, and the zombie wakes up
        mid-run to write under claims that are no longer its own (every such write must
        be refused: a lease is a fencing token)."""
        assert self.stack.group is not None and self.stack.db is not None
        proc = self.stack.group.procs["engine-2"]
        lease = float(self.stack.env["ONCEFLOW_ENGINE_LEASE_SECONDS"])
        # Past the lease, plus a rescuer pass (every half lease) and a margin.
        stopped_for = lease * 1.5 + 2.0
        held = self._wait_until_holding(proc.pid, timeout=10.0)
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(stopped_for)
        finally:
            proc.send_signal(signal.SIGCONT)
        self._note(
            f"SIGSTOP engine holding {held} running instance(s) {stopped_for:.0f}s"
            f" (past its {lease:.0f}s lease), SIGCONT"
        )

    def _wait_until_holding(self, pid: int, timeout: float) -> int:
        """Until the engine of process ``pid`` runs an instance (a zombie holding
        nothing proves nothing); how many it runs (0 if none in time)."""
        assert self.stack.db is not None
        deadline = time.monotonic() + timeout
        while True:
            held = sum(
                n
                for owner, n in running_by_owner(self.stack.db).items()
                if owner.split(":")[1:2] == [str(pid)]
            )
            if held or time.monotonic() > deadline:
                return held
            time.sleep(0.01)

    def restart_kafka(self) -> None:
        if self.dev is None:
            self.log("  (skipped: Kafka restart needs the local dev services)")
            return
        self.dev.kafka.down()
        self.dev.kafka.up()
        self._note("restart Kafka broker")

    def restart_postgres(self) -> None:
        if self.dev is None:
            self.log("  (skipped: PostgreSQL restart needs the local dev services)")
            return
        self.dev.postgres.down()  # pg_ctl stop -m fast: every connection is cut
        self.dev.postgres.up()
        self._note("restart PostgreSQL")

    def fail_over_postgres(self) -> None:
        """SIGKILL the primary node of the HA formation (keeper and postgres); wait until
        a write through the multi-host URL commits on the promoted standby, then start
        the killed node again, which rejoins as the new standby."""
        if self.dev is None or not self.dev.postgres_ha:
            self.log("  (skipped: a failover needs `onceflow dev up --postgres-ha`)")
            return
        ha = self.dev.ha
        old = ha.primary()
        if old is None:
            raise RuntimeError("the HA formation has no primary")
        began = time.monotonic()
        ha.kill(old)
        deadline = began + 90
        while not (ha.primary() not in (None, old) and ha.writable()):
            if time.monotonic() > deadline:
                raise RuntimeError("no standby was promoted within 90 s")
            time.sleep(0.2)
        self._note(
            f"SIGKILL PostgreSQL primary {old} (writable again after"
            f" {time.monotonic() - began:.1f}s)"
        )
        ha.start_node(old)


def _wait_for_assignment(metrics_port: int, timeout: float) -> set[int]:
    """Until the worker holds partitions of the jobs topic after a rebalance; return
    them (empty if it never got any in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
            held = {
                int(line.split('partition="')[1].split('"')[0])
                for line in text.splitlines()
                if line.startswith("onceflow_streams_assigned_partition{")
                and float(line.split()[-1]) == 1
            }
            if held:
                time.sleep(1.0)  # let the group finish the round
                return held
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return set()


def run_chaos(
    base: Settings,
    seed: int,
    n_jobs: int,
    log_dir: Path,
    dev: DevServices | None = None,
    clients: int = 6,
    timeout: float = 240.0,
    log: Callable[[str], None] = click.echo,
    postgres_ha: bool = False,
) -> ChaosResult:
    rng = random.Random(seed)
    result = ChaosResult(seed, n_jobs)
    started = time.monotonic()
    stack = _start_stack(base, seed, log_dir)
    try:
        _start_processes(stack)
        log(f"chaos seed={seed}: {n_jobs} jobs, 2 streams workers, 2 engines (logs: {log_dir})")
        batches = _plan_workload(rng, n_jobs, result)
        submitter = _Submitter(stack)
        faults = _Faults(stack, dev, log, submitter.submit)
        with _FaultLoop(_fault_schedule(rng, faults, postgres_ha), result, log):
            _send_workload(batches, submitter.submit, clients)
        result.faults = faults.done
        result.jobs += faults.extra_jobs
        result.accepted = len(submitter.accepted)
        log(
            f"  workload sent: {result.submissions} submissions, {result.accepted} job ids "
            "accepted; waiting for the system to settle"
        )
        settle_started = time.monotonic()
        _settle(stack, result.accepted, timeout)
        log(f"  settled in {time.monotonic() - settle_started:.1f}s")
        _check(stack, submitter.accepted, result)
    finally:
        stack.close()
    result.elapsed = time.monotonic() - started
    return result


def _start_stack(base: Settings, seed: int, log_dir: Path) -> Stack:
    """A fresh stack with short leases and timeouts, so faults are noticed quickly."""
    stack = Stack(base, f"chaos-{seed}-{int(time.time()) % 100000}", log_dir).prepare()
    stack.env.update(
        {
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "4",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.5",
            "ONCEFLOW_STREAMS_SESSION_TIMEOUT_SECONDS": "6",
            "ONCEFLOW_INGEST_ACK_TIMEOUT_SECONDS": "10",
        }
    )
    if stack.group is not None:
        stack.group.env.update(stack.env)
    return stack


def _start_processes(stack: Stack) -> None:
    stack.start_ingest()
    for name in ("streams-1", "streams-2"):
        stack.start_worker(name)
    for name in ("engine-1", "engine-2"):
        stack.start_engine(name)


class _Submitter:
    """Submits batches, retrying through outages, and collects the accepted job ids."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.accepted: set[str] = set()
        self._lock = threading.Lock()

    def submit(self, batch: list[dict[str, Any]]) -> None:
        with self.stack.client(retries=40, timeout=30) as client:
            for attempt in range(40):
                try:
                    ids = [a["job_id"] for a in client.submit(batch)["accepted"]]
                    break
                except (SubmitError, httpx.HTTPError):
                    if attempt == 39:
                        raise
                    time.sleep(1.0)
        with self._lock:
            self.accepted.update(ids)


Fault = Callable[[], None]


def _fault_schedule(
    rng: random.Random, faults: _Faults, postgres_ha: bool = False
) -> list[tuple[Fault, float]]:
    """Every fault once, in a seeded order, each after a seeded pause."""
    schedule: list[Fault] = [
        faults.kill_worker,
        faults.worker_dies_after_commit,
        faults.restart_kafka,
        faults.fail_over_postgres if postgres_ha else faults.restart_postgres,
        faults.kill_engine,
        faults.zombie_engine,
    ]
    rng.shuffle(schedule)
    pauses = [rng.uniform(2.0, 4.0) for _ in schedule]
    return list(zip(schedule, pauses, strict=True))


class _FaultLoop:
    """Runs the fault schedule in a thread while the workload is sent (a context
    manager: on exit it waits for the schedule to finish, bounded)."""

    def __init__(
        self, schedule: list[tuple[Fault, float]], result: ChaosResult, log: Callable[[str], None]
    ) -> None:
        self.schedule = schedule
        self.result = result
        self.log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _FaultLoop:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self._stop.set()  # the workload failed: inject no more faults
        self._thread.join(timeout=120)
        self._stop.set()

    def _run(self) -> None:
        for fault, pause in self.schedule:
            if self._stop.wait(pause):
                return
            began = time.monotonic()
            name = getattr(fault, "__name__", repr(fault))
            try:
                fault()
            except Exception as exc:  # a fault that could not be injected is reported
                self.result.fault_errors.append(f"{name}: {exc}")
                self.log(f"  fault {name} could not be injected: {exc}")
            self.log(f"    ({name} took {time.monotonic() - began:.1f}s)")


def _send_workload(
    batches: list[list[dict[str, Any]]],
    submit: Callable[[list[dict[str, Any]]], None],
    clients: int,
) -> None:
    pace = 18.0 / max(1, len(batches))  # spread the workload over the fault schedule
    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = []
        for batch in batches:
            futures.append(pool.submit(submit, batch))
            time.sleep(pace)
        for future in futures:
            future.result()  # a batch that was never accepted is a failed run


def _plan_workload(rng: random.Random, n_jobs: int, result: ChaosResult) -> list[list[dict]]:
    submissions: list[dict[str, Any]] = []
    for i in range(n_jobs):
        job = {
            "job_id": f"chaos_{i:05d}",
            "workflow": "order-workflow",
            "params": {"i": i, "step_seconds": 0.03},
        }
        copies = rng.choice((1, 1, 2, 3))
        for c in range(copies):
            if c > 0 and rng.random() < 0.05:
                submissions.append({**job, "params": {"i": i, "changed": True}})
                result.mismatches_sent += 1
            else:
                submissions.append(job)
        result.duplicates_sent += copies - 1
    rng.shuffle(submissions)
    result.submissions = len(submissions)
    batches, pos = [], 0
    while pos < len(submissions):
        size = rng.randint(1, 50)
        batches.append(submissions[pos : pos + size])
        pos += size
    return batches


def _settle(stack: Stack, accepted: int, timeout: float) -> None:
    assert stack.db is not None and stack.settings is not None
    db, s = stack.db, stack.settings

    def settled() -> bool:
        if count_instances(db, InstanceStatus.COMPLETE) < accepted:
            return False
        lags = consumer_lag(s.kafka_bootstrap_servers, s.consumer_group, s.jobs_topic)
        return sum(p.lag for p in lags) == 0

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if settled():
                return
        except Exception:
            pass  # services may still be coming back
        time.sleep(1.0)


def _check(stack: Stack, accepted: set[str], result: ChaosResult) -> None:
    assert stack.db is not None and stack.settings is not None
    v = result.violations
    have = instance_job_ids(stack.db)
    result.instances = len(have)
    result.complete = count_instances(stack.db, InstanceStatus.COMPLETE)
    twice = checkpoints_written_twice(stack.db)
    applied = applied_effect_counts(stack.db)
    applied_wrong = applied.not_exactly_once(have)
    result.re_executions = applied.re_executions
    missing, extra = sorted(accepted - have), sorted(have - accepted)
    if missing:
        v.append(f"{len(missing)} accepted job ids without an instance, e.g. {missing[:5]}")
    if extra:
        v.append(f"{len(extra)} instances without an accepted job id, e.g. {extra[:5]}")
    if result.complete != len(have):
        v.append(f"{len(have) - result.complete} instances did not complete")
    if twice:
        v.append(f"{twice} step checkpoints written twice")
    if applied_wrong:
        v.append(f"{applied_wrong} (job, step) pairs not applied exactly once")
    v += [f"history: {b}" for b in check_history(stack.db, completing=["order-workflow"])]
    report = run_audit(stack.settings, stack.db)
    if not report.clean:
        v.append(f"audit: missing {report.missing[:5]}, doubled {report.doubled[:5]}")
    if report.lag:
        v.append(f"consumer lag did not return to 0 (still {report.lag})")
