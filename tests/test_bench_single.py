"""``fedrl bench single``: a smoke run, and references that are faithful yardsticks (no timing asserted)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import fedrl_envs  # noqa: F401  (registers the ids)
from fedrl_algos.bench.single import NumpyArcNavigation, NumpyGridWorld, bench_single
from fedrl_algos.cli import main


def test_plain_numpy_gridworld_has_the_fedrl_dynamics():
    ref = NumpyGridWorld(goal=(4, 2))
    ours = gym.make("fedrl/GridWorld-v0", goal=(4, 2)).unwrapped
    ours.reset(seed=0)
    ref.reset(seed=0)
    for s in range(25):
        for a in range(4):
            ref._s, ref._t = s, 0
            ours.set_state(s)
            assert ref.step(a)[:4] == ours.step(a)[:4]
    ref._s, ref._t = 0, 15
    ours.set_state(0, t=15)
    assert ref.step(0)[3] is ours.step(0)[3] is True  # the 16th step truncates on both


def test_plain_numpy_arc_navigation_has_the_fedrl_dynamics():
    ref = NumpyArcNavigation()
    ours = gym.make("fedrl/ArcNavigation-v0").unwrapped  # agent 0: the reference's default goal
    np.testing.assert_allclose(ref._goal, ours.params.goal.numpy(), atol=1e-7)
    ours.reset(seed=0)
    ref.reset(seed=0)
    rng = np.random.default_rng(0)
    for pos in rng.uniform(-1, 1, (50, 2)).astype(np.float32):
        for a in range(8):
            ref._pos, ref._t = pos.copy(), 0
            ours.set_state(pos)
            r_obs, r_reward, *_ = ref.step(a)
            o_obs, o_reward, *_ = ours.step(a)
            np.testing.assert_allclose(r_obs, o_obs, atol=1e-6)
            assert r_reward == o_reward


def test_bench_single_quick_reports_every_family_and_ppo():
    records, ppo = bench_single(quick=True, ppo_timesteps=128, show=False)
    assert [r.env_id for r in records] == [
        "fedrl/CartPole-v0", "fedrl/Pendulum-v0", "fedrl/GridWorld-v0", "fedrl/ArcNavigation-v0"]
    assert [r.reference for r in records] == ["CartPole-v1", "Pendulum-v1", "plain NumPy", "plain NumPy"]
    for r in records:
        assert r.fedrl_us > 0 and r.reference_us > 0
        assert r.ratio == pytest.approx(r.fedrl_us / r.reference_us)
    assert ppo is not None and ppo.timesteps == 128 and ppo.ratio == pytest.approx(ppo.fedrl_s / ppo.reference_s)


def test_cli_bench_single_quick_without_ppo(capsys, tmp_path):
    out_json = tmp_path / "single.json"
    assert main(["bench", "single", "--quick", "--ppo-timesteps", "0", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1" in out and "Pendulum-v1" in out and "plain NumPy" in out and "ratio" in out
    data = json.loads(out_json.read_text())
    assert len(data["steps"]) == 4 and data["ppo"] is None
    assert all(r["peak_rss_mb"] > 0 for r in data["steps"]) and "peak RSS" in out


@pytest.mark.parametrize(("kwargs", "message"), [({"n_steps": 0}, "n_steps"), ({"ppo_timesteps": -1}, "ppo_timesteps")])
def test_bench_single_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench_single(show=False, **kwargs)
