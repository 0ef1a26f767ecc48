"""Searchable attributes (issue 26, item 7) on real Kafka and PostgreSQL: submitted over
HTTP and in a raw Kafka envelope (the real worker as a subprocess), bad ones refused
(422) or dead-lettered (``invalid_attributes``); updated by ``ctx.set_attributes``
across a killed engine's replay, once; filtered in the one list API, the admin API,
the CLI and bulk operations; and the ``@>`` filter planned on the GIN index.
"""

from __future__ import annotations

import importlib
import threading

import orjson
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fastapi.testclient import TestClient

import onceflow_examples  # noqa: F401  (registers noop-workflow and send-welcome-email)
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction
from onceflow_tools.benchsql import seed_for_bench
from onceflow_tools.processes import ProcessGroup
from producers.api import create_app
from tests.conftest import settings_env
from tests.integration.interleavings import (
    EngineHarness,
    check_history,
    rows,
    scalar,
    status,
    wait_for,
)
from tests.integration.kafka_helpers import produce
from tests.integration.test_interleavings import expire_and_rescue
from tests.integration.test_streams_worker import start_worker
from workflow_engine import workflow
from workflow_engine.model import Delivery
from workflow_engine.store.operations import fork, run_bulk, start_bulk
from workflow_engine.store.views import (
    InstanceFilter,
    count_matching,
    describe_instance,
    explain_list,
    list_page,
)
from workflow_engine.store.writes import create_instances

WORKFLOW = "noop-workflow"


def _attributes(db, job_id: str):
    return scalar(db, "SELECT attributes FROM onceflow_instances WHERE job_id = :j", j=job_id)


def test_attributes_submitted_over_http_and_kafka_are_stored_and_bad_ones_refused(
    settings, db, tmp_path
):
    raw = [
        {"job_id": "at_k1", "workflow": WORKFLOW, "params": {}, "attributes": {"tenant": "k"}},
        {"job_id": "at_bad1", "workflow": WORKFLOW, "params": {}, "attributes": {"Tenant": "k"}},
        {"job_id": "at_bad2", "workflow": WORKFLOW, "params": {}, "attributes": {"v": "x" * 257}},
        {
            "job_id": "at_task",
            "workflow": "send-welcome-email",
            "params": {"user": "u"},
            "attributes": {"tenant": "k"},
        },
    ]
    produce(
        settings.kafka_bootstrap_servers,
        settings.jobs_topic,
        [(doc["job_id"].encode(), orjson.dumps(doc), []) for doc in raw],
    )
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        with TestClient(create_app(settings)) as client:
            one = {"job_id": "at_h1", "workflow": WORKFLOW, "attributes": {"tenant": "acme"}}
            assert client.post("/v1/jobs", json=one).status_code == 202
            batch = {
                "jobs": [
                    {"job_id": "at_b1", "workflow": WORKFLOW, "attributes": {"n": 2, "ok": True}},
                    {"job_id": "at_b2", "workflow": WORKFLOW},
                ]
            }
            assert client.post("/v1/jobs", json=batch).status_code == 202
            refused = client.post(
                "/v1/jobs",
                json={"jobs": [one | {"job_id": "at_r1", "attributes": {"k": [1]}}]},
            )
            too_many = client.post(
                "/v1/jobs",
                json={"workflow": WORKFLOW, "attributes": {f"k{i}": i for i in range(17)}},
            )
        wait_for(
            lambda: (
                scalar(db, "SELECT count(*) FROM onceflow_instances WHERE job_id LIKE 'at_%'") == 4
                and scalar(db, "SELECT count(*) FROM onceflow_dead_letters") == 3
            ),
            "the instances and the dead letters",
            60,
        )
    assert _attributes(db, "at_h1") == {"tenant": "acme"}
    assert _attributes(db, "at_b1") == {"n": 2, "ok": True}
    assert _attributes(db, "at_b2") == {}
    assert _attributes(db, "at_k1") == {"tenant": "k"}
    assert refused.status_code == 422 and refused.json()["error"] == "invalid_attributes"
    assert refused.json()["fields"][0]["field"] == "jobs[0].attributes"
    assert "not list" in refused.json()["message"]
    assert too_many.status_code == 422 and "17 keys, at most 16" in too_many.json()["message"]
    assert scalar(db, "SELECT count(*) FROM onceflow_jobs WHERE job_id = 'at_r1'") == 0
    dead = rows(db, "SELECT job_id, reason, detail FROM onceflow_dead_letters ORDER BY job_id")
    assert [(j, r) for j, r, _ in dead] == [
        ("at_bad1", "invalid_attributes"),
        ("at_bad2", "invalid_attributes"),
        ("at_task", "invalid_attributes"),
    ]
    assert "does not match" in dead[0][2] and "257 characters" in dead[1][2]
    assert "is a task" in dead[2][2]


