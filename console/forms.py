"""Form bodies, parsed from ``application/x-www-form-urlencoded`` (all the console's
forms send), so the console needs no multipart parser."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request

MAX_FORM_BYTES = 256 * 1024


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
    return Form(parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True))
