"""The randomized interleaving search, short and derandomized for CI (the long one is
``onceflow chaos --interleavings``): sequences of submits, events, operator actions,
runs held at failpoints, lease expiries with rescues, engine kills and restarts and a
second engine, on the real engine and PostgreSQL, the history checked after every step
and in full once everything has finished (onceflow_tools.interleavings.machine)."""

from __future__ import annotations

import pytest

from onceflow import failpoints
from onceflow_tools.interleavings.machine import Databases, Sandbox, search

#: 20 sequences of up to 20 rules: under a minute on a 2-core box.
EXAMPLES = 20
STEPS = 20


@pytest.fixture
def sandbox(base_settings, template_db):
    databases = Databases(base_settings.database_url, template_db)
    yield Sandbox(base_settings, databases)
    failpoints.disarm_all()
    databases.close()


@pytest.mark.timeout(240)
def test_random_interleavings_keep_the_history(sandbox):
    search(sandbox, EXAMPLES, STEPS)
