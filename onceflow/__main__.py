"""``python -m onceflow``: the same as the ``onceflow`` command."""

from onceflow.cli import main

main()
