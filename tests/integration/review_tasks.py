"""Tasks of test_review_streams_tasks.py, loaded by its worker
(``ONCEFLOW_WORKFLOW_MODULES``): each fails with a message PostgreSQL's text cannot
hold as it is (a NUL character, a lone surrogate), the way a task that quotes a
binary answer or a bad byte from its downstream in its exception does."""

from __future__ import annotations

from typing import Any

from workflow_engine.definitions import task

NUL_ERROR_RETRIED = "test-nul-error-retried"
NUL_ERROR_FINAL = "test-nul-error-final"
SURROGATE_ERROR = "test-surrogate-error"


class DownstreamAnswer(Exception):
    pass


@task(NUL_ERROR_RETRIED, max_retries=1, delay=0.01)
def nul_error_retried(params: dict[str, Any]) -> None:
    raise DownstreamAnswer("the downstream answered b'\x00': not a receipt")


@task(NUL_ERROR_FINAL, max_retries=0)
def nul_error_final(params: dict[str, Any]) -> None:
    raise DownstreamAnswer("the downstream answered b'\x00': not a receipt")


@task(SURROGATE_ERROR, max_retries=0)
def surrogate_error(params: dict[str, Any]) -> None:
    raise DownstreamAnswer("the downstream answered '\udcff' (a byte decoded with surrogateescape)")
