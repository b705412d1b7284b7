"""``fedrl bench vector``: runs, reports missing baselines instead of failing, rejects bad arguments."""

import json
import subprocess
import sys

import pytest

from fedrl_algos.bench.vector import bench_vector


def test_records_hold_fedrl_and_gymnasium_rates_and_their_ratio():
    records = bench_vector(sizes=(20,), baselines=("gymnasium",), min_time=0.01, show=False)
    assert [(r.env_id, r.n_envs) for r in records] == [("fedrl/CartPole-v0", 20), ("fedrl/Pendulum-v0", 20)]
    for r in records:
        rate = r.baseline_steps_per_s["gymnasium"]
        assert r.fedrl_steps_per_s > 0 and rate > 0
        assert r.ratio("gymnasium") == pytest.approx(r.fedrl_steps_per_s / rate)
    assert records[0].notes["gymnasium"] == "CartPoleVectorEnv x 20"  # Gymnasium's own NumPy vector env
    assert records[1].notes["gymnasium"] == "SyncVectorEnv x 20"  # none ships for Pendulum


def test_a_missing_baseline_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool -> ImportError
    (record,) = bench_vector(sizes=(10,), env_ids=("fedrl/CartPole-v0",), baselines=("envpool",), min_time=0.01, show=False)
    assert record.baseline_steps_per_s == {"envpool": None}
    assert record.notes["envpool"].startswith("not installed") and record.ratio("envpool") is None


@pytest.mark.parametrize("kwargs, match", [({"env_ids": ("fedrl/GridWorld-v0",)}, "env_ids"), ({"baselines": ("rllib",)}, "baselines")])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench_vector(sizes=(10,), show=False, **kwargs)


def test_command_line_prints_the_table_and_writes_json(tmp_path):
    path = tmp_path / "vector.json"
    out = subprocess.run(
        [sys.executable, "-m", "fedrl_algos.cli", "bench", "vector", "--quick", "--sizes", "20", "--envs", "CartPole",
         "--baselines", "gymnasium", "--json", str(path)],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert "vs gymnasium" in out and "CartPole-v0" in out
    (record,) = json.loads(path.read_text())
    assert record["n_envs"] == 20 and record["baseline_steps_per_s"]["gymnasium"] > 0
    assert record["peak_rss_mb"] > 0 and "peak RSS" in out


def test_numba_kernels_run_where_the_family_has_a_fused_step():
    pytest.importorskip("numba")
    records = bench_vector(sizes=(20,), baselines=("gymnasium",), min_time=0.01, show=False, kernels="numba")
    assert [r.kernels for r in records] == ["numba", "torch"]  # Pendulum has no fused step
    assert all(r.fedrl_steps_per_s > 0 for r in records)


def test_auto_kernels_pick_the_fused_step_on_the_cpu_only_where_it_applies():
    pytest.importorskip("numba")
    records = bench_vector(sizes=(20,), baselines=("gymnasium",), min_time=0.01, show=False)  # kernels="auto"
    assert [r.kernels for r in records] == ["numba", "torch"]
    with pytest.raises(ValueError, match="kernels must be"):
        bench_vector(sizes=(20,), show=False, kernels="jax")
