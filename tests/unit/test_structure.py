"""The product code keeps its shape: no import circle among its modules, and no
function longer than a screen (``structure.py`` beside this file has both checks).
Each is a check that can fail: shown on a copy of the tree with a circle in it, and on
a file with a function one line too long."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.structure import (
    MAX_FUNCTION_LINES,
    PRODUCT,
    import_circles,
    long_functions,
)
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


def test_no_product_function_over_the_limit():
    found = long_functions([REPO / package for package in PRODUCT], relative_to=REPO)
    assert not found, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(map(str, found))


def test_the_length_check_can_fail(tmp_path):
    def function(name: str, lines: int, indent: str = "") -> str:
        body = "".join(f"{indent}    x{n} = {n}\n" for n in range(lines - 2))
        return f"{indent}def {name}():\n{body}{indent}    return None\n"

    source = (
        function("fits", MAX_FUNCTION_LINES)
        + function("too_long", MAX_FUNCTION_LINES + 1)
        + "class Thing:\n"
        + "    @property\n"  # decorators do not count
        + function("method", MAX_FUNCTION_LINES, "    ")
        + "    async def outer(self):\n"
        + textwrap.indent(function("inner", MAX_FUNCTION_LINES + 1), "        ")
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "module.py").write_text(source)

    found = long_functions([tmp_path], relative_to=tmp_path)
    assert [(f.name, f.lines, str(f.path)) for f in found] == [
        ("too_long", MAX_FUNCTION_LINES + 1, "pkg/module.py"),
        ("Thing.outer", MAX_FUNCTION_LINES + 2, "pkg/module.py"),  # its def and inner
        ("Thing.outer.inner", MAX_FUNCTION_LINES + 1, "pkg/module.py"),
    ]