# -- ctx.set_attributes across a kill and a replay -------------------------------------

REPLAYED = "test-attributes-replay"
GATE = threading.Event()
EXECUTIONS: dict[str, int] = {}


def _count(step: str) -> int:
    EXECUTIONS[step] = EXECUTIONS.get(step, 0) + 1
    if step == "two" and EXECUTIONS[step] == 1:
        GATE.wait(30)  # the first run is killed in here
    return EXECUTIONS[step]


@workflow(REPLAYED)
async def replayed(ctx, params):
    await ctx.step("one", _count, "one")
    await ctx.set_attributes({"stage": "charged", "tier": None})
    # Were the first update applied again on replay, after this one, "stage" would be
    # back at the end: the last update leaves it alone.
    await ctx.set_attributes({"stage": None, "charged": True})
    await ctx.step("two", _count, "two")
    await ctx.set_attributes({"finished": 1})
    return "ok"


@workflow("test-attributes-refused")
async def refused(ctx, params):
    await ctx.set_attributes({"fine": "yes"})
    await ctx.set_attributes({f"k{i}": i for i in range(16)})  # 17 with "fine"


@workflow("test-attributes-not-a-dict")
async def not_a_dict(ctx, params):
    await ctx.set_attributes([("tenant", "globex")])  # pairs: not turned into a dict


# Every change of an instance's attributes, in order (a trigger of the test's database):
# an update applied again on replay shows as states the row went through again. (The end
# state alone cannot show it: merges replayed in order end where they did.)
_LOG_CHANGES = [
    "CREATE TABLE test_attribute_changes (id bigserial PRIMARY KEY, job_id text, attrs jsonb)",
    "CREATE FUNCTION test_log_attributes() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN INSERT INTO test_attribute_changes (job_id, attrs)"
    " VALUES (NEW.job_id, NEW.attributes); RETURN NEW; END $$",
    "CREATE TRIGGER test_log_attributes AFTER UPDATE OF attributes ON onceflow_instances"
    " FOR EACH ROW EXECUTE FUNCTION test_log_attributes()",
]


def test_set_attributes_survives_a_killed_engine_and_is_applied_once(settings, db):
    EXECUTIONS.clear()
    GATE.clear()
    with db.begin() as conn:
        for statement in _LOG_CHANGES:
            conn.exec_driver_sql(statement)
    env = JobEnvelope("at_replay", REPLAYED, {}, attributes={"tenant": "acme", "tier": "gold"})
    create_instances(db, [Delivery(env, "t", 0, 0)])
    first = EngineHarness(settings, db).start()
    try:
        wait_for(lambda: EXECUTIONS.get("two") == 1, "the first run inside step two")
        # both updates committed before the step: the change and its history entry
        assert _attributes(db, "at_replay") == {"tenant": "acme", "charged": True}
        first.kill()
    finally:
        GATE.set()
        first.kill()
    expire_and_rescue(db, "at_replay")
    with EngineHarness(settings, db):
        wait_for(lambda: status(db, "at_replay") == "complete", "the replayed run's end")
    assert _attributes(db, "at_replay") == {"tenant": "acme", "charged": True, "finished": 1}
    assert EXECUTIONS == {"one": 1, "two": 2}  # step one replayed from its checkpoint
    entries = rows(
        db,
        "SELECT position, name, result FROM onceflow_steps WHERE job_id = 'at_replay'"
        " AND kind = 'attributes' ORDER BY position",
    )
    assert [tuple(e) for e in entries] == [
        (1, "set_attributes#1", {"stage": "charged", "tier": None}),
        (2, "set_attributes#2", {"stage": None, "charged": True}),
        (4, "set_attributes#4", {"finished": 1}),
    ]
    changes = rows(db, "SELECT attrs FROM test_attribute_changes ORDER BY id")
    assert [c for (c,) in changes] == [
        {"tenant": "acme", "stage": "charged"},
        {"tenant": "acme", "charged": True},
        {"tenant": "acme", "charged": True, "finished": 1},
    ]
    view = describe_instance(db, "at_replay")
    assert view is not None and view.attributes == {
        "tenant": "acme",
        "charged": True,
        "finished": 1,
    }
    assert check_history(db) == []
    # A fork copies the recorded updates before its position: it starts with the
    # origin's attributes, as its replay will not apply those entries again.
    forked = fork(db, REPLAYED, "at_replay", from_step="two")
    assert forked.copied == 3  # step one and the two updates before step two
    assert _attributes(db, forked.job_id) == view.attributes


