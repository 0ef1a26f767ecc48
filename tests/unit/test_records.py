from onceflow.core.envelope import HEADER_DLQ_REASON, HEADER_DLQ_SOURCE, JobEnvelope
from streams.batch import _parse_failpoint
from streams.records import RawRecord, classify, split_by_partition


def _rec(partition, offset, env=None, value=None):
    if env is not None:
        return RawRecord("t", partition, offset, env.key(), env.encode(), env.headers())
    return RawRecord("t", partition, offset, b"k", value, [])


def test_classify_keeps_order_and_dead_letters_with_reason():
    a = JobEnvelope("a", "w", {})
    b = JobEnvelope("b", "w", {})
    records = [
        _rec(0, 1, a),
        _rec(0, 2, value=b"garbage"),
        _rec(1, 1, b),
        _rec(0, 3, a),
        _rec(1, 2, value=b"x" * 500),
    ]
    deliveries, dead = classify(records, max_value_bytes=400)
    assert [(d.envelope.job_id, d.offset) for d in deliveries] == [("a", 1), ("b", 1), ("a", 3)]
    assert [letter.record.offset for letter in dead] == [2, 2]
    assert "not JSON" in dead[0].reason
    assert "limit 400" in dead[1].reason
    headers = dict(dead[0].headers())
    assert headers[HEADER_DLQ_SOURCE] == b"t/0@2"
    assert b"not JSON" in headers[HEADER_DLQ_REASON]


def test_split_keeps_partitions_whole_and_bounded():
    records = [_rec(p, o, JobEnvelope(f"j{p}{o}", "w", {})) for p in range(5) for o in range(3)]
    deliveries, _ = classify(records, 10_000)
    chunks = split_by_partition(deliveries, groups=2)
    assert len(chunks) == 2
    for chunk in chunks:
        parts = {d.partition for d in chunk}
        for p in parts:
            offsets = [d.offset for d in chunk if d.partition == p]
            assert offsets == [0, 1, 2]  # whole partition, in order
    assert sum(len(c) for c in chunks) == 15
    assert sorted(p for c in chunks for p in {d.partition for d in c}) == [0, 1, 2, 3, 4]


def test_split_with_more_groups_than_partitions():
    records = [_rec(0, o, JobEnvelope(f"j{o}", "w", {})) for o in range(4)]
    deliveries, _ = classify(records, 10_000)
    assert len(split_by_partition(deliveries, groups=8)) == 1
    assert split_by_partition([], groups=4) == []


def test_failpoint_parsing():
    assert _parse_failpoint("streams.after_db_commit:3", "streams.after_db_commit") == 3
    assert _parse_failpoint("other:1, streams.after_db_commit", "streams.after_db_commit") == 1
    assert _parse_failpoint("", "streams.after_db_commit") is None
