"""Whether ingest has a connection to Kafka right now.

Without it, every request during a broker outage waited out the ack timeout (15 s)
before its 503, though librdkafka had said within milliseconds that no broker answered.
:class:`BrokerLink` keeps that knowledge: librdkafka's ``_ALL_BROKERS_DOWN`` error marks
the link down (measured: ~40 ms after a SIGKILLed broker's connection resets); while it
is down a watcher thread asks for metadata every :data:`PROBE_INTERVAL` seconds, and
the first answer, or any record Kafka acknowledges, marks it up again. With
``reconnect.backoff.max.ms`` at 500 ms (librdkafka's default is 10 s) the link is up
well within a second of the broker's return.

Requests refused while the link is down wrote nothing, and are told to retry after
:data:`RETRY_AFTER_SECONDS`: the link is re-checked four times a second, so by then
ingest knows whether the broker is back. A request whose records were produced before
the link went down is not cut short: its delivery reports decide its answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from producers.metrics import DEPENDENCY_UP

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.25
#: Reconnection backoff ceiling handed to librdkafka (its default, 10 s, would keep
#: ingest refusing for up to 10 s after the broker came back).
RECONNECT_BACKOFF_MAX_MS = 500
#: Whole seconds (HTTP's unit): the next probes tell within a second.
RETRY_AFTER_SECONDS = 1


class KafkaUnreachable(Exception):
    """No broker connection: the request was refused before anything was produced."""

    def __init__(self, down_for: float, reason: str) -> None:
        super().__init__(f"no connection to Kafka for {down_for:.1f}s: {reason}")
        self.down_for = down_for
        self.reason = reason
        self.retry_after = RETRY_AFTER_SECONDS


class BrokerLink:
    """The producer's connection state, fed by librdkafka's error callback, delivery
    reports and the watcher's probes. Reads are one attribute load (the hot path)."""

    def __init__(self) -> None:
        self._down_since: float | None = None
        self._reason = ""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        DEPENDENCY_UP.labels("kafka").set(1)

    @property
    def up(self) -> bool:
        return self._down_since is None

    def check(self) -> None:
        """Raise :class:`KafkaUnreachable` while the link is down."""
        since = self._down_since
        if since is not None:
            raise KafkaUnreachable(time.monotonic() - since, self._reason)

    def on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb``: only "all brokers down" says nothing can be written
        (one broker's ``_TRANSPORT`` error in a cluster does not)."""
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.mark_down(err.str())

    def on_delivered(self) -> None:
        if self._down_since is not None:
            self.mark_up()

    def mark_down(self, reason: str) -> None:
        with self._lock:
            self._reason = reason
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        DEPENDENCY_UP.labels("kafka").set(0)
        log.warning(
            "no connection to Kafka: refusing submissions at once until it is back (%s)",
            reason,
            extra={"event": "ingest.kafka_down"},
        )
        self._wake.set()

    def mark_up(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is None:
            return
        DEPENDENCY_UP.labels("kafka").set(1)
        log.info(
            "Kafka reachable again after %.1fs",
            time.monotonic() - since,
            extra={"event": "ingest.kafka_up"},
        )

    def watch(self, probe: Callable[[float], bool]) -> threading.Thread:
        """Start the thread that probes (``probe(timeout)``) while the link is down."""
        thread = threading.Thread(target=self._watch, args=(probe,), name="kafka-link")
        thread.daemon = True
        thread.start()
        return thread

    def _watch(self, probe: Callable[[float], bool]) -> None:
        while not self._stopped.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            while self._down_since is not None and not self._stopped.is_set():
                started = time.monotonic()
                try:
                    answered = probe(PROBE_INTERVAL)
                except Exception:
                    answered = False
                if answered:
                    self.mark_up()
                else:
                    self._stopped.wait(max(0.0, PROBE_INTERVAL - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
