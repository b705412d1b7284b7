"""NumPy or torch on request, and the complete Gymnasium 1.x vector API (issue 16).

``FamilyVectorEnv`` and ``FederatedVecEnv`` (both backends) take ``array_type="torch"`` (default,
tensors on the device) or ``"numpy"``; the NumPy mode returns the same numbers as NumPy arrays.
``gym.make_vec`` of a fedrl id defaults to ``"numpy"`` (Gymnasium's convention, issue 36).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, VectorEnv

import fedrl_envs  # noqa: F401  (registers the ids)
from fedrl_envs import GRIDWORLD, FamilyVectorEnv
from fedrl_wrappers import FederatedVecEnv

GRID, ARC, CARTPOLE = "fedrl/GridWorld-v0", "fedrl/ArcNavigation-v0", "fedrl/CartPole-v0"
ROOT = Path(__file__).resolve().parent.parent


def _actions(venv: VectorEnv, n_steps: int) -> list[np.ndarray]:
    venv.action_space.seed(7)
    return [venv.action_space.sample() for _ in range(n_steps)]


def _run(venv: VectorEnv, actions: list[np.ndarray], seed: int = 3) -> list[tuple]:
    out = [venv.reset(seed=seed)]
    out += [venv.step(a) for a in actions]
    return out


def _as_numpy(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize(
    "make",
    [
        lambda at: gym.make_vec(ARC, 5, vectorization_mode="vector_entry_point", array_type=at, agent=2),
        lambda at: FederatedVecEnv(GRID, 3, agents=[0, 5], array_type=at),
        lambda at: FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {}], array_type=at),
        lambda at: FederatedVecEnv(CARTPOLE, 2, agents=[0, 1], autoreset=False, array_type=at),
        lambda at: FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {}], autoreset=False, array_type=at),
    ],
    ids=["make_vec", "native", "generic", "native-fixed-horizon", "generic-fixed-horizon"],
)
def test_numpy_mode_returns_the_torch_modes_numbers_as_arrays(make):
    torch_env, numpy_env = make("torch"), make("numpy")
    assert torch_env.array_type == "torch" and numpy_env.array_type == "numpy"
    n_steps = 22 if numpy_env.autoreset else numpy_env.max_episode_steps
    actions = _actions(numpy_env, n_steps)
    # the torch env gets torch actions, the NumPy env NumPy ones
    ref = _run(torch_env, [torch.as_tensor(a) for a in actions])
    got = _run(numpy_env, actions)
    space = numpy_env.single_observation_space
    saw_final = False
    for r, g in zip(ref, got, strict=True):
        assert isinstance(r[0], torch.Tensor) and isinstance(g[0], np.ndarray)
        assert g[0].dtype == space.dtype and g[0].shape == (numpy_env.num_envs, *space.shape)
        for x, y in zip(r[:-1], g[:-1], strict=True):  # obs (reward, terminated, truncated)
            assert np.array_equal(_as_numpy(x), y)
        if len(g) == 5:
            assert g[1].dtype == np.float32 and g[2].dtype == np.bool_ and g[3].dtype == np.bool_
        info_r, info_g = r[-1], g[-1]
        assert sorted(info_r) == sorted(info_g)
        if "final_obs" in info_g:
            saw_final = True
            assert isinstance(info_g["final_obs"], np.ndarray) and info_g["final_obs"].dtype == space.dtype
            assert isinstance(info_g["_final_obs"], np.ndarray) and info_g["_final_obs"].dtype == np.bool_
            assert np.array_equal(_as_numpy(info_r["final_obs"]), info_g["final_obs"])
            assert np.array_equal(_as_numpy(info_r["_final_obs"]), info_g["_final_obs"])
    assert saw_final or not numpy_env.autoreset


def test_numpy_mode_accepts_torch_actions_and_the_torch_mode_numpy_actions():
    numpy_env = FederatedVecEnv(GRID, 2, agents=[0, 1], seed=0, array_type="numpy")
    torch_env = FederatedVecEnv(GRID, 2, agents=[0, 1], seed=0)
    numpy_env.reset(), torch_env.reset()
    a = np.array([0, 1, 2, 3])
    obs_n = numpy_env.step(torch.as_tensor(a))[0]
    obs_t = torch_env.step(a)[0]
    assert isinstance(obs_n, np.ndarray) and isinstance(obs_t, torch.Tensor)
    assert np.array_equal(obs_n, obs_t.numpy())
    assert isinstance(numpy_env.set_state(np.array([0, 1, 2, 3])), np.ndarray)


def test_numpy_mode_rollout_and_subset_and_to_sb3():
    venv = FederatedVecEnv(ARC, 3, agents=[0, 4], seed=1, autoreset=False, array_type="numpy")
    ref = FederatedVecEnv(ARC, 3, agents=[0, 4], seed=1, autoreset=False)
    policy = lambda obs: (obs[..., 0] > 0).astype(np.int64) if isinstance(obs, np.ndarray) else (obs[..., 0] > 0).long()  # noqa: E731
    got, want = venv.rollout(policy), ref.rollout(policy)
    for field in got._fields:
        assert isinstance(getattr(got, field), np.ndarray), field
        assert np.array_equal(getattr(got, field), getattr(want, field).numpy()), field
    assert isinstance(got.alive, np.ndarray) and np.array_equal(got.alive, want.alive.numpy())
    assert venv.subset([1]).array_type == "numpy" and "array_type='numpy'" in repr(venv)
    sb3 = venv.to_sb3(agent=1)
    obs = sb3.reset()
    obs, rewards, dones, infos = sb3.step(np.zeros(3, dtype=np.int64))
    assert obs.shape == (3, 2) and rewards.dtype == np.float32


def test_record_episode_statistics_on_the_numpy_mode_without_array_api_compat():
    # A fresh interpreter where array_api_compat cannot be imported: the NumPy mode needs no extra.
    code = """
