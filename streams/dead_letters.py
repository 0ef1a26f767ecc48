"""Writing dead letters: any record, of any size, reaches the dead-letter topic.

A dead letter carries the original key, value and headers plus:

* ``onceflow-dlq-reason`` — the :class:`DeadLetterReason` code;
* ``onceflow-dlq-detail`` — the human text;
* ``onceflow-dlq-source`` — ``topic/partition@offset`` of the original;
* ``onceflow-dlq-original-size``, ``onceflow-dlq-sha256`` — of the full original value;
* ``onceflow-dlq-truncated`` — ``true`` when the copy is not the whole original.

A record the dead-letter topic cannot take whole (a compressed batch that decompressed
past ``ONCEFLOW_KAFKA_MAX_MESSAGE_BYTES``) keeps a bounded prefix of its value. If Kafka
still refuses the letter for its size, it is retried with half the room, down to no
value and no original headers; any other error is retried with backoff, forever: the
partition waits (its offsets are not committed) rather than skip a record.

Once Kafka has acknowledged a letter it is recorded in ``onceflow_dead_letters``
(``workflow_engine.store.writes.dead_letters``), with its DLQ position.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy.exc as sa_exc
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from sqlalchemy.engine import Engine

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_ORIGINAL_SIZE,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SHA256,
    HEADER_DLQ_SOURCE,
    HEADER_DLQ_TRUNCATED,
    KafkaHeaders,
)
from onceflow.settings import Settings
from streams.metrics import DEAD_LETTERED, DEAD_LETTERS_TRUNCATED, DLQ_RETRIES
from streams.records import DeadLetter
from workflow_engine.store.views import DeadLetterRow
from workflow_engine.store.writes import record_dead_letters

log = logging.getLogger(__name__)

#: Room kept free under the size limit for the record batch's own framing.
HEADROOM_BYTES = 16 * 1024
#: Below this budget a letter keeps no value and none of the original headers.
MIN_BUDGET_BYTES = 1024
MAX_DETAIL_CHARS = 2000
MAX_KEY_BYTES_WHEN_CUT = 256
# Kafka refused the letter for its size: shrink it rather than retry it as it is.
_SIZE_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
    }
)


@dataclass(frozen=True, slots=True)
class DlqMessage:
    """What is produced to the dead-letter topic for one letter, within a size budget."""

    key: bytes | None
    value: bytes | None
    headers: KafkaHeaders
    original_size: int
    sha256: str
    truncated: bool


def dlq_message(letter: DeadLetter, budget: int) -> DlqMessage:
    """The letter as a record of at most ``budget`` bytes (key + value + headers).

    The whole original when it fits; else a prefix of the value; below the smallest
    budget, the original headers and most of the key go too.
    """
    rec = letter.record
    value = rec.value
    size = len(value) if value is not None else 0
    digest = hashlib.sha256(value or b"").hexdigest()

    def ours(truncated: bool) -> KafkaHeaders:
        return [
            (HEADER_DLQ_REASON, str(letter.reason).encode()),
            (HEADER_DLQ_DETAIL, letter.detail[:MAX_DETAIL_CHARS].encode(errors="replace")),
            (HEADER_DLQ_SOURCE, rec.source.encode()),
            (HEADER_DLQ_ORIGINAL_SIZE, str(size).encode()),
            (HEADER_DLQ_SHA256, digest.encode()),
            (HEADER_DLQ_TRUNCATED, b"true" if truncated else b"false"),
        ]

    whole = [*rec.headers, *ours(False)]
    if size + _size(rec.key, whole) <= budget:
        return DlqMessage(rec.key, value, whole, size, digest, False)
    key, headers = rec.key, [*rec.headers, *ours(True)]
    if _size(key, headers) > budget - MIN_BUDGET_BYTES // 2 or budget <= MIN_BUDGET_BYTES:
        key = None if key is None else key[:MAX_KEY_BYTES_WHEN_CUT]
        headers = ours(True)
    room = max(0, budget - _size(key, headers))
    return DlqMessage(key, (value or b"")[:room], headers, size, digest, True)


def _size(key: bytes | None, headers: KafkaHeaders) -> int:
    total = len(key or b"")
    for name, raw in headers:
        total += len(name.encode()) + len(raw.encode() if isinstance(raw, str) else raw or b"")
    return total


@dataclass(slots=True)
class _Pending:
    letter: DeadLetter
    budget: int
    message: DlqMessage | None = None
    delivered: Message | None = None
    error: KafkaError | None = None
    attempts: int = 0


class DeadLetterWriter:
    """Writes dead letters and waits for Kafka's acknowledgement of every one."""

    def __init__(
        self,
        settings: Settings,
        db: Engine,
        make_producer: Callable[[], Producer],
        with_db_retry: Callable[..., Any],
    ) -> None:
        self.settings = settings
        self.db = db
        self.make_producer = make_producer
        self.with_db_retry = with_db_retry
        self.producer = make_producer()

    def write(self, letters: list[DeadLetter]) -> None:
        """Return only when every letter is on the dead-letter topic (blocks, never skips)."""
        budget = self.settings.kafka_max_message_bytes - HEADROOM_BYTES
        pending = [_Pending(letter, budget) for letter in letters]
        done: list[_Pending] = []
        backoff = 0.2  # transient errors: 0.2 s, doubling, at most 5 s
        while pending:
            self._produce(pending)
            retry: list[_Pending] = []
            for p in pending:
                if p.delivered is not None:
                    done.append(p)
                    continue
                retry.append(p)
                self._after_failure(p)
            if retry and not all(_shrinking(p) for p in retry):  # size refusals retry at once
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            pending = retry
        self._record(done)

    # --- producing ---------------------------------------------------------------------

    def _produce(self, pending: list[_Pending]) -> None:
        for p in pending:
            p.message, p.delivered, p.error = dlq_message(p.letter, p.budget), None, None
            p.attempts += 1
            self._produce_one(p)
        self.producer.flush()

    def _produce_one(self, p: _Pending) -> None:
        message = p.message
        assert message is not None

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                p.delivered = msg
            else:
                p.error = err

        while True:
            try:
                self.producer.produce(
                    self.settings.dlq_topic,
                    key=message.key,
                    value=message.value,
                    headers=message.headers,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:  # the local queue is full: let it drain
                self.producer.poll(0.5)
            except KafkaException as exc:  # refused before it left (e.g. its size)
                p.error = exc.args[0] if exc.args else KafkaError(KafkaError._FAIL)
                return

    def _after_failure(self, p: _Pending) -> None:
        err = p.error
        DLQ_RETRIES.inc()
        if _shrinking(p):
            smaller = p.budget // 2 if p.budget > MIN_BUDGET_BYTES else 0
            log.warning(
                "dead-letter topic refused %d bytes (%s); retrying with a smaller prefix",
                len(p.message.value or b"") if p.message else 0,
                err,
                extra=_log_extra(p.letter, "streams.dlq_shrink"),
            )
            p.budget = max(smaller, 0)
            if p.budget == 0:  # even an empty letter was refused: nothing left to cut
                p.budget = MIN_BUDGET_BYTES
                p.error = None  # retried as is, with backoff
            return
        if err is not None and err.fatal():
            self.producer = self.make_producer()  # an idempotent producer is done for
        log.error(
            "dead-letter topic did not acknowledge a record (%s); retrying",
            err,
            extra=_log_extra(p.letter, "streams.dlq_retry"),
        )

    # --- after the acknowledgement ---------------------------------------------------

    def _record(self, done: list[_Pending]) -> None:
        rows = [_row(p, self.settings.dlq_topic) for p in done]
        try:
            self.with_db_retry(record_dead_letters, self.db, rows)
        except sa_exc.DBAPIError as exc:
            # The letters are safe on the topic; the table is their index. Say so loudly.
            log.error(
                "could not record %d dead letters in the database: %s",
                len(rows),
                exc.orig,
                extra={"event": "streams.dead_letters_not_recorded"},
            )
        for p in done:
            assert p.message is not None
            DEAD_LETTERED.labels(str(p.letter.reason)).inc()
            if p.message.truncated:
                DEAD_LETTERS_TRUNCATED.inc()
            log.warning(
                "record dead-lettered (%s): %s",
                p.letter.reason,
                p.letter.detail,
                extra={
                    **_log_extra(p.letter, "record.dead_lettered"),
                    "detail": p.letter.detail[:MAX_DETAIL_CHARS],
                    "truncated": p.message.truncated,
                    "original_size": p.message.original_size,
                },
            )


def _shrinking(p: _Pending) -> bool:
    return p.error is not None and p.error.code() in _SIZE_ERRORS


def _row(p: _Pending, dlq_topic: str) -> DeadLetterRow:
    rec, msg, delivered = p.letter.record, p.message, p.delivered
    assert msg is not None and delivered is not None
    return DeadLetterRow(
        source_topic=rec.topic,
        source_partition=rec.partition,
        source_offset=rec.offset,
        job_id=p.letter.job_id,
        reason=p.letter.reason,
        detail=p.letter.detail[:MAX_DETAIL_CHARS],
        original_size=msg.original_size,
        sha256=msg.sha256,
        truncated=msg.truncated,
        dlq_topic=dlq_topic,
        dlq_partition=delivered.partition(),
        dlq_offset=delivered.offset(),
        headers=_text_headers(rec.headers),
    )


def _text_headers(headers: KafkaHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, raw in headers[:50]:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
        out[name[:200]] = text[:1000]
    return out


def _log_extra(letter: DeadLetter, event: str) -> dict[str, Any]:
    return {
        "event": event,
        "reason": str(letter.reason),
        "source": letter.record.source,
        "topic": letter.record.topic,
        "partition": letter.record.partition,
        "offset": letter.record.offset,
        "job_id": letter.job_id,
    }
