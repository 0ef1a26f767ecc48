"""The ``onceflow`` command line: the top layer of the runtime.

It drives the processes (ingest, worker, engine), the store (migrations, control,
trace, audit) and, when the ``onceflow-tools`` distribution is installed, the
commands it registers (``dev``, ``demo``, ``bench``, ``chaos``, ``dashboard``).
"""

from onceflow_cli.main import cli, main

__all__ = ["cli", "main"]
