"""``fedrl bench kernels``: the arc policy's compiled kernels timed against its torch kernels."""

import json

import pytest

pytest.importorskip("numba")

from fedrl_algos.bench.kernels import OPERATIONS, TABULAR_OPERATION, TABULAR_TABLE_OPERATION, bench_kernels  # noqa: E402
from fedrl_algos.cli import main  # noqa: E402


def test_every_operation_is_timed_for_both_kernels_at_every_batch():
    records = bench_kernels(trajectories=(3, 7), rows=4, repeats=1, show=False, tabular_trajectories=(2, 5), tabular_runs=3)
    expected = [(op, m) for m in (3, 7) for op in OPERATIONS] + [(TABULAR_OPERATION, m) for m in (2, 5)] + [(TABULAR_TABLE_OPERATION, 0)]
    assert [(r.operation, r.trajectories) for r in records] == expected
    for r in records:
        assert r.rows == (4 if r.operation in OPERATIONS else 24) and r.repeats == 1
        assert r.torch_seconds > 0 and r.numba_seconds > 0
        assert r.speedup == pytest.approx(r.torch_seconds / r.numba_seconds)
        assert 0.0 <= r.rewarded_fraction <= 1.0


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    path = tmp_path / "kernels.json"
    assert main(["bench", "kernels", "--trajectories", "4", "--rows", "2", "--repeats", "1", "--tabular-trajectories", "3",
                 "--tabular-runs", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "torch/numba" in out and "curvature (causal)" in out and "tabular rollout" in out and "peak RSS" in out
    assert "tabular probability table" in out and "8 rows" in out
    records = json.loads(path.read_text())
    assert [r["operation"] for r in records] == [*OPERATIONS, TABULAR_OPERATION, TABULAR_TABLE_OPERATION]
    assert all(r["speedup"] > 0 and r["peak_rss_mb"] > 0 for r in records)
