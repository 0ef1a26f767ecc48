"""No import circle among the product's modules (``structure.py`` beside this file
has the check), and it is a check that can fail: shown on a copy of the tree with a
circle in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.structure import import_circles
from tests.unit.test_layers import PACKAGES, REPO, copy_tree, resolved_packages

STRUCTURE = Path(__file__).with_name("structure.py")

pytestmark = pytest.mark.timeout(60)


def _circles_in(tree: Path) -> subprocess.CompletedProcess[str]:
    """The import circles of the product packages found through ``PYTHONPATH=tree``, in
    a fresh process (this one has imported the checkout's packages already)."""
    return subprocess.run(
        [sys.executable, str(STRUCTURE)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
        timeout=50,
    )


def test_no_import_circle_among_product_modules():
    result = _circles_in(REPO)
    assert result.returncode == 0, "import circles:\n" + result.stdout + result.stderr
    assert result.stdout == ""


def test_a_module_importing_its_importer_makes_a_circle(tmp_path):
    copy_tree(tmp_path)
    assert resolved_packages(tmp_path) == [str(tmp_path / name) for name in PACKAGES]
    # main imports operator_log (for its command); a function-local import back counts.
    with open(tmp_path / "onceflow_cli" / "operator_log.py", "a") as module:
        module.write("\n\ndef _back():\n    from onceflow_cli.main import cli  # noqa\n")

    result = _circles_in(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["onceflow_cli.main onceflow_cli.operator_log"]


def test_type_checking_imports_make_no_circle(tmp_path):
    copy_tree(tmp_path)
    with open(tmp_path / "onceflow_cli" / "operator_log.py", "a") as module:
        module.write("\nif TYPE_CHECKING:\n    from onceflow_cli.main import cli  # noqa\n")

    result = _circles_in(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_circles_of_a_small_graph():
    graph = {
        "a": ["b"],
        "b": ["c"],
        "c": ["a", "d"],  # a -> b -> c -> a
        "d": ["e", "d"],  # a module importing itself is no circle
        "e": ["f", "outside"],  # a module outside the graph is left out
        "f": ["e", "g"],  # e <-> f
        "g": [],
        "h": ["a", "g"],  # imports a circle, is not in it
        "i": ["j", "k"],
        "j": ["k"],
        "k": ["i", "j"],  # two loops through k: one component
    }
    assert import_circles(graph) == [["a", "b", "c"], ["e", "f"], ["i", "j", "k"]]
    assert import_circles({"x": ["y"], "y": ["z"], "z": []}) == []
