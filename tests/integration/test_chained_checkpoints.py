"""A step's checkpoint committed with the write after it (``Chain``), on real PostgreSQL.

The engine pays one commit per step by sending step N's checkpoint with step N+1's
start, or with the instance's finish. These tests hold the store to the rules that
keep that safe: both parts or neither under a lost lease, the checkpoint kept when
what follows it is refused, and the whole run's history as before.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from onceflow.vocabulary import AttemptOutcome, InstanceStatus
from tests.integration.test_engine import run_until
from tests.integration.test_engine_durable import create, status
from workflow_engine import workflow
from workflow_engine.errors import ControlRequested, LeaseLost, NonDeterminismError
from workflow_engine.store import operations, writes
from workflow_engine.store.writes import Chain, FinishInstance, FinishStep, StartStep
from workflow_engine.store.writes import execution as store

SIDE_EFFECTS: list[str] = []


@workflow("test-chain-reuse")
async def reuses_a_step_name(ctx, params):
    """Uses step name "a" twice: the second start is refused (non-determinism)."""
    await ctx.step("a", SIDE_EFFECTS.append, "a")
    await ctx.step("b", SIDE_EFFECTS.append, "b")
    await ctx.step("a", SIDE_EFFECTS.append, "a again")


def rows(db, sql, job_id):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), {"j": job_id}).all()


def steps(db, job_id):
    sql = "SELECT position, name, status, attempts FROM onceflow_steps WHERE job_id = :j"
    return rows(db, sql + " ORDER BY position", job_id)


def started(db, owner, job_id):
    """An instance claimed by ``owner`` with its first step started (attempt 1)."""
    create(db, job_id, "test-chain")
    assert [c.job_id for c in writes.claim(db, owner, 10, 30)] == [job_id]
    [answer] = store.write_batch(db, owner, [StartStep(job_id, 1, 0, "a")])
    assert answer.attempt == 1


def done(db, job_id, position, result=b'"ok"'):
    """The checkpoint of attempt 1 at ``position``, with that attempt's start time."""
    with db.connect() as conn:
        at = conn.execute(
            sa.text(
                "SELECT started_at FROM onceflow_step_attempts"
                " WHERE job_id = :j AND position = :p AND attempt = 1"
            ),
            {"j": job_id, "p": position},
        ).scalar_one()
    return FinishStep(job_id, 1, position, 1, at, AttemptOutcome.COMPLETE, result)


def closed_attempts(db, job_id):
    sql = "SELECT position, outcome FROM onceflow_step_attempts WHERE job_id = :j"
    return rows(db, sql + " AND finished_at IS NOT NULL ORDER BY position", job_id)


def test_a_chain_commits_the_checkpoint_and_the_next_start_together(db):
    started(db, "E", "c1")
    [answer] = store.write_batch(db, "E", [Chain(done(db, "c1", 0), StartStep("c1", 1, 1, "b"))])
    assert answer.attempt == 1
    assert steps(db, "c1") == [(0, "a", "complete", 1), (1, "b", "running", 1)]
    finish = FinishInstance("c1", 1, InstanceStatus.COMPLETE, b"2")
    assert store.write_batch(db, "E", [Chain(done(db, "c1", 1), finish)]) == [None]
    assert status(db, "c1") == "complete"
    assert steps(db, "c1")[1] == (1, "b", "complete", 1)
    assert closed_attempts(db, "c1") == [(0, "complete"), (1, "complete")]


def test_a_chain_under_a_lost_lease_writes_neither_part(db):
    started(db, "E", "c2")
    finish = FinishInstance("c2", 1, InstanceStatus.COMPLETE, b"1")
    # Another engine id: this one's lease is not held, so nothing may be written.
    [answer] = store.write_batch(db, "other", [Chain(done(db, "c2", 0), finish)])
    assert isinstance(answer, LeaseLost)
    assert status(db, "c2") == "running"
    assert steps(db, "c2") == [(0, "a", "running", 1)]


def test_a_batch_mixes_chains_plain_writes_and_a_lost_lease(db):
    for job in ("m1", "m2", "m3"):
        create(db, job, "test-chain")
    writes.claim(db, "E", 10, 30)
    store.write_batch(db, "E", [StartStep(j, 1, 0, "a") for j in ("m1", "m2", "m3")])
    operations.terminate(db, "test-chain", "m3")  # queued terminations apply at the next step
    answers = store.write_batch(
        db,
        "E",
        [
            Chain(done(db, "m1", 0), StartStep("m1", 1, 1, "b")),
            done(db, "m2", 0),
            Chain(done(db, "m3", 0), StartStep("m3", 1, 1, "b")),
        ],
    )
    assert answers[0].attempt == 1 and answers[1] is None
    assert isinstance(answers[2], ControlRequested)
    assert steps(db, "m1")[0][2] == steps(db, "m2")[0][2] == "complete"
    # refused after the checkpoint, which committed: the step never runs again
    assert steps(db, "m3") == [(0, "a", "complete", 1)]


def test_a_refused_next_start_keeps_the_checkpoint_before_it(db):
    started(db, "E", "c3")
    store.write_batch(db, "E", [Chain(done(db, "c3", 0), StartStep("c3", 1, 1, "b"))])
    # The workflow asks for "a" again at position 2: a step name used twice in one run
    # violates a unique constraint, the batch fails and its writes are applied one by
    # one, where the checkpoint of position 1 commits before the refused start.
    chain = Chain(done(db, "c3", 1), StartStep("c3", 1, 2, "a"))
    with pytest.raises(sa.exc.IntegrityError):
        store.write_batch(db, "E", [chain])
    [answer] = store.write_each(db, "E", [chain])
    assert isinstance(answer, NonDeterminismError)
    assert steps(db, "c3") == [(0, "a", "complete", 1), (1, "b", "complete", 1)]


def test_through_the_engine_a_refused_start_alone_in_its_batch_keeps_the_checkpoint(settings, db):
    """One instance, so every batch holds one write: the chain carrying step b's
    checkpoint and the refused second "a" is still split, and b stays recorded."""
    SIDE_EFFECTS.clear()
    create(db, "r1", "test-chain-reuse")
    run_until(settings, db, lambda: status(db, "r1") == "errored")
    assert steps(db, "r1") == [(0, "a", "complete", 1), (1, "b", "complete", 1)]
    assert SIDE_EFFECTS == ["a", "b"]


def test_a_batch_chosen_as_a_deadlock_victim_runs_again(db, monkeypatch):
    """Rolled back, so safe to run again: the chain commits on the second try."""
    import psycopg2.errorcodes

    class Deadlock(Exception):
        pgcode = psycopg2.errorcodes.DEADLOCK_DETECTED

    started(db, "E", "d1")
    real, calls = store._start_steps, []

    def deadlocks_once(conn, owner, writes):
        calls.append(len(writes))
        if len(calls) == 1:
            raise sa.exc.OperationalError("INSERT ...", {}, Deadlock())
        return real(conn, owner, writes)

    monkeypatch.setattr(store, "_start_steps", deadlocks_once)
    monkeypatch.setitem(store._APPLY, StartStep, deadlocks_once)
    [answer] = store.write_batch(db, "E", [Chain(done(db, "d1", 0), StartStep("d1", 1, 1, "b"))])
    assert answer.attempt == 1 and len(calls) == 2
    assert steps(db, "d1") == [(0, "a", "complete", 1), (1, "b", "running", 1)]