def test_set_attributes_past_the_bounds_is_a_clear_error_and_writes_nothing(settings, db):
    create_instances(
        db, [Delivery(JobEnvelope("at_refused", "test-attributes-refused", {}), "t", 0, 0)]
    )
    with EngineHarness(settings, db):
        wait_for(lambda: status(db, "at_refused") == "errored", "the refused update")
    view = describe_instance(db, "at_refused")
    assert view is not None
    assert "ctx.set_attributes refused: attributes has 17 keys, at most 16" in (view.error or "")
    assert view.attributes == {"fine": "yes"}
    assert (
        scalar(
            db,
            "SELECT count(*) FROM onceflow_steps WHERE job_id = 'at_refused'"
            " AND kind = 'attributes'",
        )
        == 1
    )


def test_set_attributes_given_pairs_instead_of_a_dict_is_refused(settings, db):
    env = JobEnvelope("at_pairs", "test-attributes-not-a-dict", {}, attributes={"tenant": "acme"})
    create_instances(db, [Delivery(env, "t", 0, 0)])
    with EngineHarness(settings, db):
        wait_for(lambda: status(db, "at_pairs") in ("errored", "complete"), "the run's end")
    view = describe_instance(db, "at_pairs")
    assert view is not None and view.status == "errored", view
    assert "ctx.set_attributes refused: attributes must be a dict, not list" in (view.error or "")
    assert view.attributes == {"tenant": "acme"}


# -- filters --------------------------------------------------------------------------

_SEEDED = {
    "af_1": {"tenant": "acme", "tier": "gold"},
    "af_2": {"tenant": "acme", "tier": "silver"},
    "af_3": {"tenant": "acme", "tier": 2},
    "af_4": {"tenant": "globex", "tier": "gold"},
    "af_5": {"tier": "2"},
    "af_6": {},
}


def _seed(db) -> None:
    create_instances(
        db,
        [
            Delivery(JobEnvelope(job_id, "approval-workflow", {}, attributes=attrs), "t", 0, i)
            for i, (job_id, attrs) in enumerate(_SEEDED.items())
        ],
    )


def _ids(db, text: str) -> list[str]:
    f = InstanceFilter.parse(text)
    found = sorted(r.job_id for r in list_page(db, f).rows)
    assert count_matching(db, f) == len(found)
    return found


