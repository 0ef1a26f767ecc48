"""Settings derived from other settings."""

from __future__ import annotations

import pytest

from onceflow.settings import Settings


@pytest.mark.parametrize(
    ("concurrency", "explicit", "size"),
    [(64, None, 32), (1, None, 32), (512, None, 128), (2000, None, 500), (512, 8, 8)],
)
def test_a_claim_takes_a_quarter_of_the_slots_unless_told(concurrency, explicit, size):
    settings = Settings(engine_concurrency=concurrency, engine_claim_batch=explicit)
    assert settings.claim_batch_size == size
