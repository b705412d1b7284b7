"""GPOMDP/REINFORCE with baselines, importance weights and early-stopping rollouts, against known answers."""

from __future__ import annotations

import math

import pytest
import torch

from fedrl_algos.core import KernelSampler, Trajectories, policy_gradient, rollout
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.core.gpomdp import (
    ScoreFunctionGradient,
    gpomdp,
    gpomdp_weights,
    importance_weights,
    log_importance_weights,
    paired_gradients,
    reinforce,
    reinforce_weights,
    score_gradient,
    time_baseline,
)
from fedrl_algos.policies import MlpPolicy
from fedrl_envs import ARC_NAVIGATION, CARTPOLE, GRIDWORLD, RandomStreams, derive_keys, index_params, stack_params

GAMMA = 0.9


def _theta(n: int, scale: float = 0.3, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 100, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


def _tiny_traj() -> Trajectories:
    # One row, 3 trajectories of 3 steps; the third terminates after its first step.
    rewards = torch.tensor([[[1.0, 0.0, 2.0], [0.0, 1.0, 1.0], [3.0, 0.0, 0.0]]], dtype=torch.float64)
    mask = torch.tensor([[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)
    return Trajectories(torch.zeros(1, 3, 3, dtype=torch.long), torch.zeros(1, 3, 3, dtype=torch.long), rewards * mask, mask)


def test_baselines_by_hand():
    traj = _tiny_traj()
    rtg = torch.tensor([[[1 + 2 * 0.81, 2 * 0.81, 2 * 0.81], [0.9 + 0.81, 0.9 + 0.81, 0.81], [3.0, 0.0, 0.0]]], dtype=torch.float64)
    psi = gpomdp_weights(traj, GAMMA, None)
    assert torch.allclose(psi, rtg * traj.mask)
    loo = time_baseline(rtg, traj.mask, "loo")
    # h = 0: every trajectory runs; leave-one-out means of the other two.
    assert torch.allclose(loo[0, :, 0], torch.tensor([(1.71 + 3.0) / 2, (2.62 + 3.0) / 2, (2.62 + 1.71) / 2], dtype=torch.float64))
    # h = 1: only trajectories 0 and 1 run, so each one's baseline is the other's reward-to-go.
    assert torch.allclose(loo[0, :2, 1], torch.tensor([rtg[0, 1, 1], rtg[0, 0, 1]]))
    mean = time_baseline(rtg, traj.mask, "mean")
    assert torch.allclose(mean[0, :, 1], torch.full((3,), (rtg[0, 0, 1] + rtg[0, 1, 1]).item() / 2, dtype=torch.float64))
    psi_loo = gpomdp_weights(traj, GAMMA, "loo")
    assert psi_loo[0, 2, 1:].abs().sum() == 0  # nothing after termination
    ret = rtg[..., 0]
    expected = (ret - torch.tensor([[(ret[0, 1] + ret[0, 2]) / 2, (ret[0, 0] + ret[0, 2]) / 2, (ret[0, 0] + ret[0, 1]) / 2]])).unsqueeze(-1) * traj.mask
    assert torch.allclose(reinforce_weights(traj, GAMMA, "loo"), expected)
    with pytest.raises(ValueError, match="baseline"):
        time_baseline(rtg, traj.mask, "median")


def test_gpomdp_without_baseline_is_policy_gradient(tabular, grid_params):
    theta = _theta(8)
    traj = rollout(GRIDWORLD, grid_params, tabular, theta, RandomStreams(derive_keys(1, torch.arange(8))), 64)
    assert torch.allclose(gpomdp(tabular, theta, traj, GAMMA, None), policy_gradient(tabular, theta, traj, GAMMA), atol=1e-12)
    # Per-trajectory terms average to the estimate (one autograd call, a copy of θ per trajectory).
    psi = gpomdp_weights(traj, GAMMA, "loo")
    per = score_gradient(tabular, theta, traj, psi, per_trajectory=True)
    assert per.shape == (8, 64, 100)
    assert torch.allclose(per.mean(-2), score_gradient(tabular, theta, traj, psi), atol=1e-12)


def test_mlp_estimators_batched_over_runs_and_agents():
    space = ARC_NAVIGATION.observation_space(ARC_NAVIGATION.train_tasks[0])
    policy = MlpPolicy(space, ARC_NAVIGATION.action_space(ARC_NAVIGATION.train_tasks[0]), dtype=torch.float64)
    params = index_params(stack_params(ARC_NAVIGATION.train_tasks), torch.arange(6).repeat(2))
    theta = policy.theta.detach().expand(2, 6, -1).clone()
    traj = rollout(ARC_NAVIGATION, params, policy, theta, RandomStreams(derive_keys(0, torch.arange(12)).reshape(2, 6)), 5)
    for fn in (gpomdp, reinforce):
        batched = fn(policy, theta, traj, GAMMA)
        assert batched.shape == (2, 6, policy.n_params)
        one = fn(policy, theta[1, 4], Trajectories(*(x[1, 4] for x in traj)), GAMMA)
        assert torch.allclose(batched[1, 4], one, atol=1e-12)


def test_estimators_match_exact_gradient_at_large_batches(tabular, grid_params):
    """Every variant is unbiased: REINFORCE and GPOMDP without baseline have the same expectation ∇J."""
    evaluator = TabularEvaluator("fedrl/GridWorld-v0", gamma=GAMMA)
    agents = [0, 3]
    theta = _theta(2)
    traj = rollout(GRIDWORLD, index_params(grid_params, torch.tensor(agents)), tabular, theta, RandomStreams(derive_keys(7, torch.arange(2))), 40_000)
    exact = torch.stack([evaluator.grads(theta[i])[a] for i, a in enumerate(agents)]).reshape(2, -1)
    errors = {}
    for name, fn in (("gpomdp", gpomdp), ("reinforce", reinforce)):
        for baseline in ("loo", None):
            errors[name, baseline] = _rel(fn(tabular, theta, traj, GAMMA, baseline), exact)
            assert (errors[name, baseline] < 0.08).all(), (name, baseline, errors[name, baseline])
    # The reward-to-go form has the lower variance of the two.
    assert errors["gpomdp", "loo"].mean() < errors["reinforce", "loo"].mean()


def test_importance_weights_in_log_space():
    log_w = torch.tensor([[0.0, math.log(2.0), 200.0, -200.0]], dtype=torch.float32)
    w, clipped = importance_weights(log_w)
    assert torch.isfinite(w).all() and w[0, 0] == 1.0 and torch.isclose(w[0, 1], torch.tensor(2.0))
    assert w[0, 3] == 0.0 and clipped.tolist() == [[False, False, True, False]]
    w, clipped = importance_weights(log_w, max_weight=5.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 5.0, 0.0]])) and clipped.tolist() == [[False, False, True, False]]
    w, _ = importance_weights(log_w, self_normalize=True)
    assert torch.isfinite(w).all() and torch.isclose(w.mean(), torch.tensor(1.0))
    assert torch.isclose(w[0, 2], torch.tensor(4.0))  # all the mass on the huge weight