def test_the_filter_matches_in_the_list_the_admin_api_and_the_cli(settings, db, monkeypatch):
    _seed(db)
    assert _ids(db, "attr.tenant=acme") == ["af_1", "af_2", "af_3"]
    assert _ids(db, "attr.tenant=acme,attr.tier=gold") == ["af_1"]
    assert _ids(db, "attr.tier=2") == ["af_3", "af_5"]  # the number and the string
    assert _ids(db, "attr.tier=gold,prefix=af_") == ["af_1", "af_4"]
    assert _ids(db, "attr.tenant=nobody") == []
    assert _ids(db, "attr.nokey=acme") == []

    from tests.integration.test_admin_http import NoKafka

    with TestClient(create_app(settings, NoKafka())) as client:
        listed = client.get(
            "/v1/instances", params=[("attr.tenant", "acme"), ("attr.tier", "gold")]
        )
        assert listed.status_code == 200, listed.text
        assert [r["job_id"] for r in listed.json()["instances"]] == ["af_1"]
        assert listed.json()["instances"][0]["attributes"] == {"tenant": "acme", "tier": "gold"}
        both = client.get(
            "/v1/instances", params={"attr.tenant": "acme", "status": "queued", "count": "true"}
        )
        assert both.json()["count"] == 3
        described = client.get("/v1/instances/approval-workflow/af_4").json()
        assert described["attributes"] == {"tenant": "globex", "tier": "gold"}
        bad = [
            client.get("/v1/instances", params={"attr.Tenant": "acme"}),
            client.get("/v1/instances", params=[("attr.tier", "a"), ("attr.tier", "b")]),
            client.get("/v1/instances", params={"attr.tier": "x" * 300}),
            # the key is the whole parameter name: an "=" in it is not a value's start
            client.get("/v1/instances", params={"attr.tenant=acme": "x"}),
        ]
        assert [r.status_code for r in bad] == [400, 400, 400, 400]
        assert [r.json()["error"] for r in bad] == ["invalid_filter"] * 4
        assert "does not match" in bad[0].json()["message"]
        assert "given twice" in bad[1].json()["message"]

    main = importlib.import_module("onceflow_cli.main")
    monkeypatch.setattr(main, "_settings", lambda: settings)
    cli = CliRunner()
    out = cli.invoke(
        main.cli, ["instances", "list", "--attr", "tenant=acme", "--attr", "tier=gold", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert [orjson.loads(line)["job_id"] for line in out.output.splitlines()] == ["af_1"]
    out = cli.invoke(
        main.cli, ["instances", "list", "--filter", "attr.tier=2", "--attr", "tenant=acme"]
    )
    assert out.exit_code == 0 and out.output.split("\t")[0] == "af_3", out.output
    bad_cli = cli.invoke(main.cli, ["instances", "list", "--attr", "tenant"])
    assert bad_cli.exit_code != 0 and "not key=value" in str(bad_cli.exception)
    described = cli.invoke(main.cli, ["instances", "describe", "approval-workflow", "af_3"])
    assert 'attributes: tenant="acme", tier=2' in described.output, described.output


def test_a_bulk_operation_by_attributes_touches_only_the_matching(db):
    _seed(db)
    f = InstanceFilter.parse("attr.tenant=acme,attr.tier=gold")
    op = start_bulk(db, BulkAction.TERMINATE, f)
    assert (op.total, op.filter) == (1, "attr.tenant=acme,attr.tier=gold")
    done = run_bulk(db, op.id)
    assert (done.status, done.done) == ("complete", 1)
    statuses = dict(
        rows(db, "SELECT job_id, status FROM onceflow_instances WHERE job_id LIKE 'af_%'")
    )
    assert statuses == {j: ("terminated" if j == "af_1" else "queued") for j in _SEEDED}


@pytest.mark.timeout(120)
def test_the_attribute_filter_is_planned_on_the_gin_index(db):
    seed_for_bench(db, 20_000, prefix="gx_", tenants=1000)  # 20 instances per tenant
    f = InstanceFilter.parse("attr.tenant=t7")
    plan = explain_list(db, f)
    assert "onceflow_instances_attributes_idx" in plan, plan
    assert "Seq Scan on onceflow_instances" not in plan, plan
    assert count_matching(db, f) == 20
    assert len(list_page(db, f).rows) == 20
    with db.connect() as conn:
        counted = "\n".join(
            conn.execute(
                sa.text(
                    "EXPLAIN SELECT count(*) FROM onceflow_instances i"
                    " WHERE i.attributes @> CAST(:d AS jsonb)"
                ),
                {"d": '{"tenant": "t7"}'},
            ).scalars()
        )
    assert "onceflow_instances_attributes_idx" in counted, counted


def test_the_console_filters_shows_and_bulk_acts_by_attributes(settings, db):
    import re

    from tests.integration.test_console import client_for, csrf_of

    _seed(db)
    client = client_for(settings, db)
    page = client.get("/instances", params={"attributes": "tenant=acme, tier=gold"})
    assert page.status_code == 200
    assert re.findall(r">(af_\d)</a>", page.text) == ["af_1"]
    assert "<code>attr.tenant=acme,attr.tier=gold</code>" in page.text
    assert 'value="tenant=acme, tier=gold"' in page.text  # the field keeps what was typed
    by_url = client.get("/instances?attr.tier=2")
    assert sorted(re.findall(r">(af_\d)</a>", by_url.text)) == ["af_3", "af_5"]
    # a value with a comma: the field writes it escaped, so submitting it again finds it
    create_instances(
        db,
        [Delivery(JobEnvelope("af_comma", WORKFLOW, {}, attributes={"note": "a,b\\c"}), "t", 0, 9)],
    )
    linked = client.get("/instances", params={"attr.note": "a,b\\c"})
    assert re.findall(r">(af_\w+)</a>", linked.text) == ["af_comma"]
    assert 'value="note=a\\,b\\\\c"' in linked.text, linked.text
    again = client.get("/instances", params={"attributes": "note=a\\,b\\\\c"})
    assert re.findall(r">(af_\w+)</a>", again.text) == ["af_comma"]
    bad = client.get("/instances", params={"attributes": "Tenant=acme"})
    assert bad.status_code == 400 and "does not match" in bad.text
    shown = client.get("/instances/af_3")
    assert 'id="attributes"' in shown.text and "tier=2" in shown.text
    assert 'href="/instances?attr.tier=2"' in shown.text
    # the bulk form carries the filter's attr. terms: only the matching one is touched
    token = csrf_of(client, "/instances")
    form = {"csrf_token": token, "action": "terminate", "attr.tenant": "globex"}
    ask = client.post("/bulk", data=form)
    assert re.search(r'id="confirm-count">1<', ask.text), ask.text
    started = client.post("/bulk", data={**form, "confirm": "yes"}, follow_redirects=False)
    assert started.status_code == 303
    wait_for(lambda: status(db, "af_4") == "terminated", "the console's bulk terminate")
    assert {status(db, j) for j in _SEEDED if j != "af_4"} == {"queued"}


def test_an_update_from_a_stale_claim_writes_nothing(db):
    """The update is fenced like every write of a run: an older claim of the instance
    (a run a rescue cut off), even by the same engine, changes nothing."""
    from workflow_engine.errors import LeaseLost
    from workflow_engine.store.writes import Lease, set_attributes

    env = JobEnvelope("at_fenced", WORKFLOW, {}, attributes={"tenant": "acme"})
    create_instances(db, [Delivery(env, "t", 0, 0)])
    with db.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE onceflow_instances SET status = 'running', lease_owner = 'e1',"
            " claim_count = 2, lease_expires_at = now() + interval '1 hour',"
            " started_at = now() WHERE job_id = 'at_fenced'"
        )
    for stale in (Lease("e1", 1), Lease("e2", 2)):
        with pytest.raises(LeaseLost):
            set_attributes(db, stale, "at_fenced", 0, "set_attributes#0", {"tenant": "x"})
    assert _attributes(db, "at_fenced") == {"tenant": "acme"}
    assert scalar(db, "SELECT count(*) FROM onceflow_steps WHERE job_id = 'at_fenced'") == 0
    merged = set_attributes(db, Lease("e1", 2), "at_fenced", 0, "set_attributes#0", {"n": 1})
    assert merged == _attributes(db, "at_fenced") == {"tenant": "acme", "n": 1}


def test_a_number_term_matches_exactly_what_it_spells(settings, db):
    """The number a term spells is compared as written (jsonb numeric), never as the
    64-bit float a parse makes of it: ``1e-400`` is not 0, 30 digits are not the float
    nearest them, and a number past the float range is a term that matches no number
    (a 200 with nothing, not a 500)."""
    near = 123456789012345678901234567890
    create_instances(
        db,
        [
            Delivery(JobEnvelope("an_zero", WORKFLOW, {}, attributes={"n": 0}), "t", 0, 0),
            Delivery(
                JobEnvelope("an_float", WORKFLOW, {}, attributes={"n": float(near)}), "t", 0, 1
            ),
            Delivery(JobEnvelope("an_hundred", WORKFLOW, {}, attributes={"n": 100}), "t", 0, 2),
        ],
    )
    assert _ids(db, "attr.n=0") == ["an_zero"]
    assert _ids(db, "attr.n=1e-400") == []
    assert _ids(db, f"attr.n={near}") == []
    assert _ids(db, f"attr.n={float(near)!r}") == ["an_float"]
    assert _ids(db, "attr.n=1e2") == ["an_hundred"]  # the same number, another spelling
    assert _ids(db, "attr.n=1e400") == []
    assert _ids(db, "attr.n=-1e99999") == []

    from tests.integration.test_admin_http import NoKafka

    with TestClient(create_app(settings, NoKafka())) as client:
        for text in ("1e400", "1e-400", "9" * 200):
            listed = client.get("/v1/instances", params={"attr.n": text})
            assert listed.status_code == 200, listed.text
            assert listed.json()["instances"] == []


def test_an_update_holding_a_negative_zero_is_refused_not_stored_as_zero(db):
    """PostgreSQL's numeric has no signed zero: ``-0.0`` from workflow code would be read
    back as 0.0, so it is refused like every value the store would change."""
    from workflow_engine.errors import InvalidAttributes
    from workflow_engine.store.writes import Lease, set_attributes

    create_instances(db, [Delivery(JobEnvelope("at_negzero", WORKFLOW, {}), "t", 0, 0)])
    with db.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE onceflow_instances SET status = 'running', lease_owner = 'e1',"
            " claim_count = 1, lease_expires_at = now() + interval '1 hour',"
            " started_at = now() WHERE job_id = 'at_negzero'"
        )
    with pytest.raises(InvalidAttributes, match="negative zero"):
        set_attributes(db, Lease("e1", 1), "at_negzero", 0, "set_attributes#0", {"z": -0.0})
    assert _attributes(db, "at_negzero") == {}
    assert scalar(db, "SELECT count(*) FROM onceflow_steps WHERE job_id = 'at_negzero'") == 0


