"""``onceflow demo``: the whole path on real services, and a proof anyone can re-check.

100 jobs go in over HTTP; then the whole batch again, a random subset again from
several concurrent clients, and one resubmission with different params. When all work
is done, the demo checks with SQL that there is exactly one instance per accepted job
id, all complete, and exactly one side effect per step per job.

The checks read the store's figures (:mod:`onceflow_tools.figures`) and the
samples' own tables (:func:`onceflow_examples.side_effect_counts`); ``PROOF_SQL`` is
the same proof as plain SQL, printed for anyone who wants to re-check it with psql.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson

from onceflow.settings import Settings
from onceflow.vocabulary import TERMINAL_STATUSES
from onceflow_examples import ORDER_STEPS, side_effect_counts
from onceflow_tools.figures import (
    consumption,
    count_instances,
    duplicate_counts,
    instance_counts,
    instance_job_ids,
)
from onceflow_tools.processes import onceflow_command
from onceflow_tools.stack import Stack, topic_record_count
from workflow_engine.store.views import describe_instance

# Printed for the user to re-check by hand; the demo's own figures come from the store
# (``_figures``), under the same names. tests/tools/test_demo_proof.py runs both.
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


@dataclass
class _Tally:
    """What the clients sent and what ingest acknowledged."""

    requests: int = 0
    records_written: int = 0
    accepted_ids: set[str] = field(default_factory=set)


def _order_jobs(n_jobs: int) -> list[dict[str, Any]]:
    return [
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


def _submit_all(
    stack: Stack, rng: random.Random, jobs: list[dict[str, Any]], clients: int, tally: _Tally
) -> None:
    """The four rounds of submissions: the batch, the batch again, random subsets from
    concurrent clients, one resubmission with different params."""

    def submit(batch: list[dict[str, Any]]) -> list[str]:
        with stack.client() as client:
            return [a["job_id"] for a in client.submit(batch)["accepted"]]

    first = submit(jobs)
    tally.requests += 1
    tally.records_written += len(first)
    tally.accepted_ids.update(first)
    _say(f"1. submitted {len(jobs)} jobs in one request: {len(first)} accepted (202)")

    again = submit(jobs)
    tally.requests += 1
    tally.records_written += len(again)
    _say(f"2. resubmitted the whole batch: {len(again)} accepted again (duplicates)")

    subsets = [rng.sample(jobs, k=max(1, len(jobs) * 2 // 5)) for _ in range(clients)]
    batches = [s[i : i + 10] for s in subsets for i in range(0, len(s), 10)]
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(submit, batches))
    tally.requests += len(batches)
    tally.records_written += sum(len(r) for r in results)
    _say(
        f"3. {clients} concurrent clients resubmitted {sum(len(s) for s in subsets)} jobs "
        f"in {len(batches)} requests"
    )

    changed = {**jobs[0], "params": {**jobs[0]["params"], "amount": 999_999}}
    tally.records_written += len(submit([changed]))
    tally.requests += 1
    _say(f"4. resubmitted {changed['job_id']} with different params (a payload mismatch)")


def _describe_while_running(stack: Stack, job_id: str) -> None:
    """Describe an instance while it runs, as support staff would."""
    assert stack.db is not None
    db = stack.db

    def started() -> bool:
        view = describe_instance(db, job_id)
        return view is not None and len(view.steps) > 0

    try:
        stack.wait_for(started, 30, f"{job_id} to start")
        _say(f"\n$ onceflow instances describe order-workflow {job_id}   (while it runs)")
        out = subprocess.run(
            [*onceflow_command(), "instances", "describe", "order-workflow", job_id],
            env=stack.group.env if stack.group else None,
            capture_output=True,
            text=True,
            check=False,
        )
        _say((out.stdout or out.stderr).rstrip())
    except TimeoutError:
        _say(f"(could not catch {job_id} while running)")


def _wait_until_drained(stack: Stack, tally: _Tally, timeout: float) -> None:
    assert stack.db is not None
    db = stack.db

    def drained() -> bool:
        return consumption(db).records >= tally.records_written and count_instances(
            db, *TERMINAL_STATUSES
        ) >= len(tally.accepted_ids)

    stack.wait_for(drained, timeout, "all records consumed and all instances finished")


def _figures(stack: Stack) -> tuple[dict[str, int], frozenset[str]]:
    """The proof's figures (named as in ``PROOF_SQL``) and the job ids with an instance."""
    assert stack.db is not None
    instances = instance_counts(stack.db)
    duplicates = duplicate_counts(stack.db)
    effects = side_effect_counts(stack.db)
    have = instance_job_ids(stack.db)
    figures = {
        "instances created": instances.total,
        "distinct job ids with an instance": instances.distinct_job_ids,
        "instances complete": instances.complete,
        "duplicate deliveries collapsed": duplicates.total,
        "  of which Kafka redeliveries": duplicates.redeliveries,
        "  of which payload mismatches": duplicates.mismatches,
        "side effects performed": effects.rows,
        "(job, step) pairs not performed exactly once": effects.not_exactly_once(have),
    }
    return figures, have


