"""Names reach indexes, so they are bounded where they enter (issue 23): a workflow's or
task's name at registration, a step's (sleep's, event wait's, patch's) when the
workflow asks for it (tests/integration/test_engine_poison_write.py)."""

from __future__ import annotations

import pytest

from workflow_engine import task, workflow
from workflow_engine.definitions import (
    MAX_EVENT_TYPE_CHARS,
    MAX_STEP_NAME_CHARS,
    MAX_TYPE_NAME_CHARS,
    check_name,
)


def test_a_workflow_or_task_name_over_the_bound_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match=r"workflow name 'www.* over the limit of 100"):
        workflow("w" * (MAX_TYPE_NAME_CHARS + 1))
    with pytest.raises(ValueError, match=r"task name 'ttt.* over the limit of 100"):
        task("t" * (MAX_TYPE_NAME_CHARS + 1))


def test_the_bounds() -> None:
    assert check_name("step name", "s" * MAX_STEP_NAME_CHARS) == "s" * MAX_STEP_NAME_CHARS
    assert check_name("event type", "e" * MAX_EVENT_TYPE_CHARS)
    with pytest.raises(ValueError, match="is 501 characters, over the limit of 500"):
        check_name("step name", "s" * 501)
    with pytest.raises(ValueError, match="over the limit of 200"):
        check_name("event type", "e" * 201)
    # In the worst case (4 bytes a character) a step name and a job id fit an index entry.
    assert MAX_STEP_NAME_CHARS * 4 + 100 < 2700
