"""Monte Carlo estimators against exact dynamic programming and explicit Hessians."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from fedrl_algos.core import (
    KernelSampler,
    PolicyGradient,
    Trajectories,
    autograd_hvp,
    discounted_rewards_to_go,
    policy_gradient,
    reward_to_go_weights,
    rollout,
)
from fedrl_algos.per_fedavg_pg import ExactMetaGradient, FirstOrderMetaGradient
from fedrl_algos.policies import MlpPolicy
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, RandomStreams, derive_keys, index_params, stack_params

GAMMA = 0.9


def _theta(n_agents: int, scale: float = 0.5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_agents, 100, generator=g, dtype=torch.float64) * scale


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_rewards_to_go_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    expected = torch.tensor([[1 + 0 + 2 * 0.81, 0 + 2 * 0.81, 2 * 0.81]])
    assert torch.allclose(discounted_rewards_to_go(rewards, 0.9), expected)


def test_tabular_closed_forms_equal_autograd(tabular, grid_params):
    theta = _theta(8)
    traj = rollout(GRIDWORLD, grid_params, tabular, theta, RandomStreams(derive_keys(1, torch.arange(8))), 64)
    v = _theta(8, seed=5)
    pg_closed = tabular.score_gradient(theta, traj, reward_to_go_weights(traj, GAMMA))
    pg_auto = policy_gradient(tabular, theta, traj, GAMMA, closed_form=False)
    assert torch.allclose(pg_closed, pg_auto, atol=1e-12)
    hv_closed = tabular.hvp(theta, traj, v, reward_to_go_weights(traj, GAMMA))
    hv_auto = autograd_hvp(tabular, theta, traj, v, reward_to_go_weights(traj, GAMMA))
    assert torch.allclose(hv_closed, hv_auto, atol=1e-12)
    assert hv_closed.abs().max() > 1e-3  # a zero estimate would pass the comparison trivially


def test_monte_carlo_policy_gradient_matches_exact(tabular, grid_params, evaluator):
    agents = [0, 3]
    theta = _theta(2, scale=0.3)
    params = index_params(grid_params, torch.tensor(agents))
    traj = rollout(GRIDWORLD, params, tabular, theta, RandomStreams(derive_keys(7, torch.arange(2))), 100_000)
    estimate = policy_gradient(tabular, theta, traj, GAMMA)
    exact = torch.stack([evaluator.grads(theta[i])[a] for i, a in enumerate(agents)]).reshape(2, -1)
    for i in range(2):
        assert _rel(estimate[i], exact[i]) <= 0.05


def test_monte_carlo_hvp_matches_exact(tabular, grid_params, evaluator):
    theta = _theta(1, scale=0.3)
    v = _theta(1, scale=1.0, seed=3)
    params = index_params(grid_params, torch.tensor([2]))
    # The curvature estimate is far noisier than the gradient (that is the paper's point), so it
    # needs more trajectories for the same check; its error shrinks like 1/sqrt(m) (0.1 at 1e5).
    traj = rollout(GRIDWORLD, params, tabular, theta, RandomStreams(derive_keys(11, torch.arange(1))), 400_000)
    estimate = tabular.hvp(theta, traj, v, reward_to_go_weights(traj, GAMMA))
    exact = evaluator.hvps(theta[0], v[0])[2].reshape(-1)
    assert _rel(estimate[0], exact) <= 0.12


def test_exact_meta_gradient_at_large_batches_matches_exact_meta_grad(tabular, grid_params, evaluator):
    alpha = 0.5
    theta = _theta(8, scale=0.2)
    sampler = KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(3, torch.arange(8))))
    estimator = ExactMetaGradient(tabular, GAMMA, alpha, m_in=20_000, m_h=20_000, m_out=20_000, hvp_chunk=5_000)
    estimate = estimator(sampler, theta)
    exact = torch.stack([evaluator.meta_grads_per_agent(theta[i], alpha)[i] for i in range(8)]).reshape(8, -1)
    assert _rel(estimate, exact) <= 0.08
    # The first-order estimator misses the curvature term, which is visible at this α.
    first_order = FirstOrderMetaGradient(tabular, GAMMA, alpha, 20_000, 20_000)(sampler, theta)
    assert _rel(first_order, exact) > _rel(estimate, exact)


def test_alpha_zero_all_variants_agree(tabular, grid_params, evaluator):
    theta = _theta(8, scale=0.2)
    exact_dir = ExactMetaGradient(tabular, GAMMA, 0.0, 10, 10, 10)
    first_dir = FirstOrderMetaGradient(tabular, GAMMA, 0.0, 10, 10)
    s1 = KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(5, torch.arange(8))))
    s2 = KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(5, torch.arange(8))))
    # Same streams: at α = 0 the two variants use the same outer batch, hence the same direction.
    assert torch.equal(exact_dir(s1, theta), first_dir(s2, theta))
    # In expectation all three are ∇J_i (Proposition 3): check with large batches.
    s3 = KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(6, torch.arange(8))))
    big = PolicyGradient(tabular, GAMMA, 60_000)(s3, theta)
    exact = torch.stack([evaluator.grads(theta[i])[i] for i in range(8)]).reshape(8, -1)
    assert _rel(big, exact) <= 0.05
    big_f, small_f = evaluator.meta_objective(theta[0], 0.0)
    assert torch.equal(big_f, small_f)


def _small_mlp() -> MlpPolicy:
    return MlpPolicy(
        gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3), net_arch=(4,), init_std=(0.8, 0.5), init_seed=3, dtype=torch.float64
    )


def test_mlp_score_gradient_matches_finite_differences():
    policy = _small_mlp()
    theta = policy.theta.detach().clone()
    obs = torch.tensor([[0.3, -0.7]], dtype=torch.float64)
    action = torch.tensor([2])
    th = theta.clone().requires_grad_(True)
    (score,) = torch.autograd.grad(policy.log_prob(th, obs, action).sum(), th)
    eps = 1e-6
    fd = torch.zeros_like(theta)
    for k in range(theta.numel()):
        e = torch.zeros_like(theta)
        e[k] = eps
        fd[k] = (policy.log_prob(theta + e, obs, action) - policy.log_prob(theta - e, obs, action)).sum() / (2 * eps)
    assert (score - fd).abs().max() <= 1e-6


def test_autograd_hvp_matches_explicit_hessian_of_u():
    """u(ξ)v from the estimator equals (g ∇log qᵀ + ∇²ν) v built from explicit per-trajectory Hessians."""
    policy = _small_mlp()
    d = policy.n_params
    params = stack_params([ARC_NAVIGATION.make_params(goal=(0.5, 0.5), goal_radius=0.9)])
    theta = policy.theta.detach().clone().reshape(1, d)
    traj = rollout(ARC_NAVIGATION, params, policy, theta, RandomStreams(derive_keys(0, torch.arange(1))), 6)
    v = torch.randn(1, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    estimate = autograd_hvp(policy, theta, traj, v, reward_to_go_weights(traj, GAMMA))[0]
    rtg = discounted_rewards_to_go(traj.rewards, GAMMA)[0]
    explicit = torch.zeros(d, dtype=torch.float64)
    for k in range(traj.n_trajectories):
        obs, act, mask = traj.obs[0, k], traj.actions[0, k], traj.mask[0, k]

        def nu(th, obs=obs, act=act, mask=mask, k=k):
            return (policy.log_prob(th, obs, act) * mask * rtg[k]).sum()

        def log_q(th, obs=obs, act=act, mask=mask):
            return (policy.log_prob(th, obs, act) * mask).sum()

        grad_nu = torch.autograd.functional.jacobian(nu, theta[0])
        grad_log_q = torch.autograd.functional.jacobian(log_q, theta[0])
        hess_nu = torch.autograd.functional.hessian(nu, theta[0])
        u = torch.outer(grad_nu, grad_log_q) + hess_nu
        explicit += u @ v[0]
    explicit /= traj.n_trajectories
    assert torch.allclose(estimate, explicit, atol=1e-10)
    assert explicit.abs().max() > 1e-6


def test_hvp_chunking_is_exact(tabular, grid_params):
    theta = _theta(8)
    make = lambda: KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(9, torch.arange(8))))  # noqa: E731
    v = _theta(8, seed=2)
    whole = ExactMetaGradient(tabular, GAMMA, 1.0, 5, 300, 5, hvp_chunk=1000).curvature(make(), theta, v)
    chunked = ExactMetaGradient(tabular, GAMMA, 1.0, 5, 300, 5, hvp_chunk=64).curvature(make(), theta, v)
    assert torch.allclose(whole, chunked, atol=1e-12)


def test_rollout_rows_are_independent_of_the_batch(tabular, grid_params):
    theta = _theta(8)
    full = rollout(GRIDWORLD, grid_params, tabular, theta, RandomStreams(derive_keys(4, torch.arange(8))), 5)
    keys = derive_keys(4, torch.arange(8))[3:4]
    alone = rollout(GRIDWORLD, index_params(grid_params, torch.tensor([3])), tabular, theta[3:4], RandomStreams(keys), 5)
    for a, b in zip(full, alone):
        assert torch.equal(a[3], b[0])


def test_trajectories_shape_and_reward_timing(tabular, grid_params):
    theta = torch.zeros(8, 100, dtype=torch.float64)
    traj = rollout(GRIDWORLD, grid_params, tabular, theta, RandomStreams(derive_keys(0, torch.arange(8))), 3)
    assert isinstance(traj, Trajectories)
    assert traj.obs.shape == (8, 3, 16) and traj.rewards.shape == (8, 3, 16)
    goal = grid_params.goal_index.reshape(8, 1, 1)
    assert torch.equal(traj.rewards, (traj.obs == goal).to(traj.rewards.dtype))


def test_gaussian_log_std_is_clamped_to_its_bounds():
    """A runaway log-σ parameter (Pendulum under MFPO reached 64, then NaN) acts as the bound: finite
    log-probabilities, no gradient pushing it further; inside the bounds nothing changes."""
    box = gym.spaces.Box(-1.0, 1.0, (3,))
    action_space = gym.spaces.Box(-2.0, 2.0, (1,))
    policy = MlpPolicy(box, action_space, net_arch=(4,), dtype=torch.float64)
    unbounded = MlpPolicy(box, action_space, net_arch=(4,), dtype=torch.float64, log_std_bounds=None)
    obs = torch.randn(5, 3, dtype=torch.float64)
    actions = torch.randn(5, 1, dtype=torch.float64)
    theta = policy.initial_parameters().clone()
    theta[-1] = 0.7
    assert torch.equal(policy.log_prob(theta, obs, actions), unbounded.log_prob(theta, obs, actions))
    for raw, bound in ((64.0, 2.0), (-80.0, -20.0)):
        theta[-1] = raw
        theta.requires_grad_(True)
        logp = policy.log_prob(theta, obs, actions)
        assert torch.isfinite(logp).all() and float(policy.log_std(theta.detach())) == bound
        (grad,) = torch.autograd.grad(logp.sum(), theta)
        assert grad[-1] == 0 and torch.isfinite(grad).all()
        theta = theta.detach()
    theta[-1] = -400.0  # exp(400)² overflows float64
    assert not torch.isfinite(unbounded.log_prob(theta, obs, actions)).all()
    assert torch.isfinite(policy.log_prob(theta, obs, actions)).all()
    with pytest.raises(ValueError, match="log_std_bounds"):
        MlpPolicy(box, action_space, log_std_bounds=(2.0, -20.0))
    with pytest.raises(ValueError, match="log_std_bounds"):
        MlpPolicy(box, action_space, log_std_bounds=(-float("inf"), 2.0))
    with pytest.raises(ValueError, match="log_std_init"):
        MlpPolicy(box, action_space, log_std_init=5.0)  # would start with a zero gradient
