"""Who acts in the console, for the operators' audit trail
(:mod:`workflow_engine.store.operator_audit`).

An action's row is written by the store function that acts, from the :class:`Actor`
the route hands it (``console:<key name>``). What the store never sees is recorded
here: logins (and refused ones), logouts, and a control form refused at the door (no
key, a key without ``instances:control``, a wrong CSRF token), named by the action the
form was for. Preview and confirmation pages are not actions and are not recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from console.auth import KEY_COOKIE, Denied
from console.forms import BadForm, read_form
from onceflow.vocabulary import ActionResult, BulkAction, OperatorAction
from workflow_engine.store import operations
from workflow_engine.store.operations import Actor

if TYPE_CHECKING:
    from console.deps import Console

#: The control forms, by route path, and the action each is for (None: read from the
#: request, below).
_FORMS: dict[str, OperatorAction | None] = {
    "/instances/{job_id}/send-event": OperatorAction.SEND_EVENT,
    "/instances/{job_id}/{action}": None,  # the path names it
    "/bulk": None,  # the form names it
    "/dead-letters/redrive": OperatorAction.REDRIVE,
}
_CONTROL_ACTIONS = {str(a) for a in BulkAction}


def _peer(request: Request) -> str | None:
    return request.client.host if request.client else None


def actor_of(request: Request, c: Console) -> Actor:
    """The operator of a request: its key's name, or what stands in for one (never the
    key itself)."""
    who = c.gate.principal(request)
    if who is not None:
        name = who.name
    else:
        name = "(unknown key)" if request.cookies.get(KEY_COOKIE) else "(not logged in)"
    return Actor.console(name, _peer(request))


def attempted(request: Request, form_action: str | None) -> OperatorAction:
    """The action a refused control form was for (``request`` when it names none)."""
    route = getattr(request.scope.get("route"), "path", "")
    known = _FORMS.get(route)
    if known is not None:
        return known
    if route == "/instances/{job_id}/{action}":
        action = request.path_params.get("action", "")
        return OperatorAction(action) if action in _CONTROL_ACTIONS else OperatorAction.REQUEST
    if route == "/bulk" and form_action in _CONTROL_ACTIONS:
        return OperatorAction.of_bulk(BulkAction(form_action))
    return OperatorAction.REQUEST


async def refused(request: Request, c: Console, exc: Denied) -> None:
    """Record a control form refused at the door (best effort, in a worker thread)."""
    try:
        form_action = (await read_form(request)).get("action") or None
    except BadForm:
        form_action = None
    e = operations.entry(
        actor_of(request, c),
        attempted(request, form_action),
        ActionResult.REFUSED,
        job_id=request.path_params.get("job_id"),
        detail=f"{exc.status} {request.method} {request.url.path}: {exc.message}",
    )
    await run_in_threadpool(operations.record_quietly, c.db, e)


def record_login(
    request: Request, c: Console, key_name: str | None, refusal: str | None = None
) -> None:
    """A login (``refusal`` None) or a refused one; ``key_name`` None: no known key."""
    actor = Actor.console(key_name or "(unknown key)", _peer(request))
    result = ActionResult.OK if refusal is None else ActionResult.REFUSED
    e = operations.entry(actor, OperatorAction.LOGIN, result, detail=refusal)
    operations.record_quietly(c.db, e)


def record_logout(request: Request, c: Console) -> None:
    who = c.gate.principal(request)
    if who is None:  # not logged in: nothing to record
        return
    e = operations.entry(Actor.console(who.name, _peer(request)), OperatorAction.LOGOUT)
    operations.record_quietly(c.db, e)
