"""Two checks on the shape of the product code, used by ``test_structure.py``.

* :func:`import_circles`: the strongly connected components of more than one module of
  an import graph (Tarjan's algorithm). A circle means neither module can be read,
  tested or moved without the other; the layer contract (``[tool.importlinter]``) only
  orders the packages, so a circle inside one layer would pass it.
* :func:`long_functions`: the functions longer than a screen, counted from the ``def``
  line to the last line inclusive (``end_lineno - lineno + 1``, decorators left out).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grimp

#: The runtime's packages (tools and the sample workflows are not the product).
PRODUCT = ("onceflow", "onceflow_cli", "producers", "streams", "console", "workflow_engine")
#: The longest a product function may be.
MAX_FUNCTION_LINES = 60


def import_graph(packages: Iterable[str] = PRODUCT) -> dict[str, set[str]]:
    """Each module of ``packages`` and the modules of ``packages`` it imports, directly,
    anywhere in the file (function-local imports too; ``if TYPE_CHECKING:`` imports
    left out: they never run)."""
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)
    return {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}


def import_circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold more than one module,
    each sorted, in sorted order (a module importing itself is no circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        # Iterative depth-first search: (module, its successors not yet visited).
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for successor in successors:
                if successor not in graph:
                    continue  # outside the graph's packages
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(graph[successor])))
                    break
                if successor in on_stack:
                    low[module] = min(low[module], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return sorted(circles)


@dataclass(frozen=True, slots=True)
class LongFunction:
    path: Path
    line: int
    name: str  # qualified: Class.method, outer.inner
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.lines} lines)"


def long_functions(
    roots: Iterable[Path], limit: int = MAX_FUNCTION_LINES, relative_to: Path | None = None
) -> list[LongFunction]:
    """The functions and methods (nested ones too) of the ``.py`` files under ``roots``
    that are longer than ``limit`` lines."""
    found: list[LongFunction] = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            shown = path.relative_to(relative_to) if relative_to else path
            found += _long_in(ast.parse(path.read_text(), str(path)), shown, limit)
    return found


def _long_in(tree: ast.AST, path: Path, limit: int, prefix: str = "") -> list[LongFunction]:
    found: list[LongFunction] = []
    for node in ast.iter_child_nodes(tree):
        name = prefix
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}."
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(LongFunction(path, node.lineno, name[:-1], lines))
        found += _long_in(node, path, limit, name)
    return found


if __name__ == "__main__":
    # Run as a script (by the tests, on a tree of their choosing through PYTHONPATH):
    # one line per circle, and a non-zero exit status if there is one.
    import sys

    found = import_circles(import_graph())
    for circle in found:
        print(" ".join(circle))
    sys.exit(1 if found else 0)
