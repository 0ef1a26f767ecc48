"""``onceflow demo``: the whole path on real services, and a proof anyone can re-check.

100 jobs go in over HTTP; then the whole batch again, a random subset again from
several concurrent clients, and one resubmission with different params. When all work
is done, the demo checks with SQL that there is exactly one instance per accepted job
id, all complete, and exactly one side effect per step per job.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import orjson
import sqlalchemy as sa

from onceflow.core.settings import Settings
from onceflow_tools.processes import onceflow_command
from onceflow_tools.stack import Stack, topic_record_count

ORDER_STEPS = 3

PROOF_SQL = {
    "instances created": "SELECT count(*) FROM onceflow_instances",
    "distinct job ids with an instance": "SELECT count(DISTINCT job_id) FROM onceflow_instances",
    "instances complete": "SELECT count(*) FROM onceflow_instances WHERE status = 'complete'",
    "duplicate deliveries collapsed": "SELECT count(*) FROM onceflow_duplicate_deliveries",
    "  of which Kafka redeliveries": (
        "SELECT count(*) FROM onceflow_duplicate_deliveries WHERE redelivery"
    ),
    "  of which payload mismatches": (
        "SELECT count(*) FROM onceflow_duplicate_deliveries WHERE NOT params_match"
    ),
    "side effects performed": "SELECT count(*) FROM onceflow_demo_side_effects",
    "(job, step) pairs not performed exactly once": "SELECT count(*) FROM"
    " (SELECT i.job_id, s.step FROM onceflow_instances i"
    " CROSS JOIN (VALUES ('charge payment'), ('reserve stock'), ('ship')) AS s(step)"
    " LEFT JOIN onceflow_demo_side_effects e ON e.job_id = i.job_id AND e.step = s.step"
    " GROUP BY 1, 2 HAVING count(e.id) <> 1) AS bad",
}


def _say(text: str = "") -> None:
    click.echo(text)


def run_demo(
    base: Settings,
    n_jobs: int = 100,
    clients: int = 4,
    seed: int | None = None,
    timeout: float = 180.0,
    json_out: Path | None = None,
    log_dir: Path | None = None,
) -> bool:
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_id = f"demo-{time.strftime('%Y%m%d%H%M%S')}-{seed % 10000:04d}"
    log_dir = log_dir or (base.state_dir / "runs" / run_id).resolve()
    _say(f"onceflow demo  run={run_id}  seed={seed}  logs={log_dir}")
    stack = Stack(base, run_id, log_dir).prepare()
    assert stack.settings is not None
    try:
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()
        _say(f"started ingest ({stack.ingest_url}), streams worker, engine")
        return _drive(stack, rng, n_jobs, clients, timeout, json_out, seed)
    finally:
        stack.close()


def _drive(
    stack: Stack,
    rng: random.Random,
    n_jobs: int,
    clients: int,
    timeout: float,
    json_out: Path | None,
    seed: int,
) -> bool:
    assert stack.settings is not None
    jobs: list[dict[str, Any]] = [
        {
            "job_id": f"order_{i:04d}",
            "workflow": "order-workflow",
            # order_0003 is a slow one, so that describe catches it mid-way
            "params": {
                "amount": 10 + i,
                "step_seconds": 1.5 if i == 3 else 0.2,
                "flaky": i % 10 == 3,
            },
        }
        for i in range(n_jobs)
    ]
    records_written = 0
    requests = 0
    accepted_ids: set[str] = set()

    def submit(batch: list[dict[str, Any]]) -> list[str]:
        with stack.client() as client:
            return [a["job_id"] for a in client.submit(batch)["accepted"]]

    started = time.monotonic()
    first = submit(jobs)
    requests += 1
    records_written += len(first)
    accepted_ids.update(first)
    _say(f"1. submitted {n_jobs} jobs in one request: {len(first)} accepted (202)")

    again = submit(jobs)
    requests += 1
    records_written += len(again)
    _say(f"2. resubmitted the whole batch: {len(again)} accepted again (duplicates)")

    subsets = [rng.sample(jobs, k=max(1, n_jobs * 2 // 5)) for _ in range(clients)]
    batches = [s[i : i + 10] for s in subsets for i in range(0, len(s), 10)]
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(submit, batches))
    requests += len(batches)
    records_written += sum(len(r) for r in results)
    _say(
        f"3. {clients} concurrent clients resubmitted {sum(len(s) for s in subsets)} jobs "
        f"in {len(batches)} requests"
    )

    changed = {**jobs[0], "params": {**jobs[0]["params"], "amount": 999_999}}
    records_written += len(submit([changed]))
    requests += 1
    _say(f"4. resubmitted {changed['job_id']} with different params (a payload mismatch)")

    # While it runs: describe an instance, as support staff would.
    sample = jobs[3]["job_id"]
    try:
        stack.wait_for(
            lambda: (
                stack.scalar("SELECT count(*) FROM onceflow_steps WHERE job_id = :j", j=sample) > 0
            ),
            30,
            f"{sample} to start",
        )
        _say(f"\n$ onceflow instances describe order-workflow {sample}   (while it runs)")
        out = subprocess.run(
            [*onceflow_command(), "instances", "describe", "order-workflow", sample],
            env=stack.group.env if stack.group else None,
            capture_output=True,
            text=True,
            check=False,
        )
        _say((out.stdout or out.stderr).rstrip())
    except TimeoutError:
        _say(f"(could not catch {sample} while running)")

    def drained() -> bool:
        consumed = stack.scalar(
            "SELECT (SELECT count(*) FROM onceflow_instances)"
            " + (SELECT count(*) FROM onceflow_duplicate_deliveries)"
        )
        done = stack.scalar(
            "SELECT count(*) FROM onceflow_instances"
            " WHERE status IN ('complete', 'errored', 'terminated')"
        )
        return consumed >= records_written and done >= len(accepted_ids)

    stack.wait_for(drained, timeout, "all records consumed and all instances finished")
    elapsed = time.monotonic() - started
    time.sleep(1.0)  # let any stray (wrong) extra work show up before we count

    figures = {name: stack.scalar(sql) for name, sql in PROOF_SQL.items()}
    kafka_records = topic_record_count(stack.settings, stack.settings.jobs_topic)
    with stack.db.connect() as conn:  # type: ignore[union-attr]
        have = set(conn.execute(sa.text("SELECT job_id FROM onceflow_instances")).scalars())
    checks = {
        "every accepted job id has an instance": not (accepted_ids - have),
        "no instance without an accepted job id": not (have - accepted_ids),
        f"exactly {len(accepted_ids)} instances": figures["instances created"] == len(accepted_ids),
        "all instances complete": figures["instances complete"] == len(accepted_ids),
        "records in Kafka = records acknowledged over HTTP": kafka_records == records_written,
        "instances + duplicates collapsed = records in Kafka": figures["instances created"]
        + figures["duplicate deliveries collapsed"]
        == kafka_records,
        "the payload mismatch was detected": figures["  of which payload mismatches"] >= 1,
        "one side effect per step per job": figures["(job, step) pairs not performed exactly once"]
        == 0
        and figures["side effects performed"] == ORDER_STEPS * len(accepted_ids),
    }
    _say(f"\nproof (run {stack.run_id}, {elapsed:.1f}s):")
    _say(f"  {'HTTP requests sent':<48}{requests:>8}")
    _say(f"  {'distinct jobs accepted (202)':<48}{len(accepted_ids):>8}")
    _say(f"  {'Kafka records acknowledged (dups included)':<48}{records_written:>8}")
    _say(f"  {'Kafka records in topic ' + stack.settings.jobs_topic:<48}{kafka_records:>8}")
    for name, value in figures.items():
        _say(f"  {name:<48}{value:>8}")
    _say("")
    for name, ok in checks.items():
        _say(f"  [{'ok' if ok else 'FAIL'}] {name}")
    url = stack.env["ONCEFLOW_DATABASE_URL"]
    _say(f"\nre-check it yourself:\n  psql {url}")
    for name, sql in PROOF_SQL.items():
        _say(f"  -- {name.strip()}\n  {sql};")
    ok = all(checks.values())
    if json_out is not None:
        json_out.write_bytes(
            orjson.dumps(
                {
                    "run_id": stack.run_id,
                    "seed": seed,
                    "elapsed_seconds": elapsed,
                    "requests": requests,
                    "accepted": len(accepted_ids),
                    "records_acknowledged": records_written,
                    "records_in_topic": kafka_records,
                    "figures": {k.strip(): v for k, v in figures.items()},
                    "checks": checks,
                    "ok": ok,
                    "database_url": url,
                },
                option=orjson.OPT_INDENT_2,
            )
        )
    _say(
        "\nPROPERTY HOLDS: exactly one workflow per accepted job id"
        if ok
        else "\nPROPERTY VIOLATED"
    )
    sys.stdout.flush()
    return ok