import sys
sys.modules["array_api_compat"] = None  # import array_api_compat -> ImportError
import gymnasium as gym, numpy as np
import fedrl_envs
venv = gym.make_vec("fedrl/GridWorld-v0", 4, vectorization_mode="vector_entry_point", array_type="numpy", agent=3)
envs = gym.wrappers.vector.RecordEpisodeStatistics(venv)
obs, _ = envs.reset(seed=0)
assert isinstance(obs, np.ndarray)
total = np.zeros(4)
for _ in range(16):
    obs, reward, terminated, truncated, info = envs.step(np.full(4, 1))
    total += reward
assert truncated.all() and np.allclose(info["episode"]["r"], total) and (info["episode"]["l"] == 16).all()
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(("value", "error"), [("jax", ValueError), ("Torch", ValueError), (np, TypeError), (None, TypeError)])
def test_bad_array_type(value, error):
    for make in (
        lambda: FederatedVecEnv(GRID, 2, array_type=value),
        lambda: FederatedVecEnv("CartPole-v1", 2, array_type=value),
        lambda: gym.make_vec(GRID, 2, vectorization_mode="vector_entry_point", array_type=value),
    ):
        with pytest.raises(error, match="array_type"):
            make()


# --- the Gymnasium vector API ------------------------------------------------------------------
@pytest.mark.parametrize("autoreset", [True, False])
@pytest.mark.parametrize(
    "make",
    [
        lambda ar: gym.make_vec(GRID, 4, vectorization_mode="vector_entry_point", autoreset=ar),
        lambda ar: FederatedVecEnv(GRID, 2, agents=[1, 2], autoreset=ar),
        lambda ar: FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {}], autoreset=ar),
    ],
    ids=["make_vec", "native", "generic"],
)
def test_the_gymnasium_vector_api(make, autoreset):
    venv = make(autoreset)
    mode = AutoresetMode.SAME_STEP if autoreset else AutoresetMode.DISABLED
    assert venv.autoreset_mode is mode and venv.metadata["autoreset_mode"] is mode
    # the direct bases name gymnasium's VectorEnv (what skrl's wrap_env looks at)
    assert VectorEnv in type(venv).__bases__ and isinstance(venv, VectorEnv)
    assert venv.unwrapped is venv and venv.render_mode is None and venv.num_envs == 4
    assert venv.observation_space == gym.vector.utils.batch_space(venv.single_observation_space, 4)
    assert venv.action_space == gym.vector.utils.batch_space(venv.single_action_space, 4)
    venv.reset(seed=5)
    assert venv.np_random_seed == 5 and isinstance(venv.np_random, np.random.Generator)
    assert not venv.closed
    venv.close()
    assert venv.closed
    with pytest.raises(ValueError, match="closed"):
        venv.reset()