def _checks(
    tally: _Tally, figures: dict[str, int], have: frozenset[str], kafka_records: int
) -> dict[str, bool]:
    accepted = tally.accepted_ids
    return {
        "every accepted job id has an instance": not (accepted - have),
        "no instance without an accepted job id": not (have - accepted),
        f"exactly {len(accepted)} instances": figures["instances created"] == len(accepted),
        "all instances complete": figures["instances complete"] == len(accepted),
        "records in Kafka = records acknowledged over HTTP": kafka_records == tally.records_written,
        "instances + duplicates collapsed = records in Kafka": figures["instances created"]
        + figures["duplicate deliveries collapsed"]
        == kafka_records,
        "the payload mismatch was detected": figures["  of which payload mismatches"] >= 1,
        "one side effect per step per job": figures["(job, step) pairs not performed exactly once"]
        == 0
        and figures["side effects performed"] == len(ORDER_STEPS) * len(accepted),
    }


@dataclass(frozen=True)
class _Proof:
    tally: _Tally
    figures: dict[str, int]
    checks: dict[str, bool]
    kafka_records: int
    elapsed: float

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def _print_proof(stack: Stack, proof: _Proof) -> None:
    assert stack.settings is not None
    tally = proof.tally
    _say(f"\nproof (run {stack.run_id}, {proof.elapsed:.1f}s):")
    _say(f"  {'HTTP requests sent':<48}{tally.requests:>8}")
    _say(f"  {'distinct jobs accepted (202)':<48}{len(tally.accepted_ids):>8}")
    _say(f"  {'Kafka records acknowledged (dups included)':<48}{tally.records_written:>8}")
    _say(f"  {'Kafka records in topic ' + stack.settings.jobs_topic:<48}{proof.kafka_records:>8}")
    for name, value in proof.figures.items():
        _say(f"  {name:<48}{value:>8}")
    _say("")
    for name, ok in proof.checks.items():
        _say(f"  [{'ok' if ok else 'FAIL'}] {name}")
    _say(f"\nre-check it yourself:\n  psql {stack.env['ONCEFLOW_DATABASE_URL']}")
    for name, sql in PROOF_SQL.items():
        _say(f"  -- {name.strip()}\n  {sql};")


def _write_json(stack: Stack, proof: _Proof, seed: int, path: Path) -> None:
    path.write_bytes(
        orjson.dumps(
            {
                "run_id": stack.run_id,
                "seed": seed,
                "elapsed_seconds": proof.elapsed,
                "requests": proof.tally.requests,
                "accepted": len(proof.tally.accepted_ids),
                "records_acknowledged": proof.tally.records_written,
                "records_in_topic": proof.kafka_records,
                "figures": {k.strip(): v for k, v in proof.figures.items()},
                "checks": proof.checks,
                "ok": proof.ok,
                "database_url": stack.env["ONCEFLOW_DATABASE_URL"],
            },
            option=orjson.OPT_INDENT_2,
        )
    )


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
    jobs = _order_jobs(n_jobs)
    tally = _Tally()
    started = time.monotonic()
    _submit_all(stack, rng, jobs, clients, tally)
    _describe_while_running(stack, jobs[3]["job_id"])
    _wait_until_drained(stack, tally, timeout)
    elapsed = time.monotonic() - started
    time.sleep(1.0)  # let any stray (wrong) extra work show up before we count

    figures, have = _figures(stack)
    kafka_records = topic_record_count(stack.settings, stack.settings.jobs_topic)
    checks = _checks(tally, figures, have, kafka_records)
    proof = _Proof(tally, figures, checks, kafka_records, elapsed)
    _print_proof(stack, proof)
    if json_out is not None:
        _write_json(stack, proof, seed, json_out)
    _say(
        "\nPROPERTY HOLDS: exactly one workflow per accepted job id"
        if proof.ok
        else "\nPROPERTY VIOLATED"
    )
    sys.stdout.flush()
    return proof.ok
