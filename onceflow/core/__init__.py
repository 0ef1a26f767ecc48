"""The shared core of every onceflow process: settings, the job envelope, ids,
errors, logging, partitioning, the vocabulary, and the small Kafka admin helpers.

It imports none of the process packages (``producers``, ``streams``,
``workflow_engine``); the import-linter contract in ``pyproject.toml`` keeps it so.
"""
