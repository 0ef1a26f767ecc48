"""Instance lists on real PostgreSQL: the filter's text forms, keyset pages, counts, the
plan of the list query, the overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import DeadLetterReason, InstanceStatus
from onceflow_tools.benchsql import seed_for_bench
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import (
    DeadLetterRow,
    InstanceFilter,
    InvalidFilter,
    count_matching,
    explain_list,
    list_page,
    overview,
)
from workflow_engine.store.writes import create_instances, record_dead_letters

# --- the filter's text forms (no database) ------------------------------------------


def test_parse_reads_the_documented_form_and_its_aliases():
    f = InstanceFilter.parse(
        "workflow=order-workflow,status=errored,created_before=2026-11-30T10:00:00Z,prefix=ord_"
    )
    assert f == InstanceFilter(
        workflow="order-workflow",
        status=InstanceStatus.ERRORED,
        created_to=datetime(2026, 11, 30, 10, tzinfo=UTC),
        job_id_prefix="ord_",
    )
    assert InstanceFilter.parse("") == InstanceFilter()
    assert InstanceFilter.parse("has_duplicates=yes,mismatch=0").payload_mismatch is False


@pytest.mark.parametrize(
    "f",
    [
        InstanceFilter(),
        InstanceFilter(
            workflow="w",
            status=InstanceStatus.PAUSED,
            created_from=datetime(2026, 1, 1, tzinfo=UTC),
            created_to=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
            job_id="a,b\\c",
            job_id_prefix="x_%",
            has_duplicates=True,
            payload_mismatch=False,
            error_contains="timeout, again = bad",
            scheduled=True,
        ),
    ],
)
def test_describe_and_params_round_trip(f):
    assert InstanceFilter.parse(f.describe()) == f
    assert InstanceFilter.from_params(f.as_params()) == f


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("colour=red", "unknown filter key 'colour'"),
        ("status=sleepy", "unknown status 'sleepy'"),
        ("created_from=yesterday", "not an ISO 8601 time"),
        ("has_duplicates=maybe", "not true or false"),
        ("workflow", "not key=value"),
        ("workflow=a,workflow=b", "given twice"),
        ("workflow=", "needs a value"),
        ("created_from=2026-01-02T00:00Z,created_to=2026-01-01T00:00Z", "before"),
    ],
)
def test_a_bad_filter_says_what_is_wrong(text, says):
    with pytest.raises(InvalidFilter, match=says):
        InstanceFilter.parse(text)


def test_from_params_ignores_the_other_query_parameters():
    f = InstanceFilter.from_params({"workflow": "w", "cursor": "abc", "limit": "5", "status": ""})
    assert f == InstanceFilter(workflow="w")


# --- lists on a database -------------------------------------------------------------


def _create(db, job_ids, workflow="approval-workflow", params=None):
    for n, job_id in enumerate(job_ids):
        create_instances(db, [Delivery(JobEnvelope(job_id, workflow, params or {}), "t", 0, n)])


def _set_created(db, job_id, at):
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE onceflow_instances SET created_at = :at WHERE job_id = :j"),
            {"at": at, "j": job_id},
        )


def test_keyset_pages_walk_every_row_once_newest_first(db):
    ids = [f"pg_{i:03d}" for i in range(23)]
    _create(db, ids)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i, job_id in enumerate(ids):  # three rows per timestamp: ties broken by job id
        _set_created(db, job_id, base + timedelta(seconds=i // 3))
    seen, cursor, pages = [], None, 0
    while True:
        page = list_page(db, InstanceFilter(job_id_prefix="pg_"), cursor=cursor, limit=5)
        seen += [r.job_id for r in page.rows]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 5
    assert seen == sorted(ids, key=lambda j: (ids.index(j) // 3, j), reverse=True)
    by_updated = list_page(db, InstanceFilter(), sort="updated", limit=100)
    assert {r.job_id for r in by_updated.rows} == set(ids)
    with pytest.raises(InvalidFilter, match="sort 'created'"):
        list_page(db, InstanceFilter(), sort="updated", cursor=page_cursor(db))
    with pytest.raises(InvalidFilter, match="invalid cursor"):
        list_page(db, InstanceFilter(), cursor="not-a-cursor")


def page_cursor(db):
    return list_page(db, InstanceFilter(), limit=1).next_cursor


def test_every_filter_narrows_the_list_and_the_count(db):
    _create(db, ["f_a1", "f_a2", "f_a3"])
    _create(db, ["f_o1"], workflow="order-workflow")
    # f_a1: resubmitted with other params (a mismatch); f_a2: the same params again.
    create_instances(db, [Delivery(JobEnvelope("f_a1", "approval-workflow", {"x": 1}), "t", 1, 1)])
    create_instances(db, [Delivery(JobEnvelope("f_a2", "approval-workflow", {}), "t", 1, 2)])
    operations.terminate(db, "approval-workflow", "f_a3")
    _set_created(db, "f_o1", datetime(2020, 1, 1, tzinfo=UTC))

    def ids(text):
        f = InstanceFilter.parse(text)
        found = sorted(r.job_id for r in list_page(db, f, limit=100).rows)
        assert count_matching(db, f) == len(found)
        return found

    assert ids("") == ["f_a1", "f_a2", "f_a3", "f_o1"]
    assert ids("workflow=order-workflow") == ["f_o1"]
    assert ids("status=terminated") == ["f_a3"]
    assert ids("created_before=2021-01-01T00:00:00Z") == ["f_o1"]
    assert ids("created_from=2021-01-01T00:00:00Z") == ["f_a1", "f_a2", "f_a3"]
    assert ids("job_id=f_a2") == ["f_a2"]
    assert ids("prefix=f_o") == ["f_o1"]
    assert ids("prefix=f%") == []  # LIKE wildcards in a prefix are literal
    assert ids("has_duplicates=true") == ["f_a1", "f_a2"]
    assert ids("has_duplicates=false") == ["f_a3", "f_o1"]
    assert ids("payload_mismatch=true") == ["f_a1"]
    assert ids("error_contains=OPERATOR") == ["f_a3"]
    assert ids("workflow=approval-workflow,has_duplicates=false") == ["f_a3"]
    rows = {r.job_id: r for r in list_page(db, InstanceFilter(), limit=10).rows}
    assert (rows["f_a1"].duplicates, rows["f_a1"].mismatches) == (1, 1)
    assert (rows["f_a2"].duplicates, rows["f_a2"].mismatches) == (1, 0)
    assert rows["f_a3"].error == "terminated by operator"
    assert count_matching(db, InstanceFilter(), cap=2) == 2


def test_the_version_filter_and_what_a_row_carries_for_the_cli(db):
    _create(db, ["v_1", "v_2", "v_3"])
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE onceflow_instances SET version = 'v1' WHERE job_id <> 'v_3'"))
    operations.terminate(db, "approval-workflow", "v_2")
    f = InstanceFilter.parse("version=v1")
    assert f == InstanceFilter(version="v1") and InstanceFilter.parse(f.describe()) == f
    rows = {r.job_id: r for r in list_page(db, f).rows}
    assert sorted(rows) == ["v_1", "v_2"] and count_matching(db, f) == 2
    assert {r.version for r in rows.values()} == {"v1"}
    assert rows["v_1"].finished_at is None and rows["v_2"].finished_at is not None
    assert [r.job_id for r in list_page(db, InstanceFilter(version="v2")).rows] == []


def test_the_scheduled_filter_finds_delayed_starts_not_yet_due(db):
    later = datetime.now(UTC) + timedelta(hours=1)
    past = datetime.now(UTC) - timedelta(hours=1)
    create_instances(
        db,
        [
            Delivery(JobEnvelope("s_later", "approval-workflow", {}, run_at=later), "t", 0, 0),
            Delivery(JobEnvelope("s_past", "approval-workflow", {}, run_at=past), "t", 0, 1),
            Delivery(JobEnvelope("s_now", "approval-workflow", {}), "t", 0, 2),
        ],
    )
    _create(db, ["s_paused"])
    operations.pause(db, "approval-workflow", "s_paused")

    def ids(text):
        f = InstanceFilter.parse(text)
        found = sorted(r.job_id for r in list_page(db, f, limit=100).rows)
        assert count_matching(db, f) == len(found)
        return found

    assert ids("scheduled=true") == ["s_later"]
    assert ids("scheduled=false") == ["s_now", "s_past", "s_paused"]
    assert ids("scheduled=true,workflow=order-workflow") == []
    (row,) = list_page(db, InstanceFilter(scheduled=True)).rows
    assert row.scheduled_start is not None and abs(row.scheduled_start - later) < timedelta(
        seconds=1
    )
    with pytest.raises(InvalidFilter, match="not true or false"):
        InstanceFilter.parse("scheduled=soon")


def test_the_list_query_reads_an_index_not_the_whole_table(db):
    seed_for_bench(db, 20_000, prefix="ex_")
    for sort in ("created", "updated"):
        plan = explain_list(db, InstanceFilter(), sort)  # type: ignore[arg-type]
        assert "Seq Scan on onceflow_instances" not in plan, plan
        assert "Index Scan Backward using onceflow_instances_" in plan, plan
    plan = explain_list(db, InstanceFilter(workflow="bench-wf-1"))
    assert "Seq Scan on onceflow_instances" not in plan, plan
    # a version is a plain AND beside the workflow: the workflow's indexes still serve it
    plan = explain_list(db, InstanceFilter(workflow="bench-wf-1", version="v1"))
    assert "Seq Scan on onceflow_instances" not in plan, plan
    # a deep page is as cheap as the first: the cursor is a range on the same index
    first = list_page(db, InstanceFilter(), limit=50)
    assert first.next_cursor is not None and len(first.rows) == 50
    assert count_matching(db, InstanceFilter()) == 20_000


def test_overview_counts_per_workflow_status_and_minute(db):
    _create(db, ["o_1", "o_2"])
    _create(db, ["o_3"], workflow="order-workflow")
    operations.terminate(db, "order-workflow", "o_3")
    record_dead_letters(
        db,
        [
            DeadLetterRow("t", 0, n, None, DeadLetterReason.NOT_JSON, "", 1, "x", False, "dlq")
            for n in range(2)
        ],
    )
    view = overview(db, minutes=5)
    assert view.counts == {
        "approval-workflow": {InstanceStatus.QUEUED: 2},
        "order-workflow": {InstanceStatus.TERMINATED: 1},
    }
    assert len(view.created_per_minute) == 5
    assert sum(n for _, n in view.created_per_minute) == 3
    assert sum(n for _, n in view.finished_per_minute) == 1
    assert [at for at, _ in view.created_per_minute] == sorted(
        at for at, _ in view.created_per_minute
    )
    assert view.dead_letters_by_reason == {"not_json": 2}
