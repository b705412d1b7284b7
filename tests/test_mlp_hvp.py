"""Closed-form kernels of the one-hidden-layer softmax MLP against autograd."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from fedrl_algos.core import (
    KernelSampler,
    autograd_hvp,
    hessian_vector_product,
    policy_gradient,
    reward_to_go_weights,
    rollout,
)
from fedrl_algos.per_fedavg_pg import ExactMetaGradient
from fedrl_algos.policies import FastMlpPolicy, MlpPolicy, is_softmax_mlp
from fedrl_algos.policies.mlp.kernels import mlp_hvp, mlp_policy_gradient, mlp_sample
from fedrl_algos.policies.mlp.network import SoftmaxMlp
from fedrl_envs import ARC_NAVIGATION, RandomStreams, derive_keys, stack_params

GAMMA = 0.9
OBS, ACT = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(8)


def _policy(cls=MlpPolicy, **kwargs) -> MlpPolicy:
    kwargs.setdefault("dtype", torch.float64)
    return cls(OBS, kwargs.pop("act", ACT), **kwargs)


def _problem(policy: MlpPolicy, batch=(2, 3), m: int = 40, seed: int = 0):
    """Trajectories on a wide goal (frequent rewards) at perturbed parameters, and a direction."""
    g = torch.Generator().manual_seed(seed)
    d = policy.n_params
    n_rows = batch[0] * batch[1]
    theta = policy.theta.detach().expand(*batch, d) + 0.4 * torch.randn(*batch, d, generator=g, dtype=torch.float64)
    theta = theta.to(policy.param_dtype)
    goals = [(0.5, 0.3), (-0.2, 0.6), (0.7, -0.4)]
    params = stack_params([ARC_NAVIGATION.make_params(goal=goals[i % 3], goal_radius=0.6) for i in range(n_rows)])
    keys = derive_keys(seed, torch.arange(n_rows).reshape(*batch))
    traj = rollout(ARC_NAVIGATION, params, policy, theta, RandomStreams(keys), m)
    v = torch.randn(*batch, d, generator=g, dtype=torch.float64).to(policy.param_dtype)
    return theta, traj, v


@pytest.mark.parametrize("chunk", [None, 50, 100_000])
def test_closed_form_hvp_equals_autograd_float64(chunk):
    policy = _policy()
    theta, traj, v = _problem(policy)
    assert traj.rewards.sum() > 0
    expected = autograd_hvp(policy, theta, traj, v, reward_to_go_weights(traj, GAMMA))
    got = mlp_hvp(policy.softmax_mlp, theta, traj, v, reward_to_go_weights(traj, GAMMA), chunk_samples=chunk)
    assert got.shape == expected.shape == (2, 3, 360)
    assert torch.allclose(got, expected, atol=1e-10, rtol=0)
    assert expected.abs().max() > 1e-2


def test_closed_form_policy_gradient_equals_autograd_float64():
    policy = _policy()
    theta, traj, _ = _problem(policy)
    expected = policy_gradient(policy, theta, traj, GAMMA, closed_form=False)
    for chunk in (None, 30):
        got = mlp_policy_gradient(policy.softmax_mlp, theta, traj, reward_to_go_weights(traj, GAMMA), chunk_samples=chunk)
        assert torch.allclose(got, expected, atol=1e-12, rtol=0)
    assert expected.abs().max() > 1e-2


def test_other_sizes_masks_and_a_shared_direction():
    """Another width and action count, episodes cut short by the mask, one direction for all rows."""
    policy = _policy(act=gym.spaces.Discrete(3), net_arch=(5,), init_std=(0.8, 0.5), init_seed=3)
    d = policy.n_params
    assert d == 2 * 5 + 5 + 5 * 3 + 3
    g = torch.Generator().manual_seed(1)
    obs = torch.rand(4, 7, 6, 2, generator=g, dtype=torch.float64) * 2 - 1
    actions = torch.randint(0, 3, (4, 7, 6), generator=g)
    rewards = (torch.rand(4, 7, 6, generator=g) < 0.4).to(torch.float64)
    mask = (torch.arange(6).reshape(1, 1, 6) < torch.randint(1, 7, (4, 7, 1), generator=g)).to(torch.float64)
    from fedrl_algos.core import Trajectories

    traj = Trajectories(obs, actions, rewards * mask, mask)
    theta = torch.randn(4, d, generator=g, dtype=torch.float64)
    v = torch.randn(d, generator=g, dtype=torch.float64)
    assert torch.allclose(mlp_hvp(policy.softmax_mlp, theta, traj, v, reward_to_go_weights(traj, GAMMA)), autograd_hvp(policy, theta, traj, v, reward_to_go_weights(traj, GAMMA)), atol=1e-10)
    pg = policy_gradient(policy, theta, traj, GAMMA, closed_form=False)
    assert torch.allclose(mlp_policy_gradient(policy.softmax_mlp, theta, traj, reward_to_go_weights(traj, GAMMA)), pg, atol=1e-12)


def test_dispatch_uses_the_closed_form_only_for_one_tanh_hidden_layer():
    assert is_softmax_mlp(_policy())
    assert is_softmax_mlp(_policy(FastMlpPolicy))
    assert not is_softmax_mlp(_policy(activation="relu"))
    assert not is_softmax_mlp(_policy(net_arch=(8, 8)))
    assert not is_softmax_mlp(_policy(act=gym.spaces.Box(-1, 1, (2,))))
    policy = _policy()
    theta, traj, v = _problem(policy, m=10)
    assert torch.equal(hessian_vector_product(policy, theta, traj, v, GAMMA), mlp_hvp(policy.softmax_mlp, theta, traj, v, reward_to_go_weights(traj, GAMMA)))
    assert torch.equal(policy_gradient(policy, theta, traj, GAMMA), mlp_policy_gradient(policy.softmax_mlp, theta, traj, reward_to_go_weights(traj, GAMMA)))
    deep = _policy(net_arch=(4, 4))
    theta, traj, v = _problem(deep, m=5)
    assert torch.equal(hessian_vector_product(deep, theta, traj, v, GAMMA), autograd_hvp(deep, theta, traj, v, reward_to_go_weights(traj, GAMMA)))


def test_the_kernels_take_the_network_not_the_policy():
    # what the kernels read of a policy: its sizes and (FastMlpPolicy) its kernel choice
    assert _policy().softmax_mlp == SoftmaxMlp(n_inputs=2, n_hidden=32, n_actions=8, kernels="torch")
    assert _policy(FastMlpPolicy, kernels="auto").softmax_mlp == SoftmaxMlp(2, 32, 8, "auto")
    assert _policy(FastMlpPolicy, net_arch=(5,), act=gym.spaces.Discrete(3)).softmax_mlp == SoftmaxMlp(2, 5, 3)
    for other in (_policy(activation="relu"), _policy(net_arch=(8, 8)), _policy(act=gym.spaces.Box(-1, 1, (2,)))):
        with pytest.raises(ValueError, match="closed-form MLP kernels need a discrete MlpPolicy with one tanh hidden layer"):
            other.softmax_mlp  # noqa: B018


def test_rows_do_not_depend_on_the_batch():
    """A row's estimate is the same whether it is computed alone or with other rows (any tiling)."""
    policy = _policy(dtype=torch.float32)
    theta, traj, v = _problem(policy, batch=(3, 4), m=60)
    full = mlp_hvp(policy.softmax_mlp, theta, traj, v, reward_to_go_weights(traj, GAMMA), chunk_samples=2000)
    from fedrl_algos.core import Trajectories

    alone = Trajectories(*(x[1:2, 2:3] for x in traj))
    one = mlp_hvp(policy.softmax_mlp, theta[1:2, 2:3], alone, v[1:2, 2:3], reward_to_go_weights(alone, GAMMA), chunk_samples=2000)
    assert torch.equal(full[1, 2], one[0, 0])


