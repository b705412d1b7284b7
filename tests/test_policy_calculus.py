"""Policies own their calculus: the core calls the policy's methods, whose defaults are autograd.

* a user's own policy that only defines ``log_prob``/``sample`` (no closed form) trains with every
  estimator through the autograd defaults, and those defaults agree with finite differences;
* the closed forms of ``TabularPolicy`` and the paper's softmax ``MlpPolicy`` equal the autograd
  defaults for arbitrary step weights (not only the reward-to-go of eq. (2));
* the core reaches a policy's closed form through the policy, never by its type: an override is
  what ``policy_gradient``/``hessian_vector_product`` return;
* a sampler acting with a wrapped policy (a Byzantine agent's random actions) does not take the
  wrapped policy's fast rollout.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from fedrl_algos import PerFedAvgPG
from fedrl_algos.core import (
    KernelSampler,
    autograd_hvp,
    autograd_score_gradient,
    hessian_vector_product,
    policy_gradient,
)
from fedrl_algos.core.attacks import RandomActionPolicy
from fedrl_algos.core.estimators import masked_log_prob
from fedrl_algos.policies import CategoricalMixin, FlatPolicy, MlpPolicy, TabularPolicy
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, RandomStreams, derive_keys, stack_params

GAMMA = 0.9


class LinearSoftmaxPolicy(CategoricalMixin, FlatPolicy):
    """A policy fedrl has never seen: logits linear in the 2-D position (no closed forms)."""

    def __init__(self, observation_space, action_space, dtype=torch.float64) -> None:
        self.n_in, self.n_actions = int(observation_space.shape[0]), int(action_space.n)
        super().__init__(observation_space, action_space, dtype)

    @property
    def n_params(self) -> int:
        return (self.n_in + 1) * self.n_actions

    def initial_parameters(self) -> torch.Tensor:
        return torch.zeros(self.n_params, dtype=self.param_dtype)

    def logits(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        batch = theta.shape[:-1]
        w = theta[..., : self.n_in * self.n_actions].reshape(*batch, self.n_in, self.n_actions)
        b = theta[..., self.n_in * self.n_actions :]
        x = obs.to(theta.dtype).reshape(*batch, -1, self.n_in)
        return (x @ w + b.unsqueeze(-2)).reshape(*obs.shape[:-1], self.n_actions)


def _arc_batch(policy, m: int = 6, seed: int = 0):
    params = stack_params(ARC_NAVIGATION.train_tasks[:3])
    sampler = KernelSampler(ARC_NAVIGATION, params, policy, RandomStreams(derive_keys(seed, torch.arange(3))))
    theta = torch.randn(3, policy.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 0.3
    return theta, sampler(theta, m)


def test_a_users_policy_trains_through_the_autograd_defaults():
    one = ARC_NAVIGATION.train_tasks[0]
    obs_space, act_space = ARC_NAVIGATION.observation_space(one), ARC_NAVIGATION.action_space(one)
    policy = LinearSoftmaxPolicy(obs_space, act_space)
    assert policy.kernel_rollout_plan(ARC_NAVIGATION, stack_params([one])) is None
    for variant in ("exact", "first_order"):
        model = PerFedAvgPG(LinearSoftmaxPolicy, "fedrl/ArcNavigation-v0", variant=variant, local_steps=1, m_in=4, m_h=4,
                            m_out=4, seed=0, device="cpu")
        before = model.theta
        model.learn(total_rounds=2)
        assert model.theta.shape == (policy.n_params,) and not torch.equal(model.theta, before) and torch.isfinite(model.theta).all()


def test_autograd_defaults_against_finite_differences():
    """∇ of the surrogate ``Σ ψ log π`` and the HVP of eq. (3) at the sampled θ, by central differences."""
    one = ARC_NAVIGATION.train_tasks[0]
    policy = LinearSoftmaxPolicy(ARC_NAVIGATION.observation_space(one), ARC_NAVIGATION.action_space(one))
    theta, traj = _arc_batch(policy)
    psi = torch.rand(traj.mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * traj.mask
    v = torch.randn_like(theta)

    def surrogate(th: torch.Tensor) -> torch.Tensor:  # [3]
        return (masked_log_prob(policy, th, traj) * psi).sum((-1, -2)) / traj.n_trajectories

    eps = 1e-6
    fd = torch.stack([(surrogate(theta + eps * e) - surrogate(theta - eps * e)) / (2 * eps) for e in torch.eye(theta.shape[-1], dtype=theta.dtype)], -1)
    assert torch.allclose(policy.score_gradient(theta, traj, psi), fd, atol=1e-8)

    # u(ξ)v = g(ξ)(∇log q(ξ)ᵀv) + ∇²ν(ξ)v with g(ξ) = ∇ν(ξ): both directional derivatives along v
    # by central differences (of log q, and of the per-trajectory g)
    def per_trajectory_g(th: torch.Tensor) -> torch.Tensor:  # [3, m, d]
        return autograd_score_gradient(policy, th, traj, psi, per_trajectory=True)

    def log_q(th: torch.Tensor) -> torch.Tensor:  # [3, m]
        return masked_log_prob(policy, th, traj).sum(-1)

    directional_logq = (log_q(theta + eps * v) - log_q(theta - eps * v)) / (2 * eps)
    second = (per_trajectory_g(theta + eps * v) - per_trajectory_g(theta - eps * v)) / (2 * eps)
    expected = (per_trajectory_g(theta) * directional_logq.unsqueeze(-1) + second).mean(-2)
    assert torch.allclose(policy.hvp(theta, traj, v, psi), expected, atol=1e-7)


@pytest.mark.parametrize("make", ["tabular", "mlp"])
def test_closed_forms_equal_the_autograd_defaults_for_any_weights(make):
    if make == "tabular":
        policy = TabularPolicy(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)
        family, params = GRIDWORLD, stack_params(GRIDWORLD.train_tasks[:3])
    else:
        one = ARC_NAVIGATION.train_tasks[0]
        policy = MlpPolicy(ARC_NAVIGATION.observation_space(one), ARC_NAVIGATION.action_space(one), dtype=torch.float64)
        family, params = ARC_NAVIGATION, stack_params(ARC_NAVIGATION.train_tasks[:3])
    sampler = KernelSampler(family, params, policy, RandomStreams(derive_keys(2, torch.arange(3))))
    theta = torch.randn(3, policy.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5
    traj = sampler(theta, 8)
    psi = torch.randn(traj.mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * traj.mask  # signed, as with a baseline
    v = torch.randn_like(theta)
    assert torch.allclose(policy.score_gradient(theta, traj, psi), autograd_score_gradient(policy, theta, traj, psi), atol=1e-12)
    assert torch.allclose(policy.hvp(theta, traj, v, psi), autograd_hvp(policy, theta, traj, v, psi), atol=1e-10)


def test_the_core_reaches_closed_forms_through_the_policy():
    class Marked(TabularPolicy):
        def score_gradient(self, theta, traj, weights):
            return torch.full_like(theta, 7.0)

        def hvp(self, theta, traj, v, weights):
            return torch.full_like(theta, -3.0)

    policy = Marked(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)
    sampler = KernelSampler(GRIDWORLD, stack_params(GRIDWORLD.train_tasks[:2]), policy, RandomStreams(derive_keys(0, torch.arange(2))))
    theta = torch.zeros(2, 100, dtype=torch.float64)
    traj = sampler(theta, 3)
    assert torch.equal(policy_gradient(policy, theta, traj, GAMMA), torch.full_like(theta, 7.0))
    assert torch.equal(hessian_vector_product(policy, theta, traj, theta, GAMMA), torch.full_like(theta, -3.0))
    # closed_form=False bypasses the policy for checks
    assert not torch.equal(policy_gradient(policy, theta, traj, GAMMA, closed_form=False), torch.full_like(theta, 7.0))


def test_a_wrapped_policy_does_not_take_the_wrapped_fast_rollout():
    policy = TabularPolicy(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)
    params = stack_params(GRIDWORLD.train_tasks[:2])
    assert policy.kernel_rollout_plan(GRIDWORLD, params) is not None
    everyone = torch.ones(2, 1, dtype=torch.bool)
    wrapped = RandomActionPolicy(policy, everyone)
    assert wrapped.kernel_rollout_plan(GRIDWORLD, params) is None
    # A deterministic policy (huge logit on action 0) acting at random: actions are not all 0.
    theta = torch.zeros(2, 100, dtype=torch.float64)
    theta.view(2, 25, 4)[..., 0] = 50.0
    honest = KernelSampler(GRIDWORLD, params, policy, RandomStreams(derive_keys(0, torch.arange(2))))
    attacked = honest.with_policy(wrapped)
    assert bool((honest(theta, 4).actions == 0).all())
    assert not bool((attacked(theta, 4).actions == 0).all())
