"""Job ids: the one identifier that travels through HTTP, Kafka, Postgres and logs."""

import re
import secrets

from ulid import ULID

JOB_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)


def is_valid_job_id(value: str) -> bool:
    """True if ``value`` is an acceptable client-supplied job id."""
    return bool(_JOB_ID_RE.fullmatch(value))


def new_job_id() -> str:
    """A fresh, time-sortable job id: ``job_<ULID>`` (30 characters)."""
    return f"job_{ULID()}"


def new_request_id() -> str:
    """An id for one HTTP request (several jobs can share it)."""
    return f"req_{ULID()}"


def new_traceparent() -> str:
    """A W3C ``traceparent`` header value starting a new trace."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
