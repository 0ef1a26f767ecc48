"""The single-job fast path's parts: ids, the cheap log trail, delivery reports handed
to their requests, and the answers of the fast path itself (BENCHMARKS.md,
"Single-job requests: where the time goes")."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import threading
import time

import orjson
import pytest
from fastapi.testclient import TestClient
from ulid import ULID

from onceflow.ids import new_job_id, new_request_id, new_traceparent, new_traceparents, new_ulid
from onceflow.logs import EventLog, JsonFormatter, JsonLines
from onceflow.settings import Settings
from producers.api import create_app
from producers.broker_link import BrokerLink
from producers.delivery import LOOP_POLLING_FROM, Deliveries


def test_ulids_are_what_python_ulid_writes_and_reads():
    before = time.time()
    ids = [new_ulid() for _ in range(2000)] + [new_request_id()[4:] for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = ULID.from_str(text)
        assert str(parsed) == text
        assert before - 0.01 <= parsed.timestamp <= time.time() + 0.01
    assert len(new_job_id()) == 30 and new_job_id().startswith("job_")


def test_traceparents_are_well_formed_and_distinct():
    batch = new_traceparents(1000)
    values = {new_traceparent() for _ in range(1000)} | set(batch)
    assert len(batch) == 1000 and len(values) == 2000
    trace_ids = {value.split("-")[1] for value in batch}
    span_ids = {value.split("-")[2] for value in batch}
    assert len(trace_ids) == len(span_ids) == 1000  # no slice shared between two jobs
    for value in values:
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", value), value


@pytest.fixture
def json_logger():
    """Gives a logger whose records reach one JsonLines handler writing to a buffer
    (installed when called: pytest adds its capturing handlers as the test starts)."""
    stream = io.StringIO()
    logger = logging.getLogger("tests.fast_path")

    def install() -> tuple[logging.Logger, io.StringIO]:
        logger.handlers[:] = [JsonLines(stream, "ingest")]
        logger.propagate = False
        logger.setLevel(logging.INFO)
        return logger, stream

    yield install
    logger.handlers[:] = []
    logger.propagate = True


def test_event_log_writes_the_formatters_line_once_the_loop_turns(json_logger):
    logger, stream = json_logger()
    trail = EventLog(logger, "job.accepted", "job accepted")

    async def log_two() -> str:
        trail.info({"job_id": "a", "partition": 1, "offset": 7})
        trail.info({"job_id": "b", "partition": 0, "offset": 8})
        written_at_once = stream.getvalue()
        await asyncio.sleep(0)  # one loop iteration: the waiting lines are written
        return written_at_once

    assert asyncio.run(log_two()) == ""
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["job_id"] for line in lines] == ["a", "b"]
    record = logging.makeLogRecord(
        {
            "name": logger.name,
            "levelname": "INFO",
            "msg": "job accepted",
            "event": "job.accepted",
            "job_id": "a",
            "partition": 1,
            "offset": 7,
        }
    )
    expected = orjson.loads(JsonFormatter("ingest").format(record))
    assert set(lines[0]) == set(expected)
    assert {k: v for k, v in lines[0].items() if k != "ts"} == {
        k: v for k, v in expected.items() if k != "ts"
    }


def test_an_ordinary_record_first_writes_the_waiting_lines(json_logger):
    logger, stream = json_logger()
    trail = EventLog(logger, "job.accepted", "job accepted")

    async def interleave() -> None:
        trail.info({"job_id": "first"})
        logger.warning("then this", extra={"event": "other"})

    asyncio.run(interleave())
    events = [orjson.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["job.accepted", "other"]


def test_event_log_without_the_json_handler_is_an_ordinary_record(caplog):
    trail = EventLog(logging.getLogger("tests.fast_path.plain"), "job.accepted", "job accepted")
    with caplog.at_level(logging.INFO):
        trail.info({"job_id": "x1"})
    [record] = [r for r in caplog.records if r.name == "tests.fast_path.plain"]
    assert record.event == "job.accepted" and record.job_id == "x1"  # type: ignore[attr-defined]


class FakeMessage:
    def __init__(self, partition: int, offset: int) -> None:
        self._at = (partition, offset)

    def partition(self) -> int:
        return self._at[0]

    def offset(self) -> int:
        return self._at[1]


class FakeProducer:
    """Serves the callbacks given to it when polled, as librdkafka's poll does."""

    def __init__(self) -> None:
        self.callbacks: list = []
        self.polled_on: set[int] = set()

    def poll(self, timeout: float) -> int:
        self.polled_on.add(threading.get_ident())
        served, self.callbacks = self.callbacks, []
        for offset, callback in enumerate(served):
            callback(None, FakeMessage(0, offset))
        return len(served)

    def __len__(self) -> int:
        return len(self.callbacks)


