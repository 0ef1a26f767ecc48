"""``python -m onceflow_cli``: the same as the ``onceflow`` command."""

from onceflow_cli.main import main

main()
