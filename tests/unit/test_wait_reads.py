"""Start and wait's batched status reads: one statement answers one outcome per job id,
so a read that names an id's record (a resubmission that may start a new run) is not
batched with one that reads the same id without it, or with another record of it."""

from __future__ import annotations

import asyncio

from producers.waiters import _split
from workflow_engine.store.views import Record

A = Record("jobs", 0, 10)
B = Record("jobs", 0, 11)


def _read(ids, records=None):
    loop = asyncio.new_event_loop()
    try:
        return (list(ids), records or {}, loop.create_future())
    finally:
        loop.close()


def test_reads_of_other_ids_or_the_same_record_go_together():
    plain, other, mine, same = (
        _read(["x"]),
        _read(["y"]),
        _read(["j"], {"j": A}),
        _read(["j", "y"], {"j": A}),
    )
    kept, records, apart = _split([plain, other, mine, same])
    assert kept == [plain, other, mine, same]
    assert records == {"j": A} and apart == []


def test_an_id_read_with_and_without_its_record_is_read_apart():
    first, bare, second = _read(["j"], {"j": A}), _read(["j"]), _read(["j"], {"j": B})
    kept, records, apart = _split([first, bare, second])
    assert kept == [first] and records == {"j": A}
    assert apart == [bare, second]
    # and the next statement takes the first of what was left
    kept, records, apart = _split(apart)
    assert kept == [bare] and records == {} and apart == [second]
