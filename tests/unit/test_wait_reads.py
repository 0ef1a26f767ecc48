"""Start and wait's batched status reads: each read of a batch gets its ids' outcomes,
and an id it names with its submission's record gets that record's answer, not the id's
(two resubmissions of one id, each answered by its own record, from one statement)."""

from __future__ import annotations

from onceflow.vocabulary import JobKind
from producers.waiters import _answer
from workflow_engine.store.views import JobOutcome, Record

A = Record("jobs", 0, 10)
B = Record("jobs", 0, 11)


def _outcome(run: int, status: str, pending: bool = False) -> JobOutcome:
    return JobOutcome("j", JobKind.WORKFLOW, "w", status, run=run, pending=pending)


def test_each_read_gets_its_own_records_answer():
    current = _outcome(2, "queued")
    found = {"j": current, "x": _outcome(1, "complete")}
    answered = {("j", A): _outcome(1, "errored"), ("j", B): _outcome(2, "queued", True)}
    assert _answer(["j", "x"], {}, found, answered) == {"j": current, "x": found["x"]}
    assert _answer(["j"], {"j": A}, found, answered)["j"].status == "errored"
    b = _answer(["j"], {"j": B}, found, answered)["j"]
    assert b.pending and not b.final


def test_an_id_without_an_instance_is_absent_either_way():
    assert _answer(["n"], {"n": A}, {}, {}) == {}
    assert _answer(["n"], {}, {}, {}) == {}
