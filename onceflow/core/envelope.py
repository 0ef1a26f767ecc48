"""The job envelope: the small Kafka record one accepted job becomes.

Key: the job id (UTF-8). Value: compact JSON (below). Headers repeat the ids so that
a consumer, a DLQ reader or ``kcat`` can see them without parsing the value.

    {"v": 1, "job_id": "job_01J…", "workflow": "order-workflow", "params": {…},
     "request_id": "req_01J…", "submitted_at": "2026-11-29T16:00:00.123+00:00",
     "traceparent": "00-…-…-01"}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from onceflow.core.errors import InvalidEnvelope
from onceflow.core.ids import is_valid_job_id

ENVELOPE_VERSION = 1

# Kafka record headers as confluent-kafka takes them.
KafkaHeaders = list[tuple[str, str | bytes | None]]

HEADER_JOB_ID = "onceflow-job-id"
HEADER_REQUEST_ID = "onceflow-request-id"
HEADER_SUBMITTED_AT = "onceflow-submitted-at"
HEADER_WORKFLOW = "onceflow-workflow"
HEADER_TRACEPARENT = "traceparent"
HEADER_DLQ_REASON = "onceflow-dlq-reason"
HEADER_DLQ_SOURCE = "onceflow-dlq-source"


def params_digest(params: Any) -> str:
    """A stable digest of a job's params (key order does not matter).

    Two submissions of one job id are "the same job" only if their digests match;
    otherwise the later one is recorded as a payload mismatch.
    """
    return hashlib.sha256(orjson.dumps(params, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class JobEnvelope:
    job_id: str
    workflow: str
    params: dict[str, Any]
    request_id: str = ""
    submitted_at: datetime = field(default_factory=_now)
    traceparent: str = ""

    def key(self) -> bytes:
        return self.job_id.encode()

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": ENVELOPE_VERSION,
                "job_id": self.job_id,
                "workflow": self.workflow,
                "params": self.params,
                "request_id": self.request_id,
                "submitted_at": self.submitted_at.isoformat(timespec="microseconds"),
                "traceparent": self.traceparent,
            }
        )

    def headers(self) -> KafkaHeaders:
        headers: KafkaHeaders = [
            (HEADER_JOB_ID, self.job_id.encode()),
            (HEADER_WORKFLOW, self.workflow.encode()),
            (HEADER_REQUEST_ID, self.request_id.encode()),
            (HEADER_SUBMITTED_AT, self.submitted_at.isoformat(timespec="microseconds").encode()),
        ]
        if self.traceparent:
            headers.append((HEADER_TRACEPARENT, self.traceparent.encode()))
        return headers

    @classmethod
    def decode(cls, key: bytes | None, value: bytes | None) -> JobEnvelope:
        """Parse and validate a record; raise :class:`InvalidEnvelope` saying why not."""
        if value is None:
            raise InvalidEnvelope("record has no value")
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidEnvelope(f"value is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise InvalidEnvelope("value is not a JSON object")
        if doc.get("v") != ENVELOPE_VERSION:
            raise InvalidEnvelope(f"unsupported envelope version {doc.get('v')!r}")
        job_id = doc.get("job_id")
        if not isinstance(job_id, str) or not is_valid_job_id(job_id):
            raise InvalidEnvelope(f"invalid job_id {job_id!r}")
        if key is not None and key != job_id.encode():
            raise InvalidEnvelope("record key does not match job_id")
        workflow = doc.get("workflow")
        if not isinstance(workflow, str) or not workflow:
            raise InvalidEnvelope("missing workflow")
        params = doc.get("params")
        if not isinstance(params, dict):
            raise InvalidEnvelope("params must be a JSON object")
        try:
            submitted_at = datetime.fromisoformat(doc["submitted_at"])
        except (KeyError, TypeError, ValueError):
            raise InvalidEnvelope("missing or invalid submitted_at") from None
        return cls(
            job_id=job_id,
            workflow=workflow,
            params=params,
            request_id=str(doc.get("request_id") or ""),
            submitted_at=submitted_at,
            traceparent=str(doc.get("traceparent") or ""),
        )
