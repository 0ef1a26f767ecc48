"""Test launcher: the ``onceflow`` command with failpoints armed in its process.

    python -m onceflow_tools.failpoint_main \\
        --failpoints 'name=action[@job_id][*times],...' -- <onceflow arguments>

For subprocess tests and the chaos run, whose failpoint acts on the whole process
(``kill``: SIGKILL there; ``stop``: SIGSTOP there, for a zombie that wakes up after its
lease expired). The product has no setting that arms a failpoint; only this launcher,
which the tests and the tools start instead of ``onceflow``, arms them
(``onceflow.failpoints.arm_from_spec``) before it runs the CLI's own entry point
(``onceflow_cli:main``, the console script) in this same process.
``ONCEFLOW_TEST_FAILPOINTS`` gives the spec when the flag is absent.

``--executions PATH`` (or ``ONCEFLOW_TEST_EXECUTIONS``) makes the interleaving
workflows' step code append each execution to PATH, so a test can check the
executions of a process it killed (``onceflow_tools.interleavings.Executions``).
"""

from __future__ import annotations

import argparse
import os
import sys

from onceflow import failpoints


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    ours, cli_args = (
        (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    )
    parser = argparse.ArgumentParser(prog="python -m onceflow_tools.failpoint_main")
    parser.add_argument("--failpoints", default=os.environ.get("ONCEFLOW_TEST_FAILPOINTS", ""))
    parser.add_argument("--executions", default=os.environ.get("ONCEFLOW_TEST_EXECUTIONS", ""))
    options = parser.parse_args(ours)
    if options.executions:
        os.environ["ONCEFLOW_TEST_EXECUTIONS"] = options.executions
    failpoints.arm_from_spec(options.failpoints)

    from onceflow_cli import main as onceflow

    sys.argv = ["onceflow", *cli_args]
    onceflow()


if __name__ == "__main__":
    main()