def _running(db, job_id: str) -> None:
    create_instances(db, [Delivery(JobEnvelope(job_id, WORKFLOW, {}), "t", 0, 0)])
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'running', lease_owner = 'e1',"
                " claim_count = 1, lease_expires_at = now() + interval '1 hour',"
                " started_at = now() WHERE job_id = :j"
            ),
            {"j": job_id},
        )


def test_a_number_the_rule_takes_is_stored_as_it_and_never_blocks_a_later_update(db):
    """jsonb prints a number in plain decimal (1e16 as 17 digits, read back as the
    integer 10**16; 1e-300 as 302 characters): the rule bounds a float's magnitude like
    an integer's and counts a number's stored size, so what it takes fits the column's
    check and is read back as a value the rule takes again (a later update merges it)."""
    from workflow_engine.errors import InvalidAttributes
    from workflow_engine.store.writes import Lease, set_attributes

    lease = Lease("e1", 1)
    _running(db, "at_numbers")
    set_attributes(db, lease, "at_numbers", 0, "set_attributes#0", {"f": 9.0e15, "g": 1.5e-5})
    merged = set_attributes(db, lease, "at_numbers", 1, "set_attributes#1", {"n": 1})
    assert merged == _attributes(db, "at_numbers") == {"f": 9.0e15, "g": 1.5e-5, "n": 1}
    with pytest.raises(InvalidAttributes, match="beyond"):
        set_attributes(db, lease, "at_numbers", 2, "set_attributes#2", {"big": 1e16})
    tiny = {f"k{i}": 1e-300 for i in range(13)}  # 302 bytes each as stored
    with pytest.raises(InvalidAttributes, match="bytes"):
        set_attributes(db, lease, "at_numbers", 2, "set_attributes#2", tiny)
    assert _attributes(db, "at_numbers") == {"f": 9.0e15, "g": 1.5e-5, "n": 1}
    assert scalar(db, "SELECT count(*) FROM onceflow_steps WHERE job_id = 'at_numbers'") == 2
