"""``python -m onceflow.cli``: the same as the ``onceflow`` command."""

from onceflow.cli.main import main

main()
