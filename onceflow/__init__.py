"""onceflow: bursts of submitted jobs into durable workflows, at most one per job id.

This package is the shared core of every process, the lowest layer: settings, the job
envelope, ids, errors, JSON logs, murmur2 partitioning, the vocabulary (statuses,
reasons, process names), the health/metrics server and the small Kafka admin helpers.
It imports none of the other packages; the import-linter contract in
``pyproject.toml`` keeps it so. Above it: ``workflow_engine.store`` (PostgreSQL), the
definitions, the processes (``producers`` = ingest, ``streams`` = worker,
``workflow_engine.engine`` = engine), then the CLI (``onceflow_cli``) and the tools.
"""

from onceflow.envelope import JobEnvelope
from onceflow.errors import OnceflowError
from onceflow.ids import is_valid_job_id, new_job_id
from onceflow.settings import Settings, get_settings

__all__ = [
    "JobEnvelope",
    "OnceflowError",
    "Settings",
    "get_settings",
    "is_valid_job_id",
    "new_job_id",
]
