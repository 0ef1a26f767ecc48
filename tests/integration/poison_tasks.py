"""A task of test_poison_rows.py, loaded by its worker (``ONCEFLOW_WORKFLOW_MODULES``):
it succeeds, but its result holds a NUL character, which PostgreSQL's jsonb refuses
(SQLSTATE 22P05)."""

from __future__ import annotations

from typing import Any

from workflow_engine.definitions import task

NUL_RESULT = "test-nul-result"


@task(NUL_RESULT, max_retries=0)
def nul_result(params: dict[str, Any]) -> dict[str, Any]:
    return {"note": "a\u0000b"}
