"""Local Kafka and PostgreSQL for development, the demo and the tests (no Docker)."""

from onceflow.dev.services import DevServices

__all__ = ["DevServices"]
