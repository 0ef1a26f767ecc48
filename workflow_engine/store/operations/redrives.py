"""Re-driving dead letters with what the database knows of their job ids: the one
re-drive the CLI (``onceflow dead-letters redrive``) and the console use.

:func:`onceflow.redrive.redrive` produces a letter's original back to the jobs topic.
What that does depends on the job id's state, which only the database knows, so each
letter is first planned (:func:`plan`) and the report says what really happens:

* a **task run that was dead-lettered** (``task_failed``, or an unknown task at run
  time) is reopened (``store.task_runs.reopen``: ``pending`` again, its attempts kept)
  *before* its record is produced: a re-drive is a new attempt of the same job id, and
  the worker's delivery of the re-driven record runs attempt ``attempts + 1`` (without
  the reopen, the record only collapsed as a duplicate of its own id and nothing ran);
* a task run that **succeeded**, and a job id that **already has an instance**, are
  skipped: the record would only collapse as a duplicate;
* a job id the database does not know (its record was dead-lettered before anything
  was created: unknown type, refused by the database) is delivered again;
* two letters of one job id in one re-drive: the first is re-driven, the others skipped;
* a truncated letter is refused (it holds only a prefix of the original).

A reopened run whose record Kafka did not acknowledge stays ``pending``: re-driving the
letter again produces it again (a pending run is re-driven as well).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.envelope import JobEnvelope
from onceflow.errors import InvalidEnvelope
from onceflow.redrive import DeadLetterRecord, redrive
from onceflow.settings import Settings
from onceflow.vocabulary import ActionResult, OperatorAction, TaskRunStatus
from workflow_engine.store import operator_audit
from workflow_engine.store.operator_audit import Actor
from workflow_engine.store.writes import task_runs


class Verdict(StrEnum):
    """What a re-drive does with one letter."""

    REDRIVEN = "re-driven"
    SKIPPED = "skipped"
    REFUSED = "refused"
    FAILED = "failed"  # planned for re-drive, Kafka did not acknowledge it


@dataclass(frozen=True, slots=True)
class LetterOutcome:
    """One letter: where it is, its job id, the verdict and, in words, what happens."""

    position: str  # PARTITION@OFFSET in the dead-letter topic
    job_id: str | None
    verdict: Verdict
    what: str
    landed: str | None = None  # jobs-topic PARTITION@OFFSET of the re-driven record

    def line(self) -> str:
        where = f" -> {self.landed}" if self.landed else ""
        return f"{self.position}\t{self.job_id or '-'}\t{self.verdict}{where}: {self.what}"


@dataclass(slots=True)
class RedriveReport:
    """Every letter's outcome, in the order given; ``dry_run`` when nothing was done."""

    outcomes: list[LetterOutcome] = field(default_factory=list)
    dry_run: bool = False

    def count(self, verdict: Verdict) -> int:
        return sum(1 for o in self.outcomes if o.verdict == verdict)

    def summary(self) -> str:
        counts = ", ".join(f"{v} {self.count(v)}" for v in Verdict)
        return f"dry run (nothing sent): would be {counts}" if self.dry_run else counts


@dataclass(frozen=True, slots=True)
class _Plan:
    letter: DeadLetterRecord
    job_id: str | None
    verdict: Verdict
    what: str
    reopen: bool = False  # a dead-lettered task run: reopen it before producing


def _job_id(letter: DeadLetterRecord) -> str | None:
    """The job id the letter's record names: its key or, for a keyless record (a
    foreign producer may write one; the worker takes the envelope's job id), the one in
    its value. Planned by the key alone, a keyless letter of a dead-lettered task run
    was sent back without the reopen, and only collapsed as a duplicate."""
    if letter.key:
        try:
            return letter.key.decode()
        except UnicodeDecodeError:
            return None
    try:
        return JobEnvelope.decode(None, letter.value, letter.original_headers).job_id
    except InvalidEnvelope:
        return None


def plan(db: Engine, letters: Sequence[DeadLetterRecord]) -> list[_Plan]:
    """What re-driving ``letters`` would do to each, from the database's state now."""
    ids = sorted({j for j in map(_job_id, letters) if j is not None})
    runs = task_runs.states(db, ids)
    instances = _instance_statuses(db, ids)
    plans: list[_Plan] = []
    taken: set[str] = set()
    for letter in letters:
        job_id = _job_id(letter)
        plans.append(_plan_one(letter, job_id, runs, instances, taken))
        if job_id is not None and plans[-1].verdict == Verdict.REDRIVEN:
            taken.add(job_id)
    return plans


