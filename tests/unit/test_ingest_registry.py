"""What ingest checks a submission's type against, and when it imports workflow code."""

from __future__ import annotations

import pytest

from onceflow.settings import Settings
from producers.api import create_app, ingest_registry

ABSENT = "onceflow_no_such_workflow_module"


def test_an_ingest_that_checks_no_types_never_imports_the_workflow_modules():
    """Its image need not hold the workflow code: with type checks off, a module that
    cannot be imported is never imported (found in review: the registry step imported
    the workflow modules in every ingest)."""
    settings = Settings(ingest_validate_types=False, workflow_modules=[ABSENT], auth_disabled=True)
    assert ingest_registry(settings).workflow_names() == []
    create_app(settings)  # no ModuleNotFoundError


def test_an_ingest_that_checks_types_loads_the_workflow_modules():
    settings = Settings(ingest_validate_types=True, workflow_modules=[ABSENT], auth_disabled=True)
    with pytest.raises(ModuleNotFoundError):
        ingest_registry(settings)
    known = Settings(workflow_modules=["onceflow_examples"], auth_disabled=True)
    assert "order-workflow" in ingest_registry(known).workflow_names()