def test_under_load_reports_are_polled_and_settled_on_the_requests_loop():
    producer = FakeProducer()
    deliveries = Deliveries(producer, BrokerLink())  # type: ignore[arg-type]

    async def request(count: int) -> list:
        loop = asyncio.get_running_loop()
        reports = deliveries.reports(loop, [f"j{index}" for index in range(count)])
        for index in range(count):
            producer.callbacks.append(reports.callback(index))
        deliveries.produced(loop, count)
        await asyncio.wait_for(reports.done, 5)
        return reports.acks

    async def main() -> list:
        # 3 + the rest waiting at once: LOOP_POLLING_FROM reached
        return await asyncio.gather(request(3), request(LOOP_POLLING_FROM - 3))

    three, rest = asyncio.run(main())
    assert [a.job_id for a in three] == ["j0", "j1", "j2"] and all(a.ok for a in three)
    assert len(rest) == LOOP_POLLING_FROM - 3 and all(a.ok and a.partition == 0 for a in rest)
    assert producer.polled_on == {threading.get_ident()}  # no thread, no hand-over


def test_at_light_load_the_loop_leaves_the_polling_to_the_thread():
    producer = FakeProducer()
    deliveries = Deliveries(producer, BrokerLink())  # type: ignore[arg-type]

    async def one_record() -> None:
        loop = asyncio.get_running_loop()
        reports = deliveries.reports(loop, ["j0"])
        producer.callbacks.append(reports.callback(0))
        deliveries.produced(loop, 1)
        await asyncio.sleep(0.05)  # a hundred loop-polling intervals

    asyncio.run(one_record())
    assert producer.polled_on == set() and len(producer.callbacks) == 1


def test_reports_served_on_another_thread_reach_their_loop():
    producer = FakeProducer()
    deliveries = Deliveries(producer, BrokerLink())  # type: ignore[arg-type]

    async def main() -> list:
        loop = asyncio.get_running_loop()
        reports = deliveries.reports(loop, ["j0", "j1"])
        for index in range(2):
            producer.callbacks.append(reports.callback(index))
        # served by a flush or the poll thread, not by this loop's polling
        served = threading.Thread(target=lambda: (producer.poll(0), deliveries.dispatch(None)))
        served.start()
        served.join()
        await asyncio.wait_for(reports.done, 5)
        return reports.acks

    acks = asyncio.run(main())
    assert [(a.job_id, a.offset) for a in acks] == [("j0", 0), ("j1", 1)]


class Exploding:
    async def send(self, envelopes):
        raise RuntimeError("boom")

    def ready(self):
        return True

    def close(self):
        return 0


def test_the_fast_path_answers_an_unexpected_error_with_the_500_shape():
    settings = Settings(auth_disabled=True, ingest_validate_types=False)
    with TestClient(create_app(settings, Exploding()), raise_server_exceptions=False) as client:
        r = client.post("/v1/jobs", json={"workflow": "w"})
    assert r.status_code == 500
    assert r.json()["error"] == "internal_error"


def test_a_nul_in_the_query_of_a_submission_is_a_400():
    settings = Settings(auth_disabled=True, ingest_validate_types=False)
    with TestClient(create_app(settings, Exploding())) as client:
        r = client.post("/v1/jobs?x=%00", json={"workflow": "w"})
    assert r.status_code == 400 and "NUL" in r.json()["message"]


def test_ingest_processes_can_share_a_port_with_reuse_port():
    import socket

    from producers.server import reuse_port_socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = reuse_port_socket("127.0.0.1", port)
    second = reuse_port_socket("127.0.0.1", port)  # a plain socket would get EADDRINUSE
    try:
        first.listen()
        second.listen()
        assert first.getsockname()[1] == second.getsockname()[1] == port
    finally:
        first.close()
        second.close()


