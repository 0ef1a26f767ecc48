"""onceflow.heap: what a service process does to the collector once it has loaded."""

from __future__ import annotations

import gc

import pytest

from onceflow.heap import INGEST_YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def restored_collector():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_settling_freezes_the_loaded_heap_and_keeps_the_thresholds(restored_collector):
    before = gc.get_threshold()
    kept = [object() for _ in range(10)]
    settle_heap()
    assert gc.get_freeze_count() > len(kept)
    assert gc.get_threshold() == before


def test_ingest_collects_the_young_generation_less_often(restored_collector):
    _, middle, old = gc.get_threshold()
    settle_heap(INGEST_YOUNG_THRESHOLD)
    assert gc.get_threshold() == (INGEST_YOUNG_THRESHOLD, middle, old)


def test_cycles_are_still_collected_after_settling(restored_collector):
    settle_heap(INGEST_YOUNG_THRESHOLD)
    collected: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collected.append(info["collected"])

    gc.callbacks.append(count)
    try:
        for _ in range(INGEST_YOUNG_THRESHOLD + 1000):  # enough allocations for a young pass
            cycle: list[object] = []
            cycle.append(cycle)
    finally:
        gc.callbacks.remove(count)
    assert collected and sum(collected) > 0