def test_make_vec_sets_the_spec_and_forwards_the_options():
    venv = gym.make_vec(GRID, 3, vectorization_mode="vector_entry_point", array_type="numpy", autoreset=False)
    assert venv.spec.id == GRID and venv.spec.kwargs["array_type"] == "numpy"
    assert isinstance(venv.reset(seed=0)[0], np.ndarray)


def test_make_vec_defaults_to_numpy_and_the_classes_to_torch():
    """Issue 36: ``gym.make_vec`` follows Gymnasium (NumPy), torch is one argument away; the classes keep torch."""
    for venv in (gym.make_vec(CARTPOLE, num_envs=4), gym.make_vec(GRID, 4, vectorization_mode="vector_entry_point")):
        assert isinstance(venv, FamilyVectorEnv) and venv.array_type == "numpy"
        obs, _ = venv.reset(seed=0)
        obs, reward, terminated, truncated, _ = venv.step(venv.action_space.sample())
        assert all(isinstance(x, np.ndarray) for x in (obs, reward, terminated, truncated))
        assert "array_type" not in venv.spec.kwargs  # the default is not written into the spec
    torch_env = gym.make_vec(CARTPOLE, num_envs=4, array_type="torch")
    assert torch_env.array_type == "torch" and isinstance(torch_env.reset(seed=0)[0], torch.Tensor)
    assert FederatedVecEnv(CARTPOLE, 2, agents=[0, 1]).array_type == "torch"
    assert FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {}]).array_type == "torch"
    assert FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:1]).array_type == "torch"


# --- reset_mask (Gymnasium's partial reset, used with AutoresetMode.DISABLED) ------------------
def test_reset_mask_resets_only_the_selected_rows():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=3, seed=4, autoreset=False)
    venv.reset()
    for _ in range(5):
        venv.step(np.full(6, 1))
    before_state, before_t = venv.state.clone(), venv._t.clone()
    counters = venv.streams.counters.clone()
    mask = np.array([False, True, False, False, False, False])  # agent 0's env 1
    obs, info = venv.reset(options={"reset_mask": mask})
    keep = torch.from_numpy(~mask)
    assert torch.equal(venv.state[keep], before_state[keep]) and torch.equal(venv._t[keep], before_t[keep])
    assert int(venv._t[1]) == 0
    # the reset row draws from agent 0's stream, like a full reset would; agent 1's stream stays put
    full = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=3, seed=4, autoreset=False)
    full.reset()
    full.streams.counters = counters.clone()
    assert int(venv.state[1]) == int(full.reset()[0][1])
    assert venv.streams.counters[1] == counters[1] and venv.streams.counters[0] != counters[0]
    assert torch.equal(obs, venv.family.observe(venv.state, venv.params))


def test_bad_reset_masks():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=2, seed=4, autoreset=False)
    with pytest.raises(RuntimeError, match="reset_mask"):
        venv.reset(options={"reset_mask": np.array([True, False, False, False])})  # nothing to keep yet
    venv.reset()
    for mask, error in [
        (np.array([1, 0, 0, 0]), TypeError),
        ([True, False, False, False], TypeError),
        (np.array([True, False]), ValueError),
        (np.zeros(4, dtype=bool), ValueError),
    ]:
        with pytest.raises(error, match="reset_mask"):
            venv.reset(options={"reset_mask": mask})
    partial = {"reset_mask": np.array([True, False, False, False])}
    with pytest.raises(ValueError, match="fixed-horizon"):
        FederatedVecEnv(GRID, 2, agents=[0, 1], autoreset=False).reset(options=partial)
    generic = FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {}])
    generic.reset(seed=0)
    with pytest.raises(ValueError, match="generic backend"):
        generic.reset(options=partial)
    everything = {"reset_mask": np.ones(4, dtype=bool)}
    assert np.array_equal(generic.reset(seed=1, options=everything)[0].numpy(), generic.reset(seed=1)[0].numpy())
