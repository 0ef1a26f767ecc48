import pytest

from onceflow.core.partitioning import murmur2, partition_for


# Vectors from Apache Kafka's own UtilsTest.testMurmur2.
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_matches_kafkas_java_murmur2(data, expected):
    assert murmur2(data) == expected


def test_partition_is_in_range_and_stable():
    parts = {partition_for(f"job_{i}", 7) for i in range(500)}
    assert parts == set(range(7))
    assert partition_for("order_1001", 4) == partition_for("order_1001", 4)
