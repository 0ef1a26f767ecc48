"""docs/events.md gives a JSON Schema for every lifecycle event type the store writes,
and each one is a valid schema (the integration tests validate produced events)."""

from __future__ import annotations

import jsonschema

from onceflow.vocabulary import LifecycleEvent
from tests.integration.events_helpers import event_schemas


def test_every_written_kind_has_a_valid_schema():
    schemas = event_schemas()
    written = {kind.ce_type for kind in LifecycleEvent if kind is not LifecycleEvent.HELD}
    assert written <= set(schemas), sorted(written - set(schemas))
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
