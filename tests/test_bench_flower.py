"""``fedrl bench flower``: the same θ both ways, and the bytes per round it reports add up."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from fedrl_algos.bench.flower import bench_flower  # noqa: E402


def test_bench_flower_reports_same_theta_and_the_payload_bytes():
    (record,) = bench_flower(agents=(2,), rounds=1)
    assert record["bitwise_equal"]
    d, n = record["d"], record["agents"]
    header = 128  # the .npy header of every Array
    per_agent = 2 * (4 * d + header) + 2 * (8 + header)  # θ down and back (float32), one stream position each way
    assert record["bytes_per_round"] == n * per_agent
    assert record["paper_bytes_per_round"] == 2 * d * n * 4
    assert record["in_process_rounds_per_s"] > 0 and record["flower_rounds_per_s"] > 0


@pytest.mark.slow
def test_cli_bench_flower_records_its_peak_rss(tmp_path, capsys):
    import json

    from fedrl_algos.cli import main

    path = tmp_path / "flower.json"
    assert main(["bench", "flower", "--agents", "2", "--rounds", "1", "--json", str(path)]) == 0
    assert "peak RSS (ru_maxrss): this process" in capsys.readouterr().out
    (record,) = json.loads(path.read_text())
    assert record["peak_rss_mb"] > 0 and record["children_peak_rss_mb"] >= 0
