"""``fedrl bench flower``: the same θ both ways, and the bytes per round it reports add up."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from fedrl_algos.bench_flower import bench_flower  # noqa: E402


def test_bench_flower_reports_same_theta_and_the_payload_bytes():
    (record,) = bench_flower(agents=(2,), rounds=1)
    assert record["bitwise_equal"]
    d, n = record["d"], record["agents"]
    header = 128  # the .npy header of every Array
    per_agent = 2 * (4 * d + header) + 2 * (8 + header)  # θ down and back (float32), one stream position each way
    assert record["bytes_per_round"] == n * per_agent
    assert record["paper_bytes_per_round"] == 2 * d * n * 4
    assert record["in_process_rounds_per_s"] > 0 and record["flower_rounds_per_s"] > 0
