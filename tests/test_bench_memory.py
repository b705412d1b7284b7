"""Peak memory: every ``fedrl bench`` target reports its peak RSS; ``fedrl bench memory`` measures
rollouts at growing envs × steps in fresh processes."""

import json

import pytest

from fedrl_algos.bench.memory import PATHS, memory_scaling, rollout_memory
from fedrl_algos.cli import main
from fedrl_algos.cli.args import PeakRSS, finish_bench, peak_rss, with_peak_rss


@pytest.mark.parametrize("path", PATHS)
def test_rollout_memory_of_a_tiny_rollout(path):
    r = rollout_memory(path, n_agents=2, n_envs=4, n_steps=5)
    assert (r.path, r.n_agents, r.n_envs, r.n_steps, r.env_steps) == (path, 2, 4, 5, 40)
    assert r.baseline_bytes > 0 and r.peak_bytes >= r.baseline_bytes  # ru_maxrss never goes down
    assert r.growth_bytes == r.peak_bytes - r.baseline_bytes and r.bytes_per_env_step >= 0
    # What the rollout returned: at least an observation and an action per env-step.
    assert r.held_bytes_per_env_step >= 4 * 4 + 1


def test_memory_scaling_runs_each_size_in_its_own_process(tmp_path, capsys):
    path = tmp_path / "memory.json"
    argv = ["bench", "memory", "--sizes", "4x3", "8x6", "--paths", "vecenv", "--agents", "2", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "bytes/env-step" in out and "over that at" in out and "peak RSS (ru_maxrss): this process" in out
    records = json.loads(path.read_text())
    assert [(r["n_envs"], r["n_steps"]) for r in records] == [(4, 3), (8, 6)]
    for r in records:
        assert r["env_steps"] == 2 * r["n_envs"] * r["n_steps"] and r["path"] == "vecenv"
        # A fresh interpreter with torch imported: its baseline is that of a whole process.
        assert r["baseline_bytes"] > 2**20 and r["peak_bytes"] >= r["baseline_bytes"]
        assert r["growth_bytes"] == r["peak_bytes"] - r["baseline_bytes"]
        assert r["bytes_per_env_step"] == pytest.approx(r["growth_bytes"] / r["env_steps"])
        assert r["peak_rss_mb"] > 0
        # The children were waited for: the largest one's peak is at least its baseline.
        assert r["children_peak_rss_mb"] * 2**20 >= r["baseline_bytes"]


@pytest.mark.parametrize(
    "kwargs, match",
    [({"paths": ("gpu",)}, "paths"), ({"sizes": ()}, "sizes"), ({"sizes": ((4, 0),)}, "sizes"), ({"sizes": ((4,),)}, "sizes")],
)
def test_memory_scaling_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory_scaling(show=False, **kwargs)


@pytest.mark.parametrize("kwargs, match", [({"path": "gpu"}, "path"), ({"n_steps": 1}, "n_steps"), ({"n_envs": 0}, "n_envs")])
def test_rollout_memory_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rollout_memory(**kwargs)


def test_peak_rss_fields_are_added_to_every_record(tmp_path, capsys):
    peak = PeakRSS(3 * 2**20, 0)
    assert with_peak_rss([{"a": 1}, {"a": 2}], peak) == [
        {"a": 1, "peak_rss_mb": 3.0, "children_peak_rss_mb": 0.0},
        {"a": 2, "peak_rss_mb": 3.0, "children_peak_rss_mb": 0.0},
    ]
    with pytest.raises(TypeError, match="records"):
        with_peak_rss([1], peak)
    path = tmp_path / "out.json"
    got = finish_bench(str(path), {"steps": [{"a": 1}], "ppo": None}, groups=True)
    assert got.self_bytes >= peak_rss().self_bytes - 2**20 and got.self_bytes > 0
    data = json.loads(path.read_text())
    assert data["ppo"] is None and data["steps"][0]["peak_rss_mb"] == pytest.approx(got.self_bytes / 2**20)
    assert "peak RSS (ru_maxrss): this process" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["envs", "--quick", "--sizes", "8"],
        ["algos", "--quick"],
        ["training", "--quick", "--configs", "per_fedavg_pg-arc"],
    ],
    ids=lambda argv: argv[0],
)
def test_bench_targets_print_and_record_their_peak_rss(argv, tmp_path, capsys):
    path = tmp_path / "out.json"
    assert main(["bench", *argv, "--threads", "1", "--json", str(path)]) == 0
    assert "peak RSS (ru_maxrss): this process" in capsys.readouterr().out
    records = json.loads(path.read_text())
    assert isinstance(records, list) and records
    for r in records:
        assert r["peak_rss_mb"] > 0 and r["children_peak_rss_mb"] >= 0
