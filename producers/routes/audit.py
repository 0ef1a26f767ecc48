"""The operators' audit trail over HTTP (mounted with the admin API).

    GET /v1/admin/audit?actor=&action=&job_id=&front_end=&result=&cursor=&limit=
        -> {"actions": [...], "next_cursor": "..." | null}

Newest first, paged by ``cursor`` (``workflow_engine.store.operator_audit``). Needs
``jobs:read``, like the console's ``/audit`` page; a refused request is itself
recorded. Bad input is a 4xx with the one error body: an unknown ``action``,
``front_end`` or ``result`` a 422 (FastAPI's validation), a bad cursor or an over-long
value a 400 ``invalid_filter``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from onceflow.vocabulary import ActionResult, FrontEnd, OperatorAction
from producers.deps import DbDep, require
from producers.errors import error_responses
from producers.models import RequestError
from workflow_engine.store import views

router = APIRouter(
    prefix="/v1/admin",
    tags=["audit"],
    responses=error_responses(400, 401, 403, 422),
)
_READ = [Depends(require("jobs:read", audit_as=OperatorAction.REQUEST))]


@router.get("/audit", dependencies=_READ)
def audit_trail(
    db: DbDep,
    actor: str | None = None,
    action: OperatorAction | None = None,
    job_id: str | None = None,
    front_end: FrontEnd | None = None,
    result: ActionResult | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """Operator actions (pause, resume, terminate, restart, send_event, bulk starts,
    re-drives), console logins and refused requests: who (``actor``: the key's name,
    ``console:<key>``, ``cli:<user>``), from which ``front_end``, on which instance or
    with which ``filter``, and the ``result`` (ok, refused, error) with its ``detail``."""
    given = {
        "actor": actor,
        "action": action,
        "job_id": job_id,
        "front_end": front_end,
        "result": result,
    }
    try:
        f = views.ActionFilter.from_params({k: str(v) for k, v in given.items() if v is not None})
        page = views.list_actions(db, f, cursor or None, limit)
    except views.InvalidAuditFilter as exc:
        raise RequestError(400, "invalid_filter", str(exc)) from None
    return {"actions": [e.to_dict() for e in page.rows], "next_cursor": page.next_cursor}