def test_exact_meta_gradient_chunking_with_the_closed_form():
    policy = _policy()
    params = stack_params(ARC_NAVIGATION.train_tasks)
    theta = policy.theta.detach().expand(6, -1).clone()

    def make():
        return KernelSampler(ARC_NAVIGATION, params, policy, RandomStreams(derive_keys(9, torch.arange(6))))

    v = torch.randn(6, 360, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    whole = ExactMetaGradient(policy, GAMMA, 1.0, 5, 120, 5, hvp_chunk=1000).curvature(make(), theta, v)
    chunked = ExactMetaGradient(policy, GAMMA, 1.0, 5, 120, 5, hvp_chunk=32).curvature(make(), theta, v)
    assert torch.allclose(whole, chunked, atol=1e-12)


def test_fast_sampling_draws_the_same_actions():
    policy = _policy(dtype=torch.float32)
    fast = _policy(FastMlpPolicy, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    theta = policy.theta.detach().expand(4, 5, -1) + 0.8 * torch.randn(4, 5, 360, generator=g)
    obs = torch.rand(4, 5, 3000, 2, generator=g) * 2 - 1
    keys = derive_keys(3, torch.arange(20).reshape(4, 5))
    a, b = RandomStreams(keys), RandomStreams(keys)
    ref = policy.sample(theta, obs, a)
    got = fast.sample(theta, obs, b)
    assert got.shape == ref.shape == (4, 5, 3000) and got.dtype == ref.dtype
    assert torch.equal(a.counters, b.counters)
    assert (got != ref).float().mean() <= 1e-3  # only where a uniform is within rounding of a CDF step
    assert torch.equal(got, mlp_sample(fast.softmax_mlp, theta, obs, RandomStreams(keys)))
    # one observation for the whole batch and a single row also work
    single = fast.sample(theta[0, 0], obs[0, 0, :7], RandomStreams(derive_keys(1, torch.arange(1))[0]))
    assert single.shape == (7,)


def test_fast_policy_rollouts_match_and_learn_the_same():
    fast = _policy(FastMlpPolicy, dtype=torch.float32)
    ref = _policy(dtype=torch.float32)
    params = stack_params(ARC_NAVIGATION.train_tasks)
    theta = ref.theta.detach().expand(6, -1).clone()
    keys = derive_keys(5, torch.arange(6))
    t_fast = rollout(ARC_NAVIGATION, params, fast, theta, RandomStreams(keys), 50)
    t_ref = rollout(ARC_NAVIGATION, params, ref, theta, RandomStreams(keys), 50)
    same = (t_fast.actions == t_ref.actions).all(-1).float().mean()
    assert same >= 0.99  # whole trajectories identical except for rare rounding flips
    assert torch.equal(torch.tensor(fast.n_params), torch.tensor(360))
