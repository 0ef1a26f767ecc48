"""The version of a workflow definition: what an instance records when it is created.

An explicit ``@workflow("order-workflow", version="2026-11-30")`` is the version.
Without one, the version is a fingerprint of the workflow function, ``fp-`` and 16 hex
digits of a sha256 over:

* the function's qualified name, and
* its source text (``inspect.getsource``) from ``def`` to the end — decorators left
  out, so changing ``concurrency=`` does not change it — tokenised with comments and
  blank lines dropped, and whitespace and line breaks inside brackets normalised.

So reformatting or re-commenting the workflow function keeps its version; changing its
code (a step added, renamed or moved, a branch changed) makes a new one. What it does
NOT cover: the bodies of the step functions it calls, helpers and constants elsewhere
in the module. Changing those does not change the fingerprint, and in-flight instances
keep running through the new code — usually what you want for a bug fix in a step. The
fingerprint is computed from source text, not bytecode, so it is the same on every
machine, process and Python version that has the same file. For changes whose effect
on in-flight instances you want to decide yourself, name versions explicitly or use
``ctx.patched()`` (see README, "Deploying new workflow code").
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import textwrap
import tokenize
from collections.abc import Callable
from typing import Any

MAX_VERSION_LENGTH = 100
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


def check_version(version: str) -> str:
    if not version or len(version) > MAX_VERSION_LENGTH or not version.isprintable():
        raise ValueError(
            f"a workflow version is 1 to {MAX_VERSION_LENGTH} printable characters, not {version!r}"
        )
    return version


def normalised_source(fn: Callable[..., Any]) -> str:
    """The function's code as tokens: no decorators, comments, blank lines or layout."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise ValueError(
            f"cannot read the source of {getattr(fn, '__qualname__', fn)!r} to fingerprint"
            f" it ({exc}): give the workflow an explicit version=..."
        ) from None
    tree = ast.parse(source)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise ValueError(f"{fn!r} is not defined by a def statement: give it a version=...")
    # ``lineno`` is the line of ``def`` (decorators are above it).
    body = "\n".join(source.splitlines()[node.lineno - 1 :]) + "\n"
    tokens = tokenize.generate_tokens(io.StringIO(body).readline)
    return " ".join(
        tokenize.tok_name[tok.type] if tok.type in _LAYOUT else tok.string
        for tok in tokens
        if tok.type not in _SKIPPED
    )


_LAYOUT = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def fingerprint(fn: Callable[..., Any]) -> str:
    """``fp-`` + 16 hex digits of sha256(qualified name, normalised source)."""
    text = f"{fn.__qualname__}\n{normalised_source(fn)}"
    return "fp-" + hashlib.sha256(text.encode()).hexdigest()[:16]
