"""Job ids: the one identifier that travels through HTTP, Kafka, Postgres and logs."""

import os
import random
import re
import time
from collections.abc import Callable

JOB_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Byte -> a Crockford digit for its low 5 bits (256 = 8 x 32: every digit equally likely).
_DIGIT_OF_BYTE = bytes(ord(_CROCKFORD[b & 31]) for b in range(256))
_last: tuple[int, str] = (-1, "")  # (millisecond, its 10 digits): one object, swapped whole


def is_valid_job_id(value: str) -> bool:
    """True if ``value`` is an acceptable client-supplied job id."""
    return bool(_JOB_ID_RE.fullmatch(value))


#: The longest id the system derives from another (a schedule's tick and its children,
#: ``<schedule>@<instant>``; a fork, ``<job id>~fork<k>``). Derived ids carry a character
#: no client-supplied id has (``@``, ``~``), so they never collide with one.
MAX_DERIVED_JOB_ID = 200
#: After a batch's first member's id: the batch run's job id (``<member>~batch``).
BATCH_SUFFIX = "~batch"
#: Between an instance's id and its fork's number (``onceflow instances fork``).
FORK_SEPARATOR = "~fork"


def fork_job_id(job_id: str, number: int) -> str:
    """The deterministic id of ``job_id``'s fork number ``number`` (1, 2, ...)."""
    return f"{job_id}{FORK_SEPARATOR}{number}"


def is_derived_job_id(job_id: str) -> bool:
    """Whether ``job_id`` was derived by the system (a tick's, a fork's, or below one)."""
    return "@" in job_id or "~" in job_id


def new_ulid(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A ULID: 48-bit millisecond time (10 digits) and 80 random bits (16 digits), in
    Crockford's base32, as ``ulid.ULID()`` writes it. The time digits are worked out once
    per millisecond and the random ones are 16 random bytes mapped to digits by one
    ``bytes.translate``: python-ulid's object and Python encoder (and base64's pure-Python
    b32encode) were 4-7% of ingest's CPU per single-job request (one id per request).
    ``random_bytes``: os.urandom (unpredictable) unless the caller says otherwise."""
    global _last
    ms = time.time_ns() // 1_000_000
    last = _last
    if ms != last[0]:
        last = _last = (ms, "".join(_CROCKFORD[(ms >> s) & 31] for s in range(45, -5, -5)))
    return last[1] + random_bytes(16).translate(_DIGIT_OF_BYTE).decode()


def new_job_id() -> str:
    """A fresh, time-sortable job id: ``job_<ULID>`` (30 characters)."""
    return f"job_{new_ulid()}"


def new_request_id() -> str:
    """An id for one HTTP request (several jobs can share it). Unique, not secret: its
    random part comes from ``random`` (no system call per request; reseeded in a
    forked child), as OpenTelemetry's SDK makes its trace ids."""
    return f"req_{new_ulid(random.randbytes)}"


def new_traceparent() -> str:
    """A W3C ``traceparent`` header value starting a new trace (random 16-byte trace
    id and 8-byte span id, from ``random`` like OpenTelemetry's own id generator)."""
    raw = random.randbytes(24).hex()
    return f"00-{raw[:32]}-{raw[32:]}-01"


def new_traceparents(count: int) -> list[str]:
    """``count`` values of :func:`new_traceparent`, from one draw of random bytes: for
    a batch, a third of the CPU of one draw per job."""
    raw = random.randbytes(24 * count).hex()
    return [f"00-{raw[i : i + 32]}-{raw[i + 32 : i + 48]}-01" for i in range(0, 48 * count, 48)]
