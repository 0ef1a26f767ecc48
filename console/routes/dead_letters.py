"""``/dead-letters``: browse the dead-letter topic (``onceflow.redrive``) and re-drive
one record or every record of a reason back to the jobs topic
(``store.redrives``: the page says what each letter did)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from console.deps import Console, ConsoleDep, ControlForm, Operator, reader, render
from console.metrics import REDRIVES
from onceflow.redrive import DeadLetterRecord, parse_position, read_dead_letters
from onceflow.vocabulary import DeadLetterReason
from workflow_engine.store.operations import Verdict, redrive_letters

log = logging.getLogger(__name__)
router = APIRouter()

PAGE = 100
REDRIVE_LIMIT = 1000  # records re-driven by one "all of this reason"


def _key(r: DeadLetterRecord) -> str:
    return f"{r.dlq_partition}@{r.dlq_offset}"


def _read(
    c: Console, reason: str | None, limit: int, after: tuple[int, int] | None = None
) -> list[DeadLetterRecord]:
    return read_dead_letters(c.settings, limit=limit, reason=reason or None, after=after)


@router.get("/dead-letters", dependencies=[Depends(reader)])
def dead_letters_page(
    request: Request,
    c: ConsoleDep,
    reason: str = "",
    at: str = "",
    after: str = "",
) -> Response:
    if at:  # one record: read from just before its position
        p, o = parse_position(at)
        records = [r for r in _read(c, None, 1, (p, o - 1)) if _key(r) == at]
    else:
        records = _read(c, reason, PAGE, parse_position(after) if after else None)
    next_after = _key(records[-1]) if len(records) == PAGE else None
    return render(
        request,
        "dead_letters.html",
        {
            "records": records,
            "reason": reason,
            "at": at,
            "reasons": list(DeadLetterReason),
            "key_of": _key,
            "dlq_topic": c.settings.dlq_topic,
            "next_after": next_after,
        },
    )


@router.post("/dead-letters/redrive")
def redrive_records(
    request: Request, form: ControlForm, c: ConsoleDep, actor: Operator
) -> Response:
    reason = form.get("reason")
    wanted = set(form.getlist("record"))
    every = form.get("all") == "yes"
    records = _read(c, reason, REDRIVE_LIMIT)
    chosen = records if every else [r for r in records if _key(r) in wanted]
    if form.get("confirm") != "yes" or not chosen:
        fields: dict[str, Any] = {"reason": reason, "all": "yes" if every else ""}
        planned = redrive_letters(c.settings, c.db, chosen, dry_run=True)
        return render(
            request,
            "confirm.html",
            {
                "title": f"Re-drive {len(chosen)} dead letters?",
                "action_url": "/dead-letters/redrive",
                "fields": fields,
                "multi": {"record": sorted(wanted)} if not every else {},
                "summary": f"Re-drive {len(chosen)} dead letters to the jobs topic"
                f" {c.settings.jobs_topic!r}"
                + (f" (reason {reason})" if reason else "")
                + f": {planned.summary()}.",
                "count": len(chosen),
                "detail": "\n".join(o.line() for o in planned.outcomes[:50]),
                "error": None if chosen else "no record selected",
                "back": "/dead-letters" + (f"?reason={reason}" if reason else ""),
            },
            200 if chosen else 400,
        )
    report = redrive_letters(c.settings, c.db, chosen, actor=actor)
    sent = report.count(Verdict.REDRIVEN)
    REDRIVES.inc(sent)
    log.info(
        "re-drive of %d dead letters: %s",
        len(chosen),
        report.summary(),
        extra={"event": "console.redrive"},
    )
    return render(
        request,
        "redriven.html",
        {"report": report, "count": len(chosen), "reason": reason},
    )
