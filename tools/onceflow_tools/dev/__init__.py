"""Local Kafka and PostgreSQL for development, the demo and the tests (no Docker)."""

from onceflow_tools.dev.services import DevServices, local_dev_services

__all__ = ["DevServices", "local_dev_services"]
