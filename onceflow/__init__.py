"""onceflow: bursts of submitted jobs into durable workflows, at most one per job id.

This package is the small shared core (settings, the job envelope, ids, logging,
errors) plus the ``onceflow`` CLI, the local dev services and the demo. The three
processes live in their own top-level packages: ``producers`` (HTTP ingest),
``streams`` (the Faust worker) and ``workflow_engine`` (schema, API, runner).
"""

from onceflow.core.envelope import JobEnvelope
from onceflow.core.errors import OnceflowError
from onceflow.core.ids import is_valid_job_id, new_job_id
from onceflow.core.settings import Settings, get_settings

__all__ = [
    "JobEnvelope",
    "OnceflowError",
    "Settings",
    "get_settings",
    "is_valid_job_id",
    "new_job_id",
]