def test_paired_gradients_equal_separate_computations(tabular, grid_params):
    theta = _theta(8)
    theta_prev = theta + _theta(8, scale=0.1, seed=3)
    traj = rollout(GRIDWORLD, grid_params, tabular, theta, RandomStreams(derive_keys(2, torch.arange(8))), 32)
    psi = gpomdp_weights(traj, GAMMA, "loo")
    g, g_prev, w, clipped = paired_gradients(tabular, theta, theta_prev, traj, psi)
    assert torch.allclose(g, score_gradient(tabular, theta, traj, psi), atol=1e-12)
    expected_w = torch.exp(log_importance_weights(tabular, theta_prev, theta, traj))
    assert torch.allclose(w, expected_w) and not clipped.any()
    assert torch.allclose(g_prev, score_gradient(tabular, theta_prev, traj, psi, traj_weights=expected_w), atol=1e-12)
    # The same parameters: every weight is 1 and the two estimates coincide.
    g, g_same, w, _ = paired_gradients(tabular, theta, theta, traj, psi)
    assert torch.equal(w, torch.ones_like(w)) and torch.allclose(g, g_same, atol=1e-12)


def test_importance_weighted_gradient_estimates_the_other_policys_gradient(tabular, grid_params):
    """``E_θ[w·g(θ'; τ)] = ∇J(θ')`` for trajectories drawn with θ (the correction term of eq. 3)."""
    evaluator = TabularEvaluator("fedrl/GridWorld-v0", gamma=GAMMA)
    theta = _theta(1)
    theta_prev = theta + _theta(1, scale=0.05, seed=4)
    traj = rollout(GRIDWORLD, index_params(grid_params, torch.tensor([2])), tabular, theta, RandomStreams(derive_keys(5, torch.arange(1))), 40_000)
    psi = gpomdp_weights(traj, GAMMA, "loo")
    _, g_prev, w, _ = paired_gradients(tabular, theta, theta_prev, traj, psi)
    assert abs(float(w.mean()) - 1.0) < 0.01  # E[w] = 1
    exact_prev = evaluator.grads(theta_prev[0])[2].reshape(1, -1)
    exact_here = evaluator.grads(theta[0])[2].reshape(1, -1)
    assert _rel(g_prev, exact_prev) < 0.08
    assert _rel(g_prev, exact_prev) < _rel(g_prev, exact_here)


def test_score_function_gradient_strategy(tabular, grid_params):
    sampler = KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(9, torch.arange(8))))
    twin = KernelSampler(GRIDWORLD, grid_params, tabular, RandomStreams(derive_keys(9, torch.arange(8))))
    estimator = ScoreFunctionGradient(tabular, GAMMA, 12, "reinforce", "mean")
    theta = _theta(8)
    assert estimator.trajectories_per_step == 12
    traj = twin(theta, 12)
    assert torch.allclose(estimator(sampler, theta), score_gradient(tabular, theta, traj, reinforce_weights(traj, GAMMA, "mean")))
    with pytest.raises(ValueError, match="estimator"):
        ScoreFunctionGradient(tabular, GAMMA, 12, "a2c")


def test_rollout_stop_when_done_is_a_prefix_and_keeps_streams_aligned():
    task = CARTPOLE.train_tasks[0]
    policy = MlpPolicy(CARTPOLE.observation_space(task), CARTPOLE.action_space(task))
    params = stack_params(CARTPOLE.train_tasks[:3])
    theta = policy.theta.detach().expand(3, -1)
    full_streams = RandomStreams(derive_keys(3, torch.arange(3)))
    short_streams = RandomStreams(derive_keys(3, torch.arange(3)))
    full = rollout(CARTPOLE, params, policy, theta, full_streams, 4)
    short = rollout(CARTPOLE, params, policy, theta, short_streams, 4, stop_when_done=True)
    steps = short.mask.shape[-1]
    assert steps < full.mask.shape[-1] == 500  # a random policy drops the pole long before 500 steps
    assert full.mask[..., steps:].sum() == 0
    for a, b in zip(full, short):
        assert torch.equal(a[:, :, :steps], b)
    assert torch.equal(full_streams.counters, short_streams.counters)
    # The next batch is identical too.
    assert torch.equal(rollout(CARTPOLE, params, policy, theta, full_streams, 2).actions[..., :5],
                       rollout(CARTPOLE, params, policy, theta, short_streams, 2, stop_when_done=True).actions[..., :5])
