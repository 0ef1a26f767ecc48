"""``Prefer: wait`` as RFC 7240 writes it, and what a malformed one is (ignored)."""

from __future__ import annotations

import pytest

from producers.prefer import wait_preference
from producers.waiters import outcome_of_event


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("wait=5", 5),
        ("WAIT=5", 5),
        ("wait = 5", 5),
        ('wait="7"', 7),
        ("respond-async, wait=10", 10),
        ("wait=3;foo=bar", 3),
        ("handling=lenient, wait=0", 0),
        ("wait=4, wait=9", 4),  # the first occurrence wins
    ],
)
def test_a_wait_preference_is_read(header, seconds):
    assert wait_preference(header) == seconds


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "respond-async",
        "wait",
        "wait=",
        "wait=abc",
        "wait=-1",
        "wait=1.5",
        "wait=٣",
        "wait=1234567890",
        "waiting=5",
    ],
)
def test_a_missing_or_malformed_wait_is_ignored(header):
    assert wait_preference(header) is None


def test_a_final_event_becomes_the_outcome_and_a_foreign_one_none():
    data = {
        "job_id": "j",
        "workflow": "w",
        "version": "2",
        "status": "complete",
        "time": "2026-01-02T03:04:05.5Z",
        "result": {"x": [1]},
    }
    outcome = outcome_of_event("j", data)
    assert outcome is not None and outcome.final
    doc = outcome.to_dict()
    assert (doc["status"], doc["result"], doc["version"]) == ("complete", {"x": [1]}, "2")
    assert doc["finished_at"].isoformat() == "2026-01-02T03:04:05.500000+00:00"
    assert outcome_of_event("j", None) is None
    assert outcome_of_event("j", {"job_id": "j", "status": "complete"}) is None
    assert outcome_of_event("j", {**data, "time": "yesterday"}) is None
    # the record's key said "j", its data tells of another job: not taken as j's outcome
    assert outcome_of_event("j", {**data, "job_id": "k"}) is None
