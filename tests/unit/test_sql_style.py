"""One SQL style in the store (issue 24): a statement is a named module-level constant
(``_CLAIM = sa.text(...)``, with a comment where the why is not obvious), above the
function that runs it, never an ``sa.text(...)`` built inside a function body.

Only a few builders make SQL in a function, each because its text depends on its input
(:data:`BUILDERS`, with the reason). This test walks every module of the store with
``ast`` and fails on any other ``sa.text(`` in a function body, and on a string handed
to ``exec_driver_sql`` there (name it at module level too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workflow_engine.store

STORE = Path(workflow_engine.store.__file__).parent
ROOT = STORE.parents[1]

#: (module, function) allowed to build SQL text per call, and why it cannot be a
#: constant. Keep it small: a statement that does not vary is a module-level constant.
BUILDERS = {
    # the snapshot's WHERE clause is the bulk operation's filter (listing.where_clause)
    ("workflow_engine.store.operations.bulk", "_snapshot_items"): "a filter's WHERE clause",
    # the filter's WHERE clause, the sort column, the keyset, EXPLAIN on request
    ("workflow_engine.store.views.listing", "_list_sql"): "a filter's terms and sort",
    # the filter's WHERE clause, capped or not
    ("workflow_engine.store.views.listing", "_count_sql"): "a filter's WHERE clause",
    # only the conditions the filter sets enter the statement, so each uses its index
    ("workflow_engine.store.operator_audit", "_page_sql"): "a filter's set conditions",
    # the table (a constant of the module) and the key ranges outside its partitions
    ("workflow_engine.store.partitions", "_delete_orphans_sql"): "a table and its ranges",
    # a migration set's record table is named by its MigrationSet (code, never input)
    ("workflow_engine.store.schema", "_on_table"): "a migration set's own table",
    # PREPARE and EXECUTE of a module-level statement, named by its text's digest
    ("workflow_engine.store.prepared", "execute_prepared"): "a prepared statement's name",
    ("workflow_engine.store.prepared", "_execute_of"): "its parameters' types, once",
}


def _sqlalchemy_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names the module binds to the ``sqlalchemy`` package (``import sqlalchemy as
    sa``) and to its ``text`` function (``from sqlalchemy import text``)."""
    modules: set[str] = set()
    texts: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "sqlalchemy"}
        elif isinstance(node, ast.ImportFrom) and node.module == "sqlalchemy":
            texts |= {a.asname or a.name for a in node.names if a.name == "text"}
    return modules, texts


def _builds_sql(call: ast.Call, modules: set[str], texts: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in texts
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "text":
        return isinstance(func.value, ast.Name) and func.value.id in modules
    # a statement spelled in the call (a literal, an f-string, a concatenation), not a name
    return func.attr == "exec_driver_sql" and bool(call.args) and not _is_name(call.args[0])


def _is_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Name | ast.Attribute)


def inline_sql(source: str) -> list[tuple[str, int]]:
    """(function, line) of each statement ``source`` builds inside a function body
    (the innermost function that holds it)."""
    tree = ast.parse(source)
    modules, texts = _sqlalchemy_names(tree)
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            elif (
                isinstance(child, ast.Call)
                and function is not None
                and _builds_sql(child, modules, texts)
            ):
                found.append((function, child.lineno))
            visit(child, inner)

    visit(tree, None)
    return found


def _store_modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path
        for path in sorted(STORE.rglob("*.py"))
    }


def _store_inline_sql() -> dict[str, list[tuple[str, int]]]:
    return {module: inline_sql(path.read_text()) for module, path in _store_modules().items()}


def test_the_store_names_its_statements_at_module_level() -> None:
    offending = [
        f"{module}.{function} (line {line})"
        for module, found in _store_inline_sql().items()
        for function, line in found
        if (module, function) not in BUILDERS
    ]
    assert not offending, (
        "SQL built inside a function body; name it at module level"
        " (_NAME = sa.text(...) above the function), or, if its text really depends on"
        f" the input, make it a builder listed in BUILDERS with the reason: {offending}"
    )


def test_the_allow_list_names_only_builders_that_still_build_sql() -> None:
    found = _store_inline_sql()
    stale_builders = [
        key for key in BUILDERS if key[1] not in {function for function, _ in found[key[0]]}
    ]
    assert not stale_builders, f"BUILDERS entries that build no SQL: {stale_builders}"


SYNTHETIC = """
import sqlalchemy as sa
from sqlalchemy import text as raw

_NAMED = sa.text("SELECT 1")
_DRIVER = "SET LOCAL jit = off"


def named(conn):
    conn.execute(_NAMED)
    conn.exec_driver_sql(_DRIVER)


def inline(conn):
    conn.execute(sa.text("SELECT 2"))


class Store:
    def method(self, conn, where):
        def nested():
            return raw(f"SELECT 3 WHERE {where}")

        conn.exec_driver_sql("SET LOCAL enable_sort = off")
        return nested()
"""


def test_inline_statements_are_found_and_named_ones_are_not() -> None:
    assert inline_sql(SYNTHETIC) == [("inline", 15), ("nested", 21), ("method", 23)]


@pytest.mark.parametrize(
    "source",
    [
        "import sqlalchemy\ndef f(c):\n    c.execute(sqlalchemy.text('SELECT 1'))\n",
        "import sqlalchemy as sa\nasync def f(c):\n    await c.execute(sa.text('SELECT 1'))\n",
        "def f(c):\n    c.exec_driver_sql('SELECT ' + '1')\n",
    ],
)
def test_each_spelling_of_an_inline_statement_is_found(source: str) -> None:
    assert [function for function, _ in inline_sql(source)] == ["f"]
