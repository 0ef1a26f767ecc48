"""``/login`` (paste an API key) and ``/logout``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from console.auth import KEY_COOKIE, READ, Denied, check_csrf, is_https
from console.deps import ConsoleDep, render
from console.forms import read_form
from console.operators import record_login, record_logout

router = APIRouter()


def _safe_next(target: str) -> str:
    """Only a path on this console (no ``//host`` nor ``scheme:``): no open redirect."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    return render(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login")
async def login(request: Request, c: ConsoleDep) -> Response:
    """Every attempt is recorded in the operators' audit trail (``login``, ok or
    refused, with the key's name when the key is known: never the key)."""
    form = await read_form(request)
    who = c.gate.check_key(form.get("api_key").strip())
    name = who.name if who is not None else None
    try:
        check_csrf(request, form.as_dict())
    except Denied as exc:
        await run_in_threadpool(record_login, request, c, name, exc.message)
        raise
    target = _safe_next(form.get("next", "/"))
    if who is None or not who.may(READ):
        message = "unknown API key" if who is None else f"key {who.name!r} lacks scope {READ!r}"
        await run_in_threadpool(record_login, request, c, name, message)
        return render(request, "login.html", {"next": target, "error": message}, 401)
    await run_in_threadpool(record_login, request, c, who.name)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        KEY_COOKIE,
        form.get("api_key").strip(),
        httponly=True,
        samesite="strict",
        secure=is_https(request),
    )
    return response


@router.post("/logout")
async def logout(request: Request, c: ConsoleDep) -> Response:
    form = await read_form(request)
    check_csrf(request, form.as_dict())
    await run_in_threadpool(record_logout, request, c)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(KEY_COOKIE, httponly=True, samesite="strict")
    return response
