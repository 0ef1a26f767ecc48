"""Which partition a job id lands on: Kafka's Java default partitioner (murmur2).

Ingest configures librdkafka with ``partitioner=murmur2_random`` so that this holds
whichever client wrote the record; knowing the partition lets ``GET /v1/jobs/{id}``
report the consumer lag in front of that job.
"""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (32-bit, seed 0x9747b28c), as a signed int like Java's."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(data)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = data[length - rest :]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(job_id: str, partitions: int) -> int:
    """The partition a record keyed by ``job_id`` goes to (Java's ``toPositive % n``)."""
    return (murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions
