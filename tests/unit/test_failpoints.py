"""The failpoint registry cannot drift from the code: every name in ``POINTS`` is
reached by a ``hit``/``hit_async`` call in the product's source, and every name the
source reaches is registered (an unregistered name could never be armed)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from onceflow import failpoints

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["onceflow", "onceflow_cli", "producers", "streams", "workflow_engine", "console"]
HIT = re.compile(r"failpoints\.hit(?:_async)?\(\s*\"([a-z_.]+)\"")


def reached_in_source() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for name in HIT.findall(path.read_text()):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_registered_failpoint_is_reached_in_the_product():
    reached = reached_in_source()
    assert sorted(set(failpoints.POINTS) - set(reached)) == []


def test_every_failpoint_the_product_reaches_is_registered():
    reached = reached_in_source()
    assert sorted(set(reached) - set(failpoints.POINTS)) == []


def test_an_unknown_name_cannot_be_armed():
    with pytest.raises(KeyError, match="no failpoint named"):
        failpoints.arm("engine.no_such_point")


def test_the_launcher_spec_arms_action_job_and_times():
    try:
        kill, stop = failpoints.arm_from_spec(
            "engine.before_finish=kill@j1*2, engine.after_claim=stop"
        )
        assert (kill.name, kill.action, kill.job_id, kill.times) == (
            "engine.before_finish",
            "kill",
            "j1",
            2,
        )
        assert (stop.name, stop.action, stop.job_id, stop.times) == (
            "engine.after_claim",
            "stop",
            None,
            1,
        )
    finally:
        failpoints.disarm_all()


def test_a_paused_hit_waits_for_release_and_only_for_its_job():
    point = failpoints.arm("engine.before_finish", "pause", job_id="j1")
    try:
        failpoints.hit("engine.before_finish", "other")  # another job passes at once
        caller = threading.Thread(target=failpoints.hit, args=("engine.before_finish", "j1"))
        caller.start()
        point.wait_reached(5)
        assert caller.is_alive()
        point.release()
        caller.join(5)
        assert not caller.is_alive()
        failpoints.hit("engine.before_finish", "j1")  # times=1: a second hit passes
    finally:
        failpoints.disarm_all()


def test_the_architecture_doc_lists_every_failpoint():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("\n## Interleavings\n", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `([a-z_.]+)` \| (.+?) \|$", section, re.MULTILINE))
    assert listed == failpoints.POINTS
