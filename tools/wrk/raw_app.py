"""The machine's reference for ``POST /v1/jobs`` (issue 16): a raw ASGI app on uvicorn
+ uvloop + httptools with ingest's Kafka producer settings (acks=all, idempotent,
murmur2, linger 2 ms), answering 202 only after the delivery report. No auth, no
validation, no limits, no metrics, no log trail: the floor under onceflow's ingest.

    KAFKA=127.0.0.1:19092 TOPIC=t PORT=8099 python tools/wrk/raw_app.py
"""

import asyncio
import os
import threading

import orjson
import uvicorn
from confluent_kafka import Producer

TOPIC = os.environ["TOPIC"]
producer = Producer(
    {
        "bootstrap.servers": os.environ.get("KAFKA", "127.0.0.1:19092"),
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 2,
    }
)


def poll() -> None:
    while True:
        producer.poll(0.1)


threading.Thread(target=poll, daemon=True).start()


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    doc = orjson.loads(body)
    jobs = doc.get("jobs", [doc])  # one job, or a batch of them
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    acks: list = []

    def on_delivery(err, msg):  # type: ignore[no-untyped-def]
        acks.append((err, msg.partition(), msg.offset()))
        if len(acks) == len(jobs):
            loop.call_soon_threadsafe(done.set_result, None)

    for job in jobs:
        producer.produce(
            TOPIC, key=job["job_id"].encode(), value=orjson.dumps(job), on_delivery=on_delivery
        )
    await done
    status = 202 if all(err is None for err, _, _ in acks) else 503
    answer = orjson.dumps({"accepted": [{"partition": p, "offset": o} for _, p, o in acks]})
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(os.environ.get("PORT", "8099")),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="info",  # wrkbench waits for "Application startup complete"
    )
