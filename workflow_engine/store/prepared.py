"""Server-side prepared statements for the hot statements.

psycopg2 sends every statement as text, so PostgreSQL parses and plans it on every
execution. The hot statements (the worker's creating statement; the claim's pick and
lease, step start, checkpoint, finish, heartbeat) are large (a dozen CTEs: the lease
guard, the attempt records, the lifecycle events), and planning one took 1.0-1.2 ms of
the server's CPU, more than running it for a batch: at ~1,300 checkpoint statements for
6,000 workflows, a fifth of the database's CPU per workflow (BENCHMARKS.md, "Planning,
every time"). Prepared once per connection with ``PREPARE`` and run with ``EXECUTE``, a
statement is planned at most for its first executions (PostgreSQL then keeps a generic
plan when it costs no more than the custom ones, and re-plans by itself when a table it
reads changes). The claim's pick is the exception: its custom plans know their
``LIMIT`` and always look cheaper, so it forces its generic plan
(``fragments.in_index_order``).

A prepared statement is a session's: it lives as long as the connection (it survives a
rolled-back transaction), and is remembered in the pooled connection's ``info``, which
SQLAlchemy drops with the connection when it is invalidated or replaced. A session
whose statements no longer fit (a migration changed a result column's type: 0A000
"cached plan must not change result type"; or its statements and ``info`` disagree:
42P05, 26000) is treated as a lost connection (``store.db``): the pool replaces that
connection (every connection, for a migration's 0A000) and the caller retries, instead
of failing every batch as the row's fault.
This needs a session, not a transaction-mode pooler in between (the engine's LISTEN and
the relay's advisory lock already do; docs/operations.md).

Statements are written as usual (``sa.text`` with ``:name`` parameters, each used inside
an explicit ``CAST`` so that ``PREPARE`` can type it); the ``EXECUTE`` casts each argument
to the type PostgreSQL gave its parameter, so an array of only NULLs still converts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import psycopg2 as pg_dialect
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.util.typing import TupleAny, Unpack

_BIND = re.compile(r"%\((\w+)\)s")
_INFO_KEY = "onceflow_prepared"
_AS_IS = {"no_parameters": True}
_TYPES = sa.text(
    "SELECT CAST(parameter_types AS text[]) FROM pg_prepared_statements WHERE name = :n"
)


@dataclass(frozen=True, slots=True)
class _Form:
    name: str
    text: str  # with $1 .. $n
    params: tuple[str, ...]  # the parameter names, in $n order


@cache
def _form(statement: sa.TextClause) -> _Form:
    compiled = str(statement.compile(dialect=pg_dialect.dialect()))
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = _BIND.sub(number, compiled).replace("%%", "%")
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    return _Form(f"onceflow_{digest}", text, tuple(names))


#: The EXECUTE statement of each prepared form, once its parameters' types are known
#: (the same on every connection of one schema). A ``sa.text`` statement, so that
#: SQLAlchemy's compiled cache keeps its result's column metadata: built from the
#: cursor's description on each call (``exec_driver_sql``), that was ~0.03 ms a workflow.
_EXECUTES: dict[str, sa.TextClause] = {}


def execute_prepared(
    conn: Connection, statement: sa.TextClause, params: Mapping[str, Any]
) -> CursorResult[Unpack[TupleAny]]:
    """Run ``statement`` with ``params`` as this connection's prepared statement
    (prepared on its first use on the connection)."""
    form = _form(statement)
    known: set[str] = conn.connection.info.setdefault(_INFO_KEY, set())
    if form.name not in known:
        # sent as it is: no parameters, so the driver leaves a literal % alone
        conn.exec_driver_sql(f"PREPARE {form.name} AS {form.text}", execution_options=_AS_IS)
        # Known at once: the session keeps a PREPARE whatever happens next (the types'
        # query failing, the transaction rolling back), and preparing it again on this
        # connection would fail (42P05) on every later use (found in review).
        known.add(form.name)
    if form.name not in _EXECUTES:
        types = conn.execute(_TYPES, {"n": form.name}).scalar_one()
        _EXECUTES[form.name] = _execute_of(form, types)
    return conn.execute(_EXECUTES[form.name], {name: params[name] for name in form.params})


def _execute_of(form: _Form, types: list[str]) -> sa.TextClause:
    args = ", ".join(
        f"CAST(:{name} AS {type_})" for name, type_ in zip(form.params, types, strict=True)
    )
    return sa.text(f"EXECUTE {form.name} ({args})" if args else f"EXECUTE {form.name}")
