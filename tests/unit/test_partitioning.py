import pytest

from onceflow.partitioning import murmur2, partition_for

# Vectors from Apache Kafka's own UtilsTest.testMurmur2.
JAVA_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "expected"), JAVA_MURMUR2)
def test_matches_kafkas_java_murmur2(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), JAVA_MURMUR2)
@pytest.mark.parametrize("partitions", [1, 3, 4, 7, 100])
def test_partition_is_javas_to_positive_modulo(data, expected, partitions):
    # Java's DefaultPartitioner: Utils.toPositive(murmur2(key)) % numPartitions, computed
    # here from Kafka's own hash values, not from our murmur2.
    assert partition_for(data.decode(), partitions) == (expected & 0x7FFFFFFF) % partitions


def test_partitions_cover_the_range():
    assert {partition_for(f"job_{i}", 7) for i in range(500)} == set(range(7))
