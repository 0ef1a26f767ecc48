"""``ctx.patched()`` inside a gather branch on real PostgreSQL and subprocess engines:
an instance that finished its gather on the old code gets no new step from a deploy
that adds a patched one to a shorter branch; the call is refused with an error that
says why, and a fresh instance meets the same refusal (so it shows before a deploy)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration.test_versioning import all_in, start_engine, statuses, steps, wait_for
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

NAME = "test-versioned-gather"  # registered by tests/integration/versioned_gather_*.py


def settled(db, job_id: str, among: set[str]) -> Callable[[], bool]:
    return lambda: statuses(db, [job_id]).get(job_id) in among


def create(db, job_ids: list[str], offset: int) -> None:
    create_instances(
        db,
        [
            Delivery(JobEnvelope(j, NAME, {}), "t", 0, offset + n, version="v1")
            for n, j in enumerate(job_ids)
        ],
    )


@pytest.mark.timeout(240)
def test_a_patch_in_a_shorter_branch_adds_no_step_to_an_instance_past_its_gather(
    settings, db, tmp_path
):
    old, fresh = "gather_old", "gather_fresh"
    create(db, [old], 0)
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_engine(group, "engine-v1", "versioned_gather_v1")
        wait_for(group, all_in(db, [old], "waiting"), "the gather to finish on the old code")
        group.stop("engine-v1")
        before = steps(db, old)
        assert [s[0] for s in before] == ["pack", "pick", "label", "weigh", "approval"]

        start_engine(group, "engine-patched", "versioned_gather_patched")
        operations.send_event(db, NAME, old, "approved", {"by": "test"})
        create(db, [fresh], 10)
        # (on the old code the fresh one takes the patch and waits for its approval)
        wait_for(group, settled(db, old, {"complete", "errored"}), "the old one to finish")
        wait_for(group, settled(db, fresh, {"errored", "waiting"}), "the fresh one to settle")
    # Nothing was added to the old instance: no marker, no "insure-parcel".
    assert steps(db, old) == before
    assert statuses(db, [old, fresh]) == {old: "errored", fresh: "errored"}
    for job_id in (old, fresh):
        error = describe_instance(db, job_id).error or ""
        assert "ctx.patched('insure') inside a gather branch" in error, error
    assert all(name not in ("insure", "insure-parcel") for name, _, _ in steps(db, fresh))
