"""Filter and cursor times with any UTC offset Python reads (up to ±23:59) answer as
the same moment in UTC, and a time out of range is a 400 with a reason; PostgreSQL
takes offsets up to ±15:59 only, and such a time reached it and answered 500 (issue 23).
Through HTTP: the admin API's bulk filter and list cursor, the console's list."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone

import orjson
from fastapi.testclient import TestClient

import console
from onceflow.envelope import JobEnvelope
from producers.api import create_app
from producers.models import ErrorBody
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances

PLUS_20 = timezone(timedelta(hours=20))
MINUS_18 = timezone(-timedelta(hours=18, minutes=30))


class NoKafka:
    async def send(self, envelopes):  # pragma: no cover - not used here
        raise AssertionError("no job submission in this test")

    def ready(self):
        return True

    def close(self):
        return 0


def _seed(db, n: int = 3) -> datetime:
    for i in range(n):
        create_instances(db, [Delivery(JobEnvelope(f"tz_{i}", "order-workflow", {}), "t", 0, i)])
    return datetime.now(UTC)


def _cursor(at: str) -> str:
    raw = orjson.dumps({"s": "created", "t": at, "j": "tz_9"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _dry_run(client: TestClient, filter_text: str):
    return client.post("/v1/instances/bulk/pause", json={"filter": filter_text, "dry_run": True})


def test_admin_filter_times_with_far_offsets_mean_the_same_moment(settings, db):
    now = _seed(db)
    hour_ago = (now - timedelta(hours=1)).astimezone(PLUS_20).isoformat()
    in_an_hour = (now + timedelta(hours=1)).astimezone(MINUS_18).isoformat()
    with TestClient(create_app(settings, NoKafka())) as client:
        since = _dry_run(client, f"job_id_prefix=tz_,created_from={hour_ago}")
        until = _dry_run(client, f"job_id_prefix=tz_,created_to={in_an_hour}")
        later = _dry_run(client, f"job_id_prefix=tz_,created_from={in_an_hour}")
        listed = client.get("/v1/instances", params={"prefix": "tz_", "cursor": _cursor(hour_ago)})
    assert (since.status_code, since.json()["count"]) == (200, 3), since.text
    assert (until.status_code, until.json()["count"]) == (200, 3), until.text
    assert (later.status_code, later.json()["count"]) == (200, 0), later.text
    # a cursor pointing an hour back (at +20:00): everything created since lies before it
    assert (listed.status_code, listed.json()["instances"]) == (200, []), listed.text


def test_admin_times_out_of_range_are_a_400_with_a_reason(settings, db):
    _seed(db, 1)
    with TestClient(create_app(settings, NoKafka())) as client:
        year_0 = _dry_run(client, "created_from=0001-01-01T00:00:00+05:00")
        year_10000 = _dry_run(client, "created_to=9999-12-31T23:00:00-05:00")
        cursor = client.get("/v1/instances", params={"cursor": _cursor("0001-01-01T00:00+20:00")})
    for answer in (year_0, year_10000):
        assert answer.status_code == 400, answer.text
        body = answer.json()
        assert set(body) == set(ErrorBody.model_fields)
        assert body["error"] == "invalid_filter" and "out of range" in body["message"]
    assert cursor.status_code == 400 and cursor.json()["error"] == "invalid_filter"
    assert "invalid cursor" in cursor.json()["message"]


def test_console_list_takes_far_offsets_and_refuses_times_out_of_range(settings, db):
    now = _seed(db)
    client = TestClient(console.create_app(settings, db), base_url="http://testserver")
    hour_ago = (now - timedelta(hours=1)).astimezone(PLUS_20).isoformat()
    listed = client.get("/instances", params={"job_id_prefix": "tz_", "created_from": hour_ago})
    assert listed.status_code == 200 and "tz_2" in listed.text, listed.text[:500]
    paged = client.get("/instances", params={"cursor": _cursor(hour_ago)})
    assert paged.status_code == 200 and "tz_2" not in paged.text
    out = client.get("/instances", params={"created_from": "0001-01-01T00:00:00+05:00"})
    assert out.status_code == 400 and "out of range" in out.text
