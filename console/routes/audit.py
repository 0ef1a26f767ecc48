"""``/audit``: the operators' audit trail (who paused, terminated, sent an event,
started a bulk operation, re-drove dead letters, logged in, was refused), newest first,
keyset-paged, filtered by actor, action, job id, front end or result."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from console.deps import ConsoleDep, reader, render
from onceflow.vocabulary import ActionResult, FrontEnd, OperatorAction
from workflow_engine.store.views import ActionFilter, list_actions

router = APIRouter(dependencies=[Depends(reader)])

PAGE = 50


@router.get("/audit")
def audit_page(request: Request, c: ConsoleDep) -> Response:
    """A bad filter or cursor raises ``InvalidAuditFilter``: the 400 page."""
    query = dict(request.query_params)
    f = ActionFilter.from_params(query)
    cursor = query.get("cursor") or None
    page = list_actions(c.db, f, cursor, PAGE)
    params = f.as_params()
    next_url = None
    if page.next_cursor:
        next_url = "/audit?" + urlencode({**params, "cursor": page.next_cursor})
    context = {
        "page": page,
        "params": params,
        "next_url": next_url,
        "first_url": "/audit?" + urlencode(params),
        "paged": cursor is not None,
        "actions": list(OperatorAction),
        "front_ends": list(FrontEnd),
        "results": list(ActionResult),
    }
    return render(request, "audit.html", context)
