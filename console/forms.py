"""Form bodies, parsed from ``application/x-www-form-urlencoded`` (all the console's
forms send), so the console needs no multipart parser."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request

from onceflow.errors import OnceflowError

MAX_FORM_BYTES = 256 * 1024


class BadForm(OnceflowError):
    """A form the console cannot take as sent (a 400 page, :mod:`console.pages`)."""


class Form:
    def __init__(self, fields: dict[str, list[str]]) -> None:
        self._fields = fields

    def get(self, name: str, default: str = "") -> str:
        values = self._fields.get(name)
        return values[0] if values else default

    def getlist(self, name: str) -> list[str]:
        return list(self._fields.get(name, []))

    def as_dict(self) -> dict[str, str]:
        return {k: v[0] for k, v in self._fields.items() if v}


async def read_form(request: Request) -> Form:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        body = b""
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    # PostgreSQL's text holds no NUL: refused here, for every field of every form,
    # instead of failing (500) in whichever query the value reaches.
    if any("\x00" in k or any("\x00" in v for v in vs) for k, vs in fields.items()):
        raise BadForm("a form field holds a NUL character")
    return Form(fields)
