"""The single env's NumPy path runs the family kernels written once against ``fedrl_envs.ops``.

Each kernel is run twice from one source: on a torch batch (:data:`fedrl_envs.ops.TORCH`) and on
one environment's NumPy values (:data:`fedrl_envs.ops.NUMPY_ONE`). These tests compare the two
row by row. Bitwise equality is required wherever the two compute the same float32 operations:
everything except ``sin``/``cos``, which torch (SLEEF) and NumPy round differently by one ulp for
about 5% of float32 arguments. So the gridworld and arc navigation must agree bitwise everywhere,
CartPole and Pendulum bitwise on every row whose ``sin``/``cos`` arguments both libraries round
alike, and to 1e-6 on the others.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import fedrl_envs
from fedrl_envs import (
    ARC_NAVIGATION,
    CARTPOLE,
    GRIDWORLD,
    PENDULUM,
    FamilyEnv,
    RandomStreams,
    derive_keys,
    stack_params,
)
from fedrl_envs.ops import NUMPY_ONE, TORCH, array_ops
from fedrl_envs.params import params_to_numpy
from fedrl_envs.rng import OneStream

FAMILIES = [GRIDWORLD, ARC_NAVIGATION, CARTPOLE, PENDULUM]


def numpy_rows(family, task, state: torch.Tensor, action: torch.Tensor):
    """The NumPy kernels of one task on every row of a batch, one environment at a time."""
    params = params_to_numpy(task)
    discrete = isinstance(family.action_space(task), gym.spaces.Discrete)
    out = []
    for s, a in zip(state.numpy(), action.numpy(), strict=True):
        s = s[()] if s.ndim == 0 else s
        next_state, reward, terminated = family.step(s, int(a) if discrete else a, params)
        out.append((next_state, reward, terminated, family.observe(next_state, params)))
    return out


def torch_rows(family, task, state: torch.Tensor, action: torch.Tensor):
    batch = stack_params([task] * state.shape[0])
    next_state, reward, terminated = family.step(state, action, batch)
    return next_state, reward, terminated, family.observe(next_state, batch)


def same_rounding(fn_name: str, x: torch.Tensor) -> np.ndarray:
    """Rows where torch's and NumPy's float32 ``sin``/``cos`` of ``x`` are bitwise equal."""
    return getattr(torch, fn_name)(x).numpy() == getattr(np, fn_name)(x.numpy())


def test_array_ops_picks_the_namespace_of_its_input():
    assert array_ops(torch.zeros(2)) is TORCH
    assert array_ops(np.zeros(2, np.float32)) is NUMPY_ONE
    assert array_ops(np.float32(1.0)) is NUMPY_ONE


def test_numpy_clip_keeps_the_dtype_and_nan():
    x = NUMPY_ONE.clip(np.float32(5.0), -2.0, 2.0)
    assert x == 2.0 and type(x) is np.float32  # a Python float bound never turns float32 into float64
    assert type(NUMPY_ONE.clip(np.float32(-5.0), -2.0, 2.0)) is np.float32
    assert np.isnan(NUMPY_ONE.clip(np.float32("nan"), -2.0, 2.0))
    assert NUMPY_ONE.clip(np.int64(9), high=3) == 3
    arr = NUMPY_ONE.clip(np.array([-3.0, 0.5, 3.0], np.float32), -1.0, 1.0)
    assert arr.dtype == np.float32 and arr.tolist() == [-1.0, 0.5, 1.0]
    assert torch.equal(TORCH.clip(torch.tensor([-3.0, 0.5, 3.0]), -1.0, 1.0), torch.tensor([-1.0, 0.5, 1.0]))


def test_every_builtin_family_has_numpy_kernels():
    assert all(family.numpy_kernels for family in fedrl_envs.FAMILIES.values())


def test_gridworld_numpy_kernel_equals_torch_on_every_state_action_and_task():
    for task in GRIDWORLD.train_tasks + GRIDWORLD.heldout_tasks[:3]:
        states = torch.arange(task.n_states).repeat_interleave(4)
        actions = torch.arange(4).repeat(task.n_states)
        t_next, t_reward, t_term, t_obs = torch_rows(GRIDWORLD, task, states, actions)
        for i, (n_next, n_reward, n_term, n_obs) in enumerate(numpy_rows(GRIDWORLD, task, states, actions)):
            assert isinstance(n_next, np.int64) and isinstance(n_reward, np.float32)
            assert (int(n_next), float(n_reward), bool(n_term), int(n_obs)) == (
                int(t_next[i]), float(t_reward[i]), bool(t_term[i]), int(t_obs[i]))


def test_arc_navigation_numpy_kernel_equals_torch_bitwise():
    gen = torch.Generator().manual_seed(0)
    for task in ARC_NAVIGATION.train_tasks + ARC_NAVIGATION.heldout_tasks:
        # random positions, positions at the walls, and positions near the goal region's edge
        goal = task.goal
        ring = goal + task.goal_radius * torch.stack([torch.cos(a := torch.rand(64, generator=gen) * 6.3), torch.sin(a)], -1)
        states = torch.cat([torch.rand(256, 2, generator=gen) * 2 - 1, torch.tensor([[1.0, -1.0], [-0.95, 0.99]]), ring.clamp(-1, 1)])
        states = states.repeat_interleave(8, 0)
        actions = torch.arange(8).repeat(states.shape[0] // 8)
        t_next, t_reward, t_term, t_obs = torch_rows(ARC_NAVIGATION, task, states, actions)
        rows = numpy_rows(ARC_NAVIGATION, task, states, actions)
        assert np.array_equal(np.stack([r[0] for r in rows]), t_next.numpy())
        assert np.array_equal(np.array([r[1] for r in rows]), t_reward.numpy())
        assert [bool(r[2]) for r in rows] == t_term.tolist()
        assert np.array_equal(np.stack([r[3] for r in rows]), t_obs.numpy())
        assert 0 < float(t_reward.mean()) < 1  # both sides of the goal radius were checked


def test_cartpole_numpy_kernel_equals_torch_where_sin_and_cos_round_alike():
    rng = np.random.default_rng(0)
    high = np.array([2.6, 3.0, 0.25, 3.0])
    states = torch.from_numpy(rng.uniform(-high, high, size=(2000, 4)).astype(np.float32))
    actions = torch.from_numpy(rng.integers(0, 2, 2000))
    alike = same_rounding("sin", states[:, 2]) & same_rounding("cos", states[:, 2])
    assert 0.8 < alike.mean() < 1.0  # both kinds of rows are checked
    for task in CARTPOLE.train_tasks:
        t_next, t_reward, t_term, _ = torch_rows(CARTPOLE, task, states, actions)
        rows = numpy_rows(CARTPOLE, task, states, actions)
        n_next = np.stack([r[0] for r in rows])
        assert n_next.dtype == np.float32
        assert np.array_equal(n_next[alike], t_next.numpy()[alike])
        np.testing.assert_allclose(n_next, t_next.numpy(), rtol=1e-6, atol=1e-6)
        assert [float(r[1]) for r in rows] == t_reward.tolist()
        n_term = np.array([bool(r[2]) for r in rows])
        assert np.array_equal(n_term[alike], t_term.numpy()[alike])
        assert 0 < n_term.mean() < 1  # both sides of the thresholds


def test_pendulum_numpy_kernel_equals_torch_where_sin_and_cos_round_alike():
    rng = np.random.default_rng(1)
    theta = rng.uniform(-np.pi, np.pi, 2000)
    states = torch.from_numpy(np.stack([theta, rng.uniform(-8, 8, 2000)], 1).astype(np.float32))
    actions = torch.from_numpy(rng.uniform(-3, 3, (2000, 1)).astype(np.float32))  # some clipped
    step_alike = same_rounding("sin", states[:, 0])
    for task in PENDULUM.train_tasks:
        t_next, t_reward, t_term, t_obs = torch_rows(PENDULUM, task, states, actions)
        rows = numpy_rows(PENDULUM, task, states, actions)
        n_next = np.stack([r[0] for r in rows])
        n_reward = np.array([r[1] for r in rows])
        assert n_next.dtype == np.float32 and n_reward.dtype == np.float32
        assert np.array_equal(n_reward, t_reward.numpy())  # the cost has no sin/cos
        assert np.array_equal(n_next[step_alike], t_next.numpy()[step_alike])
        np.testing.assert_allclose(n_next, t_next.numpy(), rtol=1e-6, atol=1e-6)
        obs_alike = step_alike & same_rounding("sin", t_next[:, 0]) & same_rounding("cos", t_next[:, 0])
        n_obs = np.stack([PENDULUM.observe(t, params_to_numpy(task)) for t in t_next.numpy()])
        assert np.array_equal(n_obs[obs_alike], t_obs.numpy()[obs_alike])
        np.testing.assert_allclose(n_obs, t_obs.numpy(), rtol=1e-6, atol=1e-6)
        assert not any(bool(r[2]) for r in rows)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.env_id)
def test_numpy_reset_kernel_equals_torch_bitwise(family):
    noise = RandomStreams(derive_keys(5, torch.arange(500))).uniform((family.reset_noise_dim,))
    noise = torch.cat([noise, torch.zeros(1, family.reset_noise_dim), torch.full((1, family.reset_noise_dim), 1 - 2.0**-24)])
    for task in family.train_tasks[:3]:
        expected = family.reset(stack_params([task] * noise.shape[0]), noise).numpy()
        got = np.stack([np.asarray(family.reset(params_to_numpy(task), u)) for u in noise.numpy()])
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("seed", [0, 1, -7, 2**63 - 1, 2**64 - 1, 123456789])
def test_one_stream_draws_what_random_streams_draws(seed):
    many = RandomStreams(derive_keys(seed, torch.arange(1)))
    one = OneStream(derive_keys(seed, torch.arange(1))[0])
    for count in (4, 1, 2, 3, 4):
        expected = many.uniform((1, count)).reshape(-1).numpy()
        got = one.uniform_float32(count)
        assert got.dtype == np.float32 and np.array_equal(got, expected)
    assert one.counter == int(many.counters[0])


@pytest.mark.parametrize("env_id", sorted(fedrl_envs.FAMILIES))
def test_single_env_starts_are_those_of_agent_zero(env_id):
    family = fedrl_envs.get_family(env_id)
    env = gym.make(env_id).unwrapped
    venv = fedrl_envs.FamilyVectorEnv(family, [family.train_tasks[0]], n_envs=1, seed=42, autoreset=False)
    env.reset(seed=42)
    venv.reset()
    for _ in range(20):  # every reset without a seed draws the next numbers of the same stream
        assert torch.equal(env.state, venv.state[0])
        env.reset()
        venv.reset()


def test_state_is_a_tensor_copy():
    env = gym.make("fedrl/CartPole-v0").unwrapped
    env.reset(seed=0)
    state = env.state
    assert state.dtype == torch.float32 and state.shape == (4,)
    state += 1.0
    assert not torch.equal(env.state, state)
    grid = gym.make("fedrl/GridWorld-v0").unwrapped
    grid.reset(seed=0)
    assert grid.state.dtype == torch.int64 and grid.state.shape == ()
    obs, *_ = env.step(0)
    obs += 1.0  # an observation is never a view of the state
    assert not np.array_equal(obs, env.state.numpy())


@pytest.mark.parametrize("action", [np.array([0.7], np.float32), np.array([0.7]), [0.7], torch.tensor([0.7]), np.array([0.7], np.float16)])
def test_pendulum_actions_of_any_float_kind_step_alike(action):
    env = gym.make("fedrl/Pendulum-v0").unwrapped
    ref = gym.make("fedrl/Pendulum-v0").unwrapped
    for e in (env, ref):
        e.reset(seed=0)
    obs, reward, *_ = env.step(action)
    # the action rounded to float32 once, from whatever precision it was given in
    as_float32 = np.asarray(action.numpy() if isinstance(action, torch.Tensor) else action).astype(np.float32)
    ref_obs, ref_reward, *_ = ref.step(as_float32)
    assert np.array_equal(obs, ref_obs) and reward == ref_reward


@pytest.mark.parametrize(("action", "message"), [
    (np.array([np.nan], np.float32), "action must be finite"),
    (np.array([np.inf]), "action must be finite"),
    (np.array([0.5, 0.5], np.float32), "action must have shape"),
    (np.array([True]), "action must be a real-valued tensor"),
])
def test_pendulum_fast_path_refuses_what_the_torch_path_refuses(action, message):
    env = gym.make("fedrl/Pendulum-v0").unwrapped
    env.reset(seed=0)
    state = env.state
    with pytest.raises((TypeError, ValueError), match=message):
        env.step(action)
    assert torch.equal(env.state, state) and env._t == 0


def test_family_without_numpy_kernels_steps_a_torch_batch_of_one():
    class TorchOnlyCartPole(type(CARTPOLE)):
        numpy_kernels = False

    class Env(FamilyEnv):
        family = TorchOnlyCartPole()

    fast, slow = fedrl_envs.CartPoleEnv(), Env()
    assert fast._numpy_params is not None and slow._numpy_params is None
    fast.reset(seed=3)
    slow.reset(seed=3)
    assert torch.equal(fast.state, slow.state)
    for k in range(8):
        f, s = fast.step(k % 2), slow.step(k % 2)
        np.testing.assert_allclose(f[0], s[0], rtol=1e-6, atol=1e-6)
        assert f[1:4] == s[1:4]
