import ctypes

import pytest

from es_agents.partitioner import murmur2, partition_for


# Vectors from Kafka's UtilsTest.testMurmur2 (signed Java ints).
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ],
)
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert ctypes.c_int32(murmur2(key.encode())).value == expected


def test_partition_is_in_range_and_stable() -> None:
    parts = {partition_for(f"run-{i}", 6) for i in range(200)}
    assert parts == set(range(6))
    assert partition_for("run-1", 6) == partition_for("run-1", 6)