def _plan_one(
    letter: DeadLetterRecord,
    job_id: str | None,
    runs: dict[str, task_runs.TaskRunState],
    instances: dict[str, str],
    taken: set[str],
) -> _Plan:
    if letter.truncated:
        return _Plan(letter, job_id, Verdict.REFUSED, "truncated: it holds only a prefix")
    if job_id is None:
        what = "delivered again (the record names no valid job id)"
        return _Plan(letter, None, Verdict.REDRIVEN, what)
    if job_id in taken:
        return _Plan(letter, job_id, Verdict.SKIPPED, "another letter of this job id goes first")
    run = runs.get(job_id)
    if run is not None:
        if run.status == TaskRunStatus.SUCCEEDED:
            what = f"task {run.task!r} already succeeded (attempt {run.attempts})"
            return _Plan(letter, job_id, Verdict.SKIPPED, what)
        what = f"task {run.task!r} attempt {run.attempts + 1} queued"
        reopen = run.status == TaskRunStatus.DEAD_LETTERED
        return _Plan(letter, job_id, Verdict.REDRIVEN, what, reopen=reopen)
    if job_id in instances:
        what = (
            f"it already has an instance ({instances[job_id]}): the record would only"
            " collapse as a duplicate"
        )
        return _Plan(letter, job_id, Verdict.SKIPPED, what)
    return _Plan(letter, job_id, Verdict.REDRIVEN, "delivered again (no instance or task run)")


_INSTANCE_STATUSES = sa.text(
    "SELECT job_id, status FROM onceflow_instances WHERE job_id = ANY(:ids)"
)


def _instance_statuses(db: Engine, job_ids: list[str]) -> dict[str, str]:
    if not job_ids:
        return {}
    with db.connect() as conn:
        rows = conn.execute(_INSTANCE_STATUSES, {"ids": job_ids}).all()
    return {job_id: status for job_id, status in rows}


#: Positions and job ids a re-drive's audit-trail row names (its count says how many).
_AUDITED_LETTERS = 50


def redrive_letters(
    settings: Settings,
    db: Engine,
    letters: Sequence[DeadLetterRecord],
    dry_run: bool = False,
    timeout: float = 30.0,
    *,
    actor: Actor | None = None,
) -> RedriveReport:
    """Re-drive ``letters`` as :func:`plan` says, and report what happened to each.

    With an ``actor``, the re-drive is one row of the operators' audit trail, written
    once it is over (it is Kafka writes, not one transaction): ``ok``, or ``error`` when
    Kafka did not acknowledge a letter or the re-drive raised. A dry run is not an
    action and is not recorded."""
    if dry_run:
        return RedriveReport([_outcome(p) for p in plan(db, letters)], dry_run=True)
    chosen = _audited_selection(letters)
    with operator_audit.failures_recorded(db, actor, OperatorAction.REDRIVE, **chosen):
        report = _redrive(settings, db, letters, timeout)
    if actor is not None:
        failed = report.count(Verdict.FAILED) > 0
        result = ActionResult.ERROR if failed else ActionResult.OK
        operator_audit.record_quietly(
            db,
            operator_audit.entry(
                actor, OperatorAction.REDRIVE, result, detail=report.summary(), **chosen
            ),
        )
    return report


def _audited_selection(letters: Sequence[DeadLetterRecord]) -> dict[str, Any]:
    """What the audit row says was chosen: the letters' positions and job ids (the first
    :data:`_AUDITED_LETTERS`), and the job id itself when they all share one."""
    job_ids = sorted({j for j in map(_job_id, letters) if j is not None})
    selection = {
        "letters": len(letters),
        "positions": [letter.position for letter in letters[:_AUDITED_LETTERS]],
        "job_ids": job_ids[:_AUDITED_LETTERS],
    }
    return {"filter": selection, "job_id": job_ids[0] if len(job_ids) == 1 else None}


def _redrive(
    settings: Settings, db: Engine, letters: Sequence[DeadLetterRecord], timeout: float
) -> RedriveReport:
    plans = plan(db, letters)
    reopened = task_runs.reopen(db, [p.job_id for p in plans if p.reopen and p.job_id])
    plans = [_attempt_now(p, reopened) for p in plans]
    sending = [p for p in plans if p.verdict == Verdict.REDRIVEN]
    produced = redrive(settings, [p.letter for p in sending], timeout)
    landed = {
        (r.dlq_partition, r.dlq_offset): f"{r.partition}@{r.offset}" for r in produced.redriven
    }
    failed = {(x.dlq_partition, x.dlq_offset): x.why for x in produced.failed}
    outcomes = []
    for p in plans:
        at = (p.letter.dlq_partition, p.letter.dlq_offset)
        if p.verdict == Verdict.REDRIVEN and at in failed:
            pending = "; the task run stays pending: re-drive it again" if p.reopen else ""
            outcomes.append(_outcome(p, Verdict.FAILED, f"not produced: {failed[at]}{pending}"))
        else:
            outcomes.append(_outcome(p, landed=landed.get(at)))
    return RedriveReport(outcomes)


def _attempt_now(p: _Plan, reopened: dict[str, task_runs.TaskRunState]) -> _Plan:
    """The attempt number as the reopen found it (a run may have moved since ``plan``)."""
    run = reopened.get(p.job_id or "")
    if run is None:
        return p
    what = f"task {run.task!r} attempt {run.attempts + 1} queued"
    return _Plan(p.letter, p.job_id, p.verdict, what, p.reopen)


def _outcome(
    p: _Plan, verdict: Verdict | None = None, what: str | None = None, landed: str | None = None
) -> LetterOutcome:
    return LetterOutcome(
        p.letter.position, p.job_id, verdict or p.verdict, what or p.what, landed=landed
    )
