"""``fedrl bench algos``: a smoke run; batched and looped sides must compute the same numbers."""

from fedrl_algos.bench.algos import bench_algos
from fedrl_algos.cli import main


def test_batched_and_looped_rounds_agree():
    results = bench_algos(quick=True)
    assert len(results) == 2
    for r in results:
        assert r.max_abs_diff == 0.0
        assert r.batched_s > 0 and r.looped_s > 0


def test_cli_bench_algos_quick(capsys):
    assert main(["bench", "algos", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "speed-up" in out and "tabular" in out and "neural" in out
