"""``kernels="numpy"``: the native vector env's step kernel on NumPy views, against the torch kernel."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import fedrl_envs
from fedrl_envs.arc_navigation import ARC_NAVIGATION
from fedrl_envs.cartpole import CARTPOLE
from fedrl_envs.gridworld import GRIDWORLD
from fedrl_envs.ops import NUMPY_BATCH, NUMPY_ONE, array_ops, numpy_batch
from fedrl_envs.pendulum import PENDULUM
from fedrl_envs.vector import FamilyVectorEnv
from fedrl_wrappers import FederatedVecEnv


def _actions(env, gen):
    space = env.single_action_space
    if hasattr(space, "n"):
        return torch.randint(0, int(space.n), (env.num_envs,), generator=gen)
    return torch.rand((env.num_envs, *space.shape), generator=gen) * 5 - 2.5  # beyond the torque bounds too


def _pair(family, n_envs=7, **kwargs):
    tasks = [family.make_params(**(family.task_kwargs(t) | {"horizon": 9})) for t in family.train_tasks[:4]]
    return (FamilyVectorEnv(family, tasks, n_envs=n_envs, seed=2, kernels=k, **kwargs) for k in ("torch", "numpy"))


@pytest.mark.parametrize("family", [GRIDWORLD, ARC_NAVIGATION], ids=lambda f: f.env_id)
def test_integer_and_clip_families_are_bitwise_the_torch_env(family):
    torch_env, numpy_env = _pair(family)
    assert torch.equal(torch_env.reset()[0], numpy_env.reset()[0])
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):  # several time limits: resets of every row at once
        actions = _actions(torch_env, gen)
        a, b = torch_env.step(actions), numpy_env.step(actions)
        for x, y in zip(a[:4], b[:4], strict=True):
            assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and torch.equal(x, y)
        assert a[4].keys() == b[4].keys()
        assert torch.equal(torch_env.state, numpy_env.state)
        assert torch.equal(torch_env.streams.counters, numpy_env.streams.counters)


@pytest.mark.parametrize("family", [GRIDWORLD, ARC_NAVIGATION], ids=lambda f: f.env_id)
def test_staggered_resets_draw_the_torch_envs_numbers(family):
    # Episodes out of step (a partial reset), so each time limit ends some rows only: the NumPy
    # path hashes those rows' reset words itself and must give the torch path's states and counters.
    torch_env, numpy_env = _pair(family)
    torch_env.reset()
    numpy_env.reset()
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        actions = _actions(torch_env, gen)
        torch_env.step(actions)
        numpy_env.step(actions)
    mask = np.arange(torch_env.num_envs) % 3 == 0
    assert torch.equal(torch_env.reset(options={"reset_mask": mask})[0], numpy_env.reset(options={"reset_mask": mask})[0])
    partial = 0
    for _ in range(30):
        actions = _actions(torch_env, gen)
        a, b = torch_env.step(actions), numpy_env.step(actions)
        for x, y in zip(a[:4], b[:4], strict=True):
            assert torch.equal(x, y)
        if a[4]:
            partial += int(not bool(a[4]["_final_obs"].all()))
            assert torch.equal(a[4]["final_obs"], b[4]["final_obs"]) and torch.equal(a[4]["_final_obs"], b[4]["_final_obs"])
        assert torch.equal(torch_env.state, numpy_env.state)
        assert torch.equal(torch_env._t, numpy_env._t)
        assert torch.equal(torch_env.streams.counters, numpy_env.streams.counters)
    assert partial > 0


@pytest.mark.parametrize("family", [CARTPOLE, PENDULUM], ids=lambda f: f.env_id)
def test_trigonometric_families_agree_to_an_ulp_of_sin_and_cos(family):
    torch_env, numpy_env = _pair(family, n_envs=200)
    assert torch.equal(torch_env.reset()[0], numpy_env.reset()[0])  # starts are the streams': bitwise
    gen = torch.Generator().manual_seed(1)
    differing = 0
    for _ in range(20):
        actions = _actions(torch_env, gen)
        numpy_env.set_state(torch_env.state, torch_env._t)  # one step from the same states each time
        a, b = torch_env.step(actions), numpy_env.step(actions)
        torch.testing.assert_close(b[0], a[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(b[1], a[1], rtol=1e-6, atol=1e-6)
        both = (a[2] | a[3]) & (b[2] | b[3])  # rows that reset in both: the same fresh starts
        if a[4] and b[4]:
            assert torch.equal(a[0][both], b[0][both])
        assert torch.equal(torch_env.streams.counters, numpy_env.streams.counters) or not torch.equal(a[2], b[2])
        differing += int((a[0] != b[0]).any(1).sum())
        assert float((a[2] != b[2]).float().mean()) < 0.01  # a flag flips only on a threshold
    assert differing > 0  # NumPy's sin/cos do round some arguments differently


def test_the_namespace_is_batched_only_inside_numpy_batch():
    one_state = np.zeros(4, dtype=np.float32)
    assert array_ops(one_state) is NUMPY_ONE
    with numpy_batch():
        assert array_ops(one_state) is NUMPY_BATCH
        with numpy_batch():
            pass
        assert array_ops(one_state) is NUMPY_BATCH
    assert array_ops(one_state) is NUMPY_ONE
    assert array_ops(torch.zeros(3)) is not NUMPY_BATCH


def test_federated_env_and_make_vec_take_kernels():
    venv = FederatedVecEnv("fedrl/CartPole-v0", 3, agents=[0, 4], seed=0, kernels="numpy")
    obs, _ = venv.reset()
    obs2 = venv.step(torch.ones(venv.num_envs, dtype=torch.int64))[0]
    assert obs2.shape == obs.shape and obs2.is_contiguous()
    assert venv.kernels == "numpy" and venv.subset([1]).kernels == "numpy"
    made = gym.make_vec("fedrl/GridWorld-v0", num_envs=5, vectorization_mode="vector_entry_point", kernels="numpy")
    made.reset(seed=0)
    assert made.unwrapped.kernels == "numpy"
    made.step(np.zeros(5, dtype=np.int64))


def test_bad_kernels_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="kernels must be"):
        FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:1], kernels="jax")
    with pytest.raises(ValueError, match="kernels.*CPU"):
        FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:1], device="meta", kernels="numpy")
    with pytest.raises(ValueError, match="kernels is for fedrl's native families"):
        FederatedVecEnv("CartPole-v1", 2, kernels="numpy")

    class TorchOnly(type(GRIDWORLD)):
        numpy_kernels = False

    with pytest.raises(ValueError, match="numpy_kernels"):
        FamilyVectorEnv(TorchOnly(), GRIDWORLD.train_tasks[:1], kernels="numpy")
    assert fedrl_envs.FamilyVectorEnv is FamilyVectorEnv
