"""Baseline: DBOS Transact running the same three no-op step workflow as onceflow's bench.

DBOS Transact (PyPI ``dbos``) is a library-style durable workflow engine that checkpoints
workflows and steps in a PostgreSQL "system database". This module measures it on the shape
of work onceflow's ``engine`` bench uses, so the two can be read side by side:

* throughput: ``--jobs`` workflows, each three ``@DBOS.step()`` no-ops returning a small dict,
  the workflow id set to the job id (``SetWorkflowID``), started one of three ways
  (``--mode``):

  - ``queue``: enqueued on one DBOS queue with ``worker_concurrency=--concurrency``;
  - ``start``: ``DBOS.start_workflow`` (no queue; it runs on DBOS's own executor threads), from
    ``--concurrency`` client threads that each wait for their workflow's result before
    starting the next, so at most ``--concurrency`` workflows are in flight, as in a queue;
  - ``direct``: the workflow function called directly (it runs in the calling thread),
    from ``--concurrency`` threads.

  Wall time runs from the first submission to the last workflow's SUCCESS row (its
  ``updated_at``). 10% of the ids are submitted a second time to check that they collapse
  to one workflow each (``distinct_workflows``);
* light-load latency: ``--light-jobs`` workflows paced at ``--light-rate``/s, from just before
  the submission (enqueue, ``start_workflow`` or call, the last two handed to a small pool so
  that pacing never waits for a workflow) to step 1 running and to the workflow body
  returning (``complete``), plus the durable SUCCESS write (``complete_durable``). Times are
  taken in this process (one clock).

Fair-comparison choices: the system database lives on the same PostgreSQL server onceflow
uses, in a fresh database per run (dropped at the end, even on failure), with synchronous
commit on (the server default); every DBOS setting keeps its default except the log level
(WARNING) and the queue polling interval, which stays at DBOS's 1.0 s unless
``--polling-interval`` changes it. DBOS queues are polled, not pushed: each poll claims at most
``worker_concurrency`` minus running workflows, so the interval bounds both latency and (for
short workflows) throughput; the JSON reports it under ``settings``. Enqueueing uses
``--enqueue-threads`` threads, timed separately (``enqueue_seconds``; in the no-queue modes,
the time until every client thread is done).
Run: ``python -m onceflow_tools.baselines.dbos_bench --database-url postgresql://... --out x.json``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

import orjson
from dbos import DBOS, DBOSConfig, SetWorkflowID
from sqlalchemy import Engine, create_engine, make_url, text

DEADLINE_SECONDS = 600.0  # per phase (throughput, light)
DBOS_DEFAULT_POLLING_INTERVAL = 1.0  # DBOS.register_queue(polling_interval_sec=1.0)
DBOS_DEFAULTS: dict[str, Any] = {  # read from dbos 3.4 source; left as they are
    "queue_polling_interval_default_sec": DBOS_DEFAULT_POLLING_INTERVAL,
    "queue_polling_backoff": "x2 per poll with a serialization conflict (max 120 s), then x0.9",
    "queue_manager_check_interval_sec": 1.0,
    "global_concurrency": None,
    "sys_db_pool_size": 20,
    "max_executor_threads": "unbounded",
    "use_listen_notify": True,
    "notification_listener_polling_interval_sec": 1.0,
    "system_database": "fresh database on the same PostgreSQL server",
}
MODES = ("queue", "start", "direct")
first_step: dict[str, float] = {}
finished: dict[str, float] = {}


@DBOS.step()
def step_one(job_id: str) -> dict[str, Any]:
    first_step.setdefault(job_id, time.time())
    return {"step": 1, "ok": True}


@DBOS.step()
def step_two() -> dict[str, Any]:
    return {"step": 2, "ok": True}


@DBOS.step()
def step_three() -> dict[str, Any]:
    return {"step": 3, "ok": True}


@DBOS.workflow()
def noop_workflow(job_id: str) -> dict[str, Any]:
    out = {"a": step_one(job_id), "b": step_two(), "c": step_three()}
    finished.setdefault(job_id, time.time())
    return out


def _done(prefix: str) -> int:
    return sum(1 for k in finished.copy() if k.startswith(prefix))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


def _wait_db(
    db: Engine, prefix: str, want: int, deadline: float, t0: float
) -> tuple[int, int, float]:
    """Wait until ``want`` workflows with ids ``prefix*`` are SUCCESS or the deadline passes.

    Returns (rows, successes, epoch seconds of the last SUCCESS write)."""
    sql = text(
        "SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESS'),"
        " coalesce(max(updated_at) FILTER (WHERE status = 'SUCCESS'), 0)"
        " FROM dbos.workflow_status WHERE workflow_uuid LIKE :p"
    )
    last_print = 0.0
    while True:
        with db.connect() as conn:
            rows, ok, last_ms = conn.execute(sql, {"p": prefix + "%"}).one()
        now = time.time()
        if ok >= want or now > deadline:
            return int(rows), int(ok), float(last_ms) / 1000.0
        if now - last_print >= 5.0:
            last_print = now
            print(
                f"[dbos] {prefix[:-1]}: {ok}/{want} SUCCESS, in-memory {_done(prefix)},"
                f" {now - t0:.1f}s",
                file=sys.stderr,
            )
        time.sleep(0.25)


def _enqueue(queue: Any, ids: list[str], submit: dict[str, float] | None = None) -> None:
    for job_id in ids:
        if submit is not None:
            submit.setdefault(job_id, time.time())
        with SetWorkflowID(job_id):
            queue.enqueue(noop_workflow, job_id)


def _run_to_end(mode: str, job_id: str) -> None:
    """Start one workflow without a queue and return once it has finished (its result,
    like the workflow's own SUCCESS row, is durable by then)."""
    with SetWorkflowID(job_id):
        if mode == "start":
            DBOS.start_workflow(noop_workflow, job_id).get_result()
        else:
            noop_workflow(job_id)


def _drain(mode: str, pending: SimpleQueue[str]) -> None:
    """One client thread: take ids until none are left, each run to its end."""
    while True:
        try:
            job_id = pending.get_nowait()
        except Empty:
            return
        _run_to_end(mode, job_id)


def _submitters(
    mode: str, queue: Any, submissions: list[str], threads: int, concurrency: int
) -> list[threading.Thread]:
    """Threads that submit every id: enqueuers for a queue (they do not wait for the
    workflows), else ``concurrency`` clients each keeping one workflow in flight."""
    if mode == "queue":
        chunks = [submissions[k::threads] for k in range(threads)]
        return [threading.Thread(target=_enqueue, args=(queue, c), daemon=True) for c in chunks]
    pending: SimpleQueue[str] = SimpleQueue()
    for job_id in submissions:
        pending.put(job_id)
    return [
        threading.Thread(target=_drain, args=(mode, pending), daemon=True)
        for _ in range(concurrency)
    ]


def _throughput(
    db: Engine, mode: str, queue: Any, jobs: int, threads: int, concurrency: int, timeout: float
) -> dict[str, Any]:
    deadline = time.time() + timeout
    ids = [f"tp-{i:07d}" for i in range(jobs)]
    submissions = ids + ids[::10][: jobs // 10]  # 10% of the ids a second time
    workers = _submitters(mode, queue, submissions, threads, concurrency)
    t0 = time.time()
    for w in workers:
        w.start()
    for w in workers:
        w.join(max(0.0, deadline - time.time()))
    enqueue_seconds = time.time() - t0
    print(f"[dbos] submitted {len(submissions)} in {enqueue_seconds:.2f}s", file=sys.stderr)
    rows, ok, last = _wait_db(db, "tp-", jobs, deadline, t0)
    wall = max(last - t0, 1e-9)
    # Like onceflow's engine figure: from the first step run to the last SUCCESS row.
    first = min((v for k, v in first_step.items() if k.startswith("tp-")), default=t0)
    span = max(last - first, 1e-9)
    return {
        "seconds": round(span, 3),
        "processing_workflows_per_second": round(ok / span, 1),
        "enqueue_seconds": round(enqueue_seconds, 3),
        "submissions": len(submissions),
        "wall_seconds": round(wall, 3),
        "completed": ok,
        "timed_out": ok < jobs,
        "workflows_per_second": round(ok / wall, 1),
        "steps_per_second": round(3 * ok / wall, 1),
        "distinct_workflows": rows,
    }


def _light(
    db: Engine, mode: str, queue: Any, jobs: int, rate: float, timeout: float
) -> dict[str, Any]:
    submit: dict[str, float] = {}
    t0 = time.time()
    deadline = t0 + timeout
    # Paced submissions must not wait for a workflow: direct calls run on a pool.
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="light") as pool:
        for i in range(jobs):
            time.sleep(max(0.0, t0 + i / rate - time.time()))
            if time.time() > deadline:
                break
            job_id = f"lt-{i:07d}"
            if mode == "queue":
                _enqueue(queue, [job_id], submit)
            else:
                submit.setdefault(job_id, time.time())
                pool.submit(_run_to_end, mode, job_id)
            if i % max(1, int(rate) * 5) == 0:
                print(f"[dbos] lt: submitted {i + 1}/{jobs}, done {_done('lt-')}", file=sys.stderr)
        _, ok, _ = _wait_db(db, "lt-", len(submit), deadline, t0)
    sql = "SELECT workflow_uuid, updated_at FROM dbos.workflow_status WHERE status = 'SUCCESS'"
    sql += " AND workflow_uuid LIKE 'lt-%'"
    with db.connect() as conn:
        durable = {str(k): v / 1000.0 for k, v in conn.execute(text(sql))}
    first = [first_step[k] - s for k, s in submit.items() if k in first_step]
    done = [finished[k] - s for k, s in submit.items() if k in finished]
    stored = [durable[k] - s for k, s in submit.items() if k in durable]
    return {
        "jobs": jobs,
        "rate": rate,
        "submitted": len(submit),
        "completed": ok,
        "first_step_p50_ms": _pct(first, 0.50),
        "first_step_p99_ms": _pct(first, 0.99),
        "complete_p50_ms": _pct(done, 0.50),
        "complete_p99_ms": _pct(done, 0.99),
        "complete_durable_p50_ms": _pct(stored, 0.50),
        "complete_durable_p99_ms": _pct(stored, 0.99),
        "timed_out": ok < jobs,
    }


def _register_queue(concurrency: int, polling_interval: float, deadline: float) -> Any:
    """The bench's DBOS queue, returned once its worker thread polls (timing starts then)."""
    queue = DBOS.register_queue(
        "bench", worker_concurrency=concurrency, polling_interval_sec=polling_interval
    )
    # The queue manager notices a new queue within ~1 s.
    while not any(t.name == "queue-worker-bench" for t in threading.enumerate()):
        if time.time() > deadline:
            raise TimeoutError("DBOS queue worker thread never started")
        time.sleep(0.05)
    return queue


def run(
    database_url: str,
    jobs: int,
    concurrency: int,
    light_jobs: int,
    light_rate: float,
    mode: str = "queue",
    polling_interval: float = DBOS_DEFAULT_POLLING_INTERVAL,
    enqueue_threads: int = 4,
    timeout: float = DEADLINE_SECONDS,
) -> dict[str, Any]:
    """Benchmark DBOS in this process on a fresh system database; returns the JSON result."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    db_name = f"dbos_bench_{uuid.uuid4().hex[:12]}"
    sys_url = make_url(database_url).set(database=db_name).render_as_string(False)
    deadline = time.time() + timeout
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    try:
        config: DBOSConfig = {
            "name": "onceflow-dbos-bench",
            "system_database_url": sys_url,
            "log_level": "WARNING",
        }
        DBOS(config=config)
        db = create_engine(sys_url, pool_size=1, max_overflow=0)
        try:
            DBOS.launch()
            queue = None
            if mode == "queue":
                queue = _register_queue(concurrency, polling_interval, deadline)
            result: dict[str, Any] = {
                "system": "dbos",
                "dbos_version": version("dbos"),
                "mode": mode,
                "jobs": jobs,
                "concurrency": concurrency,
            }
            with db.connect() as conn:
                sync_commit = conn.execute(text("SHOW synchronous_commit")).scalar()
            result |= _throughput(db, mode, queue, jobs, enqueue_threads, concurrency, timeout)
            # After a timed-out throughput run the backlog would swamp the light run: skip it.
            light_jobs = 0 if result["timed_out"] else light_jobs
            result["light"] = _light(db, mode, queue, light_jobs, light_rate, timeout)
        finally:
            db.dispose()
            DBOS.destroy()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
        admin.dispose()
    queued = mode == "queue"
    result["settings"] = DBOS_DEFAULTS | {
        "mode": mode,
        "queue_polling_interval_sec": polling_interval if queued else None,
        "worker_concurrency": concurrency if queued else None,
        "client_threads": None if queued else concurrency,
        "poll_bound_workflows_per_second": concurrency / polling_interval if queued else None,
        "enqueue_threads": enqueue_threads if queued else None,
        "log_level": "WARNING",
        "synchronous_commit": sync_commit,
    }
    return result


def render(r: dict[str, Any]) -> str:
    lt = r["light"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    return "\n".join(
        [
            f"DBOS {r['dbos_version']}  mode {r.get('mode', 'queue')}  jobs {r['jobs']}"
            f"  concurrency {r['concurrency']}  queue poll"
            f" {r['settings']['queue_polling_interval_sec'] or '-'} s",
            f"  submit    {r['enqueue_seconds']:>8.2f} s for {r['submissions']} submissions",
            f"  wall      {r['wall_seconds']:>8.2f} s  ({r['completed']} SUCCESS"
            f"{', TIMED OUT' if r['timed_out'] else ''})",
            f"  workflows {r['workflows_per_second']:>8.1f} /s from the first submission,"
            f" {r['processing_workflows_per_second']:.1f} /s from the first step run"
            f"   steps {r['steps_per_second']:.1f} /s",
            f"  distinct  {r['distinct_workflows']:>8d} workflows for {r['jobs']} ids",
            f"  light {lt['jobs']} jobs at {lt['rate']}/s"
            f"{', TIMED OUT' if lt['timed_out'] else ''}",
            f"    submit->first step  p50 {ms(lt['first_step_p50_ms']):>8} ms"
            f"  p99 {ms(lt['first_step_p99_ms']):>8} ms",
            f"    submit->complete    p50 {ms(lt['complete_p50_ms']):>8} ms"
            f"  p99 {ms(lt['complete_p99_ms']):>8} ms",
            f"    submit->SUCCESS row p50 {ms(lt['complete_durable_p50_ms']):>8} ms"
            f"  p99 {ms(lt['complete_durable_p99_ms']):>8} ms",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--database-url", required=True, help="admin URL; a fresh db is made")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument(
        "--mode",
        choices=MODES,
        default="queue",
        help="queue: DBOS queue; start: DBOS.start_workflow; direct: call the workflow",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="workflows in flight: the queue's worker_concurrency, or client threads",
    )
    p.add_argument("--light-jobs", type=int, default=200)
    p.add_argument("--light-rate", type=float, default=20.0)
    p.add_argument("--polling-interval", type=float, default=DBOS_DEFAULT_POLLING_INTERVAL)
    p.add_argument("--enqueue-threads", type=int, default=4)
    p.add_argument("--timeout", type=float, default=DEADLINE_SECONDS, help="per phase, s")
    p.add_argument("--out", type=Path, default=None)
    opts = vars(p.parse_args(argv))
    out: Path | None = opts.pop("out")
    result = run(**opts)
    print(render(result))
    if out is not None:
        out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 1 if result["timed_out"] or result["light"]["timed_out"] else 0


if __name__ == "__main__":
    sys.exit(main())
