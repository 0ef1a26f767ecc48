"""The layer contract (``[tool.importlinter]`` in pyproject.toml) holds on the tree,
and is a check that can fail: a copy of the tree where the core imports the engine is
rejected."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# Where each root package of the contract lives in the checkout.
PACKAGES = {
    "onceflow": REPO / "onceflow",
    "onceflow_cli": REPO / "onceflow_cli",
    "producers": REPO / "producers",
    "streams": REPO / "streams",
    "workflow_engine": REPO / "workflow_engine",
    "console": REPO / "console",
    "onceflow_tools": REPO / "tools" / "onceflow_tools",
    "onceflow_examples": REPO / "examples" / "onceflow_examples",
}

pytestmark = pytest.mark.timeout(60)


def _lint_imports(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=50,
    )


def copy_tree(dest: Path) -> None:
    """The root packages of the contract, and pyproject.toml, copied under ``dest``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name, source in PACKAGES.items():
        shutil.copytree(source, dest / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")


def resolved_packages(tree: Path) -> list[str]:
    """Where each root package is found by a Python whose PYTHONPATH is ``tree``."""
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys\n"
            "for name in sys.argv[1:]:\n"
            "    print(*importlib.util.find_spec(name).submodule_search_locations)",
            *PACKAGES,
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return where.stdout.split()


def test_the_tree_keeps_its_layers():
    result = _lint_imports(REPO, REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def lint_a_copy_with(tmp_path: Path, module: str, line: str) -> str:
    """lint-imports' output on a copy of the tree where ``module`` (a path under a root
    package) gains ``line``; asserts that the check ran on the copy and failed."""
    copy_tree(tmp_path)
    with open(tmp_path / module, "a") as source:
        source.write(f"\n{line}  # noqa\n")

    # The packages must resolve to the copies only (PYTHONPATH comes before the editable
    # installs' finders), or the check below would run on the untouched checkout.
    assert resolved_packages(tmp_path) == [str(tmp_path / name) for name in PACKAGES]

    result = _lint_imports(tmp_path, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    return output


def test_the_core_importing_the_engine_breaks_the_contract(tmp_path):
    output = lint_a_copy_with(tmp_path, "onceflow/ids.py", "import workflow_engine.engine.runner")
    assert "BROKEN" in output
    assert "onceflow.ids -> workflow_engine.engine.runner" in output, output


def test_a_front_end_reaching_past_the_stores_faces_breaks_the_contract(tmp_path):
    """Outside the store only its faces (``store``, ``store.writes``, ``store.operations``,
    ``store.views``) may be imported: the console importing the claim module itself is
    refused, though the layers allow it (the console is above the store)."""
    claim = "import workflow_engine.store.writes.claim"
    output = lint_a_copy_with(tmp_path, "console/display.py", claim)
    assert "Outside the store, only its faces" in output and "BROKEN" in output, output
    assert "console.display -> workflow_engine.store.writes.claim" in output, output
