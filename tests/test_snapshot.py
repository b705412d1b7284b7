"""Mid-episode snapshots of a FederatedVecEnv: plain data from which a fresh env steps on identically.

* Generic backend (sync and async, a classic-control env, a MuJoCo one, an env registered here)
  and native backend: after a snapshot taken mid-episode (some sub-environments past an
  autoreset), a fresh env given it returns exactly the observations, rewards and flags the
  original returns for the same actions; the snapshot survives JSON.
* A snapshot of another layout or backend is refused; a fixed-horizon env snapshots its generators.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_wrappers import FederatedVecEnv
from fedrl_wrappers.snapshot import EpisodeRecorder, tensor_data, tensor_from_data


class Jumpy(gym.Env):
    """Start and every step draw from ``np_random``; episodes of 5 steps (the time limit)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, scale: float = 1.0) -> None:
        self.scale, self.x = scale, 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.normal())
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += self.scale * (int(action) - 1) + float(self.np_random.uniform(-0.1, 0.1))
        return np.array([self.x], np.float32), self.x, False, False, {}


JUMPY = "fedrl_test/Jumpy-v0"
if JUMPY not in gym.registry:
    gym.register(JUMPY, entry_point=Jumpy, max_episode_steps=5)

CASES = [
    (JUMPY, [{"scale": 1.0}, {"scale": 0.5}], "sync"),
    (JUMPY, [{"scale": 1.0}, {"scale": 0.5}], "async"),
    ("Pendulum-v1", [{"g": 9.0}, {"g": 11.0}], "sync"),
    ("InvertedPendulum-v5", [{"reset_noise_scale": 0.02}, {"reset_noise_scale": 0.05}], "sync"),
    ("fedrl/CartPole-v0", None, None),
]


def _make(env_id, agent_kwargs, mode):
    extra = {"vectorization_mode": mode} if mode else {}
    return FederatedVecEnv(env_id, 3, agent_kwargs=agent_kwargs, autoreset=True, seed=4, array_type="numpy", **extra)


@pytest.mark.parametrize("env_id, agent_kwargs, mode", CASES, ids=lambda v: str(v) if not isinstance(v, list) else "")
def test_a_restored_snapshot_steps_on_identically(env_id, agent_kwargs, mode):
    if env_id.startswith("InvertedPendulum"):
        pytest.importorskip("mujoco")
    original = _make(env_id, agent_kwargs, mode)
    restored = _make(env_id, agent_kwargs, mode)
    try:
        original.reset()
        space = original.single_action_space
        space.seed(0)
        actions = [np.stack([space.sample() for _ in range(original.num_envs)]) for _ in range(24)]
        ended = 0
        for action in actions[:12]:
            _, _, terminated, truncated, _ = original.step(action)
            ended += int(np.sum(terminated | truncated))
        snapshot = json.loads(json.dumps(original.snapshot()))  # plain data
        restored.restore_snapshot(snapshot)
        for action in actions[12:]:
            a, b = original.step(action), restored.step(action)
            for x, y in zip(a[:4], b[:4], strict=True):
                assert np.array_equal(np.asarray(x), np.asarray(y))
        if env_id == JUMPY:
            assert ended > 0  # the snapshot was taken after autoresets, mid-episode
    finally:
        original.close()
        restored.close()


def test_without_the_snapshot_a_fresh_env_differs():
    # The check above can fail: a fresh env reset from the same seed is not mid-episode.
    original, fresh = _make(*CASES[0]), _make(*CASES[0])
    original.reset()
    fresh.reset()
    action = np.ones(original.num_envs, dtype=np.int64)
    for _ in range(3):
        original.step(action)
    assert not np.array_equal(original.step(action)[0], fresh.step(action)[0])


def test_snapshots_of_another_layout_or_backend_are_refused():
    generic = _make(*CASES[0])
    generic.reset()
    generic.step(np.ones(generic.num_envs, dtype=np.int64))
    native = _make(*CASES[-1])
    native.reset()
    with pytest.raises(ValueError, match="generic-backend"):
        generic.restore_snapshot(native.snapshot())
    with pytest.raises(ValueError, match="native-backend"):
        native.restore_snapshot(generic.snapshot())
    other = FederatedVecEnv(JUMPY, 2, agent_kwargs=[{"scale": 1.0}, {"scale": 0.5}], autoreset=True, seed=4)
    with pytest.raises(ValueError, match="laid out otherwise|sub-environments"):
        other.restore_snapshot(generic.snapshot())
    for env in (generic, native, other):
        env.close()


def test_a_fixed_horizon_env_snapshots_its_generators_only():
    env = FederatedVecEnv(JUMPY, 2, agent_kwargs=[{}], autoreset=False, seed=1)
    env.reset()
    snapshot = env.snapshot()
    assert "episodes" not in snapshot and snapshot["random_state"]["reset_done"]
    assert not any(isinstance(e, EpisodeRecorder) for e in env.agent_envs[0].envs)  # nothing recorded there
    env.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_tensors_travel_exactly(dtype):
    x = (torch.randn(3, 4, dtype=torch.float64) * 1e6).to(dtype)
    back = tensor_from_data(json.loads(json.dumps(tensor_data(x))))
    assert back.dtype == dtype and torch.equal(back, x)
    with pytest.raises(ValueError, match="not a tensor"):
        tensor_from_data({"dtype": "Module", "shape": [1], "values": [0]})


def test_atari_is_known_not_to_resume_exactly_and_save_says_so(tmp_path, monkeypatch):
    from fedrl_algos import FedAvgPG
    from fedrl_wrappers.federated import GenericFederatedVecEnv

    pytest.importorskip("ale_py")
    import ale_py  # noqa: F401  (registers the ALE ids)

    pong = FederatedVecEnv("ALE/Pong-v5", 1, agent_kwargs=[{}], seed=0)
    assert pong.exact_random_state is False  # the emulator's own generator
    pong.close()
    jumpy = _make(*CASES[0])
    assert jumpy.exact_random_state is True
    jumpy.close()
    model = FedAvgPG("MlpPolicy", "Pendulum-v1", agent_kwargs=[{"g": 9.0}], horizon=5, n_trajectories=2, seed=0, device="cpu")
    model.save(tmp_path / "quiet.zip")  # no warning where the file holds everything
    monkeypatch.setattr(GenericFederatedVecEnv, "exact_random_state", property(lambda self: False))
    with pytest.warns(UserWarning, match="random state of their own"):
        model.save(tmp_path / "m.zip")


def test_long_runs_forget_old_actions_and_a_restored_env_snapshots_again():
    # 150 steps of 5-step episodes: the action log drops what no episode in progress needs; a
    # restored env's own snapshot (its log rebuilt from the records) restores a third env identically.
    original, restored, third = (_make(*CASES[0]) for _ in range(3))
    original.reset()
    action = np.ones(original.num_envs, dtype=np.int64)
    for _ in range(150):
        original.step(action)
    assert len(original._action_log) < 80
    restored.restore_snapshot(json.loads(json.dumps(original.snapshot())))
    for _ in range(3):
        original.step(action)
        restored.step(action)
    third.restore_snapshot(restored.snapshot())
    for _ in range(7):
        a, b, c = original.step(action), restored.step(action), third.step(action)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1])
    for env in (original, restored, third):
        env.close()
