"""The claim for a slot whose run has only its last write left (``EngineRunner._settles_alone``).

A run past its workflow code counts its slot as free, so the claim loop claims the next
instance while that last write commits. The window: the claimed instance is leased
(``running`` in the table) before its slot is free. It must run none of its code until
the settling run has freed the slot, and a drain that finds it still waiting must give it
back, as it gives back any run it cuts.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

import workflow_engine.engine.runner as runner_module
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from tests.integration import flow_workflows as fw
from tests.integration.interleavings import EngineHarness, rows, scalar, status, wait_for
from workflow_engine import workflow
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


@workflow("test-settling-claim")
async def settling_claim(ctx, params):
    return await ctx.step("only", lambda: params["n"])


def _create(db, *jobs: str) -> None:
    create_instances(
        db,
        [
            Delivery(JobEnvelope(job, "test-settling-claim", {"n": n}), "t", 0, n)
            for n, job in enumerate(jobs)
        ],
    )


def _steps(db, job: str) -> int:
    return scalar(db, "SELECT count(*) FROM onceflow_steps WHERE job_id = :j", j=job)


def _claims(db, job: str) -> int:
    return scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = :j", j=job)


def test_an_instance_claimed_for_a_settling_slot_runs_only_once_the_slot_is_free(settings, db):
    _create(db, "sc_a", "sc_b")
    # sc_a's workflow code is done; its finish is held in the window
    finishing = failpoints.arm("engine.before_finish", job_id="sc_a")
    with EngineHarness(settings, db, engine_concurrency=1, engine_claim_batch=1) as harness:
        finishing.wait_reached()
        # one slot, still held by sc_a: the claim loop took sc_b for it all the same
        wait_for(lambda: status(db, "sc_b") == "running", "sc_b claimed while sc_a settles")
        time.sleep(0.5)  # time enough for sc_b to start its step, were it let
        assert _steps(db, "sc_b") == 0, "sc_b ran while the only slot was sc_a's"
        assert status(db, "sc_a") == "running"
        assert harness.inflight() == 2
        finishing.release()
        wait_for(lambda: status(db, "sc_b") == "complete", "sc_b run after sc_a", 10)
    assert status(db, "sc_a") == "complete"
    # sc_b's step started in a transaction begun after sc_a's finish had committed
    assert scalar(
        db,
        "SELECT a.started_at > i.finished_at FROM onceflow_step_attempts a,"
        " onceflow_instances i WHERE a.job_id = 'sc_b' AND i.job_id = 'sc_a'",
    )


def _one_slot_settling(settings, db, settling: str, claimed: str):
    """An engine of one slot (2 s leases) with ``settling``'s finish held in its window
    and ``claimed`` claimed for that slot: the harness (started) and the held finish."""
    finishing = failpoints.arm("engine.before_finish", job_id=settling)
    harness = EngineHarness(
        settings, db, engine_concurrency=1, engine_claim_batch=1, engine_lease_seconds=2.0
    ).start()
    try:
        finishing.wait_reached()
        wait_for(lambda: status(db, claimed) == "running", f"{claimed} claimed for the slot")
    except BaseException:
        harness.stop()  # (lets the held finish go)
        raise
    return harness, finishing


def test_the_drain_gives_back_an_instance_still_waiting_for_a_slot(settings, db):
    _create(db, "sd_a", "sd_b")
    harness, _ = _one_slot_settling(settings, db, "sd_a", "sd_b")
    try:
        # SIGTERM with sd_a held in its window past the drain's grace (half a lease):
        # both runs are cut, and both given back at once, not left to their leases
        harness.loop.call_soon_threadsafe(harness.runner.stop)
        harness.thread.join(15)
        assert not harness.thread.is_alive()
    finally:
        failpoints.disarm_all()
        harness.stop()
    for job in ("sd_a", "sd_b"):
        assert status(db, job) == "queued", job
        assert (
            scalar(db, "SELECT lease_owner FROM onceflow_instances WHERE job_id = :j", j=job)
            is None
        )
    assert _steps(db, "sd_b") == 0, "sd_b ran during the drain"
    with EngineHarness(settings, db):
        wait_for(lambda: status(db, "sd_b") == "complete", "sd_b run by the next engine", 10)
        wait_for(lambda: status(db, "sd_a") == "complete", "sd_a run by the next engine", 10)


@workflow("test-settling-slow")
async def settling_slow(ctx, params):
    return await ctx.step("slow", lambda: time.sleep(params["seconds"]) or 1)


def test_a_run_abandoned_while_it_waits_for_a_slot_gives_the_slot_back(settings, db):
    _create(db, "sa_a", "sa_b")
    finishing = failpoints.arm("engine.before_finish", job_id="sa_a")
    with EngineHarness(
        settings, db, engine_concurrency=1, engine_claim_batch=1, engine_lease_seconds=3.0
    ) as harness:
        finishing.wait_reached()
        wait_for(lambda: status(db, "sa_b") == "running", "sa_b claimed while sa_a settles")
        with db.begin() as conn:  # another engine took sa_b (its lease expired, say)
            conn.execute(
                sa.text("UPDATE onceflow_instances SET lease_owner = 'thief' WHERE job_id = 'sa_b'")
            )
        runner = harness.runner
        wait_for(lambda: "sa_b" not in runner._inflight, "sa_b abandoned at the heartbeat", 10)
        finishing.release()
        wait_for(lambda: status(db, "sa_a") == "complete", "sa_a finished")
        wait_for(lambda: not runner._inflight, "nothing in flight")
        assert runner._slots._value == 1, "a slot was lost with the abandoned run"
    assert _steps(db, "sa_b") == 0


def test_no_claimed_run_starts_after_sigterm(settings, db):
    _create(db, "ss_a")
    create_instances(
        db, [Delivery(JobEnvelope("ss_b", "test-settling-slow", {"seconds": 4}), "t", 0, 1)]
    )
    harness, finishing = _one_slot_settling(settings, db, "ss_a", "ss_b")
    try:
        harness.loop.call_soon_threadsafe(harness.runner.stop)
        time.sleep(0.2)
        finishing.release()  # ss_a finishes within the grace, its slot frees
        started = time.monotonic()
        harness.thread.join(15)
        took = time.monotonic() - started
    finally:
        failpoints.disarm_all()
        harness.stop()
    assert status(db, "ss_a") == "complete"
    assert _steps(db, "ss_b") == 0, "ss_b started after SIGTERM"
    assert status(db, "ss_b") == "queued", "ss_b not given back"
    assert took < 3, f"the drain waited {took:.1f} s for a run it should not have started"


def test_sigterm_between_a_claim_and_its_runs_start_gives_the_claim_back(settings, db):
    """The claim has committed (the instance leased), SIGTERM comes before its run
    starts: the run starts nothing, is forgotten before the drain looks at what is in
    flight, and the drain gives it back all the same (it once crashed on that: nothing
    left in flight to wait for)."""
    _create(db, "sx_a")
    claimed = failpoints.arm("engine.after_claim")
    harness = EngineHarness(settings, db, engine_lease_seconds=30.0).start()
    try:
        claimed.wait_reached()
        assert status(db, "sx_a") == "running"
        harness.loop.call_soon_threadsafe(harness.runner.stop)
        time.sleep(0.1)
        claimed.release()
        harness.thread.join(15)
        assert not harness.thread.is_alive()
    finally:
        failpoints.disarm_all()
        harness.stop()
    main = harness._main
    assert main is not None and main.done() and main.exception() is None, main
    assert _steps(db, "sx_a") == 0, "sx_a started after SIGTERM"
    assert status(db, "sx_a") == "queued", "sx_a not given back"
    assert scalar(db, "SELECT lease_owner FROM onceflow_instances WHERE job_id = 'sx_a'") is None


def test_a_flow_controlled_finish_does_not_lend_its_slot_to_lower_priority_work(settings, db):
    create_instances(
        db,
        [
            Delivery(JobEnvelope("sf_c1", fw.CAPPED, {}, priority=1), "t", 0, 0),
            Delivery(JobEnvelope("sf_c2", fw.CAPPED, {}, priority=1), "t", 0, 1),
            *[
                Delivery(
                    JobEnvelope(f"sf_p{n}", "test-settling-claim", {"n": n}, priority=5), "t", 0, n
                )
                for n in range(2, 5)
            ],
        ],
    )
    finishing = failpoints.arm("engine.before_finish", job_id="sf_c1")
    with EngineHarness(settings, db, engine_concurrency=1):
        finishing.wait_reached()
        time.sleep(0.3)  # several of the claim loop's polls (0.05 s here)
        running = "SELECT job_id FROM onceflow_instances WHERE status = 'running'"
        assert [row[0] for row in rows(db, running)] == ["sf_c1"], "claimed ahead"
        finishing.release()
        wait_for(
            lambda: (
                scalar(
                    db,
                    "SELECT count(*) FROM onceflow_instances"
                    " WHERE job_id LIKE 'sf_%' AND status = 'complete'",
                )
                == 5
            ),
            "all five finished",
            20,
        )
    with db.connect() as conn:
        order = list(
            conn.execute(
                sa.text(
                    "SELECT job_id FROM onceflow_instances WHERE job_id LIKE 'sf_%'"
                    " ORDER BY finished_at"
                )
            ).scalars()
        )
    # the capped one's finish frees its key's slot: the next capped one (priority 1)
    # goes before the plain ones (priority 5), as with no claim ahead
    assert order[:2] == ["sf_c1", "sf_c2"], order


def test_a_run_waiting_behind_a_finish_that_meets_an_outage_is_given_back(
    settings, db, monkeypatch
):
    """sg_b is claimed for sg_a's slot while sg_a settles; then sg_a's finish fails as a
    lost connection and its give-back fails for 3 s. sg_b is not held leased all that
    time: it is given back within a heartbeat interval (1 s here), and nothing more is
    claimed for sg_a's slot until sg_a is done (one give-back of sg_b, not one a second).
    It runs its step once, after that."""
    _create(db, "sg_a", "sg_b")
    finish = runner_module.EngineRunner._finish
    release = runner_module.writes.release
    outage_until = [float("inf")]

    async def failing_finish(self, inst, ctx, *args, **kwargs):
        if inst.job_id == "sg_a" and inst.claim_count == 1:
            await failpoints.hit_async("engine.before_finish", inst.job_id)
            raise sa.exc.OperationalError("finish", {}, Exception("server closed the connection"))
        return await finish(self, inst, ctx, *args, **kwargs)

    def failing_release(engine, owner, runs):
        if time.monotonic() < outage_until[0] and runs and runs[0][0] == "sg_a":
            raise sa.exc.OperationalError("release", {}, Exception("server closed the connection"))
        return release(engine, owner, runs)

    monkeypatch.setattr(runner_module.EngineRunner, "_finish", failing_finish)
    monkeypatch.setattr(runner_module.writes, "release", failing_release)
    finishing = failpoints.arm("engine.before_finish", job_id="sg_a")
    with EngineHarness(
        settings, db, engine_concurrency=1, engine_claim_batch=1, engine_lease_seconds=3.0
    ):
        finishing.wait_reached()
        wait_for(lambda: status(db, "sg_b") == "running", "sg_b claimed while sg_a settles")
        outage_until[0] = time.monotonic() + 3.0
        finishing.release()  # sg_a's finish fails now, and its give-back for 3 s
        wait_for(lambda: status(db, "sg_b") == "queued", "sg_b given back", 3)
        wait_for(lambda: status(db, "sg_b") == "complete", "sg_b run after sg_a", 20)
        wait_for(lambda: status(db, "sg_a") == "complete", "sg_a given back, then run", 20)
    assert scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'sg_b'") == 2
    assert scalar(db, "SELECT attempts FROM onceflow_steps WHERE job_id = 'sg_b'") == 1


def test_a_run_waiting_behind_a_stuck_finish_is_given_back_once(settings, db):
    """sh_a's finish hangs (held in its window, no error) past a heartbeat interval
    (1 s here): sh_b, claimed for sh_a's slot, is given back, and nothing is claimed for
    that slot again while sh_a is stuck (it once was, at once: sh_b given back and
    re-claimed every heartbeat)."""
    _create(db, "sh_a", "sh_b")
    finishing = failpoints.arm("engine.before_finish", job_id="sh_a")
    with EngineHarness(
        settings, db, engine_concurrency=1, engine_claim_batch=1, engine_lease_seconds=3.0
    ):
        finishing.wait_reached()
        wait_for(lambda: status(db, "sh_b") == "running", "sh_b claimed while sh_a settles")
        # given back (or, were it bounced, claimed again already)
        wait_for(lambda: status(db, "sh_b") == "queued" or _claims(db, "sh_b") > 1, "sh_b back", 3)
        time.sleep(2.5)  # more than two heartbeat intervals, sh_a still stuck
        assert status(db, "sh_b") == "queued", "sh_b claimed again for the stuck slot"
        assert _claims(db, "sh_b") == 1
        assert _steps(db, "sh_b") == 0
        finishing.release()
        wait_for(lambda: status(db, "sh_b") == "complete", "sh_b run after sh_a", 10)
    assert status(db, "sh_a") == "complete"
    assert _claims(db, "sh_b") == 2