def test_lines_still_waiting_are_written_by_flush(json_logger):
    logger, stream = json_logger()
    trail = EventLog(logger, "job.accepted", "job accepted")

    def log_and_stop() -> None:
        trail.info({"job_id": "last"})  # its write is due next iteration...
        loop.stop()  # ...which never comes

    loop = asyncio.new_event_loop()
    loop.call_soon(log_and_stop)
    loop.run_forever()
    loop.close()
    assert stream.getvalue() == ""
    logger.handlers[0].flush()  # what logging.shutdown does at exit
    assert orjson.loads(stream.getvalue())["job_id"] == "last"


def test_event_log_lines_of_one_request_share_their_start(json_logger):
    logger, stream = json_logger()
    trail = EventLog(logger, "job.accepted", "job accepted")
    rows = [{"job_id": f"j{i}", "partition": i % 3, "offset": i} for i in range(5)]

    async def log_all() -> None:
        trail.info_each({"request_id": "req_1"}, rows)
        trail.info_each({"request_id": "req_2"}, [{}])  # no fields of its own
        trail.info_each({}, [{"msg": "mine", "job_id": "k"}])  # replaces the line's msg
        await asyncio.sleep(0)

    asyncio.run(log_all())
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 7
    for row, line in zip(rows, lines, strict=False):
        assert line == {**line, "request_id": "req_1", **row}
        assert list(line)[:6] == ["ts", "level", "logger", "event", "msg", "process"]
    assert lines[5]["request_id"] == "req_2" and "job_id" not in lines[5]
    assert (lines[6]["msg"], lines[6]["job_id"]) == ("mine", "k")


def test_each_report_reaches_its_own_record_even_with_repeated_ids():
    producer = FakeProducer()
    deliveries = Deliveries(producer, BrokerLink())  # type: ignore[arg-type]

    async def main() -> list:
        loop = asyncio.get_running_loop()
        reports = deliveries.reports(loop, ["same", "same", "other"])
        for index in (2, 0, 1):  # reports come back in any order
            producer.callbacks.append(reports.callback(index))
        producer.poll(0)
        deliveries.dispatch(loop)
        await asyncio.wait_for(reports.done, 5)
        return reports.acks

    acks = asyncio.run(main())
    assert [(a.job_id, a.offset) for a in acks] == [("same", 1), ("same", 2), ("other", 0)]


def test_the_server_front_takes_submissions_and_hands_the_rest_on():
    import httpx
    import uvicorn

    from onceflow.settings import ApiKey
    from producers.api import IngestFront
    from producers.auth import hash_key, new_key
    from producers.kafka import Ack
    from producers.server import _front_first

    class Acking:
        async def send(self, envelopes):
            return [Ack(e.job_id, 0, i) for i, e in enumerate(envelopes)]

        def ready(self):
            return True

        def close(self):
            return 0

    key = new_key()
    keys = [ApiKey(name="front", sha256=hash_key(key), scopes=["jobs:submit"])]
    settings = Settings(api_keys=keys, auth_disabled=False, ingest_validate_types=False)
    app = create_app(settings, Acking())
    config = uvicorn.Config(app, forwarded_allow_ips="10.0.0.1")
    _front_first(config, app)
    config.load()
    assert isinstance(config.loaded_app, IngestFront) and not config.proxy_headers

    async def calls() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=config.loaded_app, client=("10.0.0.1", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            bearer = {"Authorization": f"Bearer {key}"}
            return [
                await client.post("/v1/jobs", json={"workflow": "w"}, headers=bearer),
                await client.post("/v1/jobs", json={"workflow": "w"}),
                await client.post("/v1/jobs", json={"jobs": []}, headers=bearer),
                await client.get("/healthz"),
            ]

    accepted, unauthorized, invalid, health = asyncio.run(calls())
    assert accepted.status_code == 202 and accepted.json()["accepted"][0]["partition"] == 0
    assert unauthorized.status_code == 401 and unauthorized.json()["error"] == "unauthorized"
    assert invalid.status_code == 422 and invalid.json()["fields"][0]["field"] == "jobs"
    assert health.status_code == 200  # the rest of the API, behind the proxy headers
