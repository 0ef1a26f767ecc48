"""One base exception for the whole project; the CLI turns any of these into one line."""

from __future__ import annotations

from onceflow.vocabulary import DeadLetterReason


class OnceflowError(Exception):
    """Base class of every error onceflow raises on purpose."""


class ConfigurationError(OnceflowError):
    """A setting is missing or invalid."""


class ServiceUnavailable(OnceflowError):
    """A service onceflow depends on (Kafka, PostgreSQL) cannot be reached."""


class InvalidEnvelope(OnceflowError):
    """A Kafka record is not a valid job envelope.

    ``reason`` is the code (what the dead-letter header, the database row and the
    metric label carry); the message (``detail``) is the human text.
    """

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
