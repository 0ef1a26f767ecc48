"""The console's shared state and the dependencies its routes declare."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy.engine import Engine

from console import display, operators
from console.auth import CONTROL, READ, Denied, Gatekeeper, Principal, check_csrf, csrf_token
from console.forms import Form, read_form
from onceflow.settings import Settings
from workflow_engine.store.operations import Actor, BulkRunner

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.globals.update(utc=display.utc, pretty=display.pretty, bounded=display.bounded)
templates.env.globals.update(position=display.position, from_ms=display.from_ms)


@dataclass
class Console:
    """Everything a request needs, built once per process (``create_app``)."""

    settings: Settings
    db: Engine
    gate: Gatekeeper
    bulk: BulkRunner  # the process's one runner of bulk operations (also resumes cut-off ones)


def console(request: Request) -> Console:
    return request.app.state.console


ConsoleDep = Annotated[Console, Depends(console)]


def reader(request: Request, c: ConsoleDep) -> Principal:
    return c.gate.require(request, READ)


async def control_form(request: Request, c: ConsoleDep) -> Form:
    """A POST that acts: the key must hold ``instances:control`` and the CSRF token
    must match. Returns the parsed form. A refusal is recorded in the operators' audit
    trail, as the action the form was for."""
    try:
        c.gate.require(request, CONTROL)
        form = await read_form(request)
        check_csrf(request, form.as_dict())
    except Denied as exc:
        await operators.refused(request, c, exc)
        raise
    return form


ControlForm = Annotated[Form, Depends(control_form)]


def operator(request: Request, c: ConsoleDep) -> Actor:
    """Who acts (``console:<key name>``), for the store functions that record it; the
    routes declare it after :data:`ControlForm`, which has checked the key."""
    return operators.actor_of(request, c)


Operator = Annotated[Actor, Depends(operator)]


def render(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> HTMLResponse:
    c = console(request)
    who = c.gate.principal(request)
    base = {
        "who": who,
        "may_control": bool(who and who.may(CONTROL)),
        "auth_disabled": c.gate.disabled,
        "csrf": csrf_token(request),
        "path": request.url.path,
    }
    return templates.TemplateResponse(request, template, {**base, **context}, status_code=status)
