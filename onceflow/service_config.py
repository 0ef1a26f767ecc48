"""What every long-running service's config shares: validation on construction.

Each service (the engine's lease keeper, rescuer, maintenance, scheduler, presence and
group-commit writer; the worker's lag monitor) takes a small frozen dataclass defined
next to it, built from :class:`~onceflow.settings.Settings` in one function per process
(``workflow_engine.engine.configs.engine_configs``, ``streams.worker.lag_monitor_config``);
the services never see ``Settings``. A config refuses bad values in ``__post_init__``,
so one that exists is valid (River's ``JobRescuerConfig.mustValidate()``,
``internal/maintenance/job_rescuer.go``): a test or a tool that builds one by hand gets
the same checks as the process.
"""

from __future__ import annotations

from onceflow.errors import ConfigurationError


def require_positive(config: object, *fields: str) -> None:
    """Refuse ``config`` if one of its named fields is not above zero (NaN included)."""
    for name in fields:
        value = getattr(config, name)
        if not value > 0:
            raise ConfigurationError(
                f"{type(config).__name__}.{name} must be above zero, not {value!r}"
            )
