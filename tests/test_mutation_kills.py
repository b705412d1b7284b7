"""Tests that kill the mutants the mutation-testing run (docs/testing.md) found alive.

Each test pins a behaviour no other fast test checked: a code path (``closed_form=False``, per-trajectory
weights), a dtype, or what happens after termination. They assert on values, against closed forms or
against an independent computation of the same quantity.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrl_algos.core import (
    Trajectories,
    autograd_hvp,
    autograd_score_gradient,
    discounted_rewards_to_go,
    hessian_vector_product,
    masked_log_prob,
    reward_to_go_weights,
    rollout,
)
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.fedpg_br import byzantine_filter, filter_threshold, filtered_mean, geometric_inner_steps
from fedrl_algos.fedpg_br.update import _median_ball
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, stack_params

GAMMA = 0.9


@pytest.fixture(scope="module")
def grid_traj(tabular):
    """3 agents x 5 trajectories x 40 steps (m != T != B, so a wrong broadcast cannot pass)."""
    theta = torch.randn(3, 100, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.5
    params = stack_params(GRIDWORLD.train_tasks[:3])
    traj = rollout(GRIDWORLD, params, tabular, theta, RandomStreams(derive_keys(1, torch.arange(3))), 5)
    return theta, traj


def _hand_traj() -> Trajectories:
    """One agent, two trajectories of 4 steps; the second terminates after step 1 (mask 1, 1, 0, 0)."""
    obs = torch.tensor([[[0, 1, 2, 3], [4, 5, 6, 7]]])
    actions = torch.tensor([[[0, 1, 2, 3], [3, 2, 1, 0]]])
    rewards = torch.tensor([[[1.0, 0.0, 2.0, -1.0], [0.5, 3.0, 0.0, 0.0]]], dtype=torch.float64)
    mask = torch.tensor([[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]], dtype=torch.float64)
    return Trajectories(obs, actions, rewards, mask)


def test_rewards_to_go_are_computed_in_the_rewards_dtype():
    # γ^t in float32 is off by ~1e-8 relative; float64 rewards must get float64 discounts.
    rewards = torch.ones(1, 60, dtype=torch.float64)
    expected = torch.tensor([sum(GAMMA**t for t in range(h, 60)) for h in range(60)], dtype=torch.float64)
    out = discounted_rewards_to_go(rewards, GAMMA)
    assert out.dtype == torch.float64
    assert torch.allclose(out[0], expected, rtol=1e-14, atol=0.0)


def test_masked_log_prob_is_zero_after_termination_and_log_pi_before(tabular):
    traj = _hand_traj()
    theta = torch.randn(1, 100, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    logp = masked_log_prob(tabular, theta, traj)
    log_pi = torch.log_softmax(theta[0].reshape(25, 4), -1)
    expected = log_pi[traj.obs[0], traj.actions[0]] * traj.mask[0]
    assert torch.equal(logp[0, 1, 2:], torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(logp[0], expected, atol=1e-15)
    assert (logp[0, 0] < 0).all()  # log π < 0 everywhere: the zeros above are the mask's


def test_reward_to_go_weights_are_zero_after_termination():
    traj = _hand_traj()
    w = reward_to_go_weights(traj, GAMMA)
    assert torch.isfinite(w).all()
    # Absolute discounting: R^h = Σ_{t ≥ h} γ^t r_t, then masked.
    assert torch.allclose(w[0, 1], torch.tensor([0.5 + 3 * GAMMA, 3 * GAMMA, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(w[0, 0, 3], torch.tensor(-(GAMMA**3), dtype=torch.float64))


def test_autograd_score_gradient_trajectory_weights(tabular, grid_traj):
    theta, traj = grid_traj
    weights = reward_to_go_weights(traj, GAMMA)
    c = torch.linspace(0.5, 3.0, 15, dtype=torch.float64).reshape(3, 5)
    weighted = autograd_score_gradient(tabular, theta, traj, weights, traj_weights=c)
    # c_j multiplies every step weight of trajectory j: same as scaling ψ by hand.
    by_hand = autograd_score_gradient(tabular, theta, traj, weights * c.unsqueeze(-1))
    assert torch.allclose(weighted, by_hand, atol=1e-13)
    assert not torch.allclose(weighted, autograd_score_gradient(tabular, theta, traj, weights), atol=1e-6)
    per = autograd_score_gradient(tabular, theta, traj, weights, traj_weights=c, per_trajectory=True)
    assert per.shape == (3, 5, 100)
    assert torch.allclose(per.mean(-2), weighted, atol=1e-13)


def test_hessian_vector_product_autograd_path_equals_closed_form(tabular, grid_traj):
    theta, traj = grid_traj
    v = torch.randn(3, 100, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    closed = hessian_vector_product(tabular, theta, traj, v, GAMMA)
    auto = hessian_vector_product(tabular, theta, traj, v, GAMMA, closed_form=False)
    assert closed.abs().max() > 1e-3
    assert torch.allclose(auto, closed, atol=1e-12)


def test_autograd_hvp_casts_the_direction_to_theta_dtype(tabular, grid_traj):
    theta, traj = grid_traj
    v = torch.randn(3, 100, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    weights = reward_to_go_weights(traj, GAMMA)
    v32 = v.float()
    out = autograd_hvp(tabular, theta, traj, v32, weights)
    assert out.dtype == torch.float64
    assert torch.allclose(out, autograd_hvp(tabular, theta, traj, v32.double(), weights), atol=1e-13)


# --- the FedPG-BR filter (Algorithm 1.1) ------------------------------------------------------
def _reference_pass(g: list[list[float]], radius: float) -> list[bool]:
    """One filtering pass written from the paper with Python floats, agent by agent."""
    n = len(g)

    def dist(a, b):
        return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))

    s = [i for i in range(n) if sum(dist(g[i], g[j]) <= radius for j in range(n)) > n / 2]
    if not s:
        return [False] * n
    mean = [sum(g[i][k] for i in s) / len(s) for k in range(len(g[0]))]
    mom = min(s, key=lambda i: dist(g[i], mean))  # first index on a tie, as argmin
    return [dist(g[j], g[mom]) <= radius for j in range(n)]


def _reference_filter(grads, sigma, delta, batch_size, alpha):
    kept, fallback = [], []
    for r in range(grads.shape[0]):
        g = grads[r].double().tolist()
        n = len(g)
        t = 2 * sigma[r] * math.sqrt(2 * math.log(2 * n / delta) / batch_size[r])
        first = _reference_pass(g, t)
        fb = sum(first) < (1 - alpha) * n
        kept.append(_reference_pass(g, 2 * sigma[r]) if fb else first)
        fallback.append(fb)
    return torch.tensor(kept), torch.tensor(fallback)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_byzantine_filter_equals_a_reference_implementation(dtype):
    """Six runs with their own σ and B_t: clean, outliers, fallback, and no majority at all."""
    g = torch.Generator().manual_seed(3)
    n, d = 9, 6
    centre = torch.randn(6, 1, d, generator=g, dtype=torch.float64) * 3
    spread = torch.tensor([0.05, 0.05, 0.6, 0.6, 5.0, 0.05], dtype=torch.float64).reshape(6, 1, 1)
    grads = centre + torch.randn(6, n, d, generator=g, dtype=torch.float64) * spread
    grads[1, [0, 4]] += 40.0  # two outliers far out
    grads[3, 8] *= -3.0  # a sign flipper
    grads[5, :4] += 0.5  # a second cluster of 4 next to the 5 others
    grads = grads.to(dtype)
    sigma = [1.0, 1.0, 1.5, 1.5, 1.0, 0.4]
    batch = [16, 9, 64, 16, 16, 30]
    result = byzantine_filter(grads, torch.tensor(sigma), 0.6, torch.tensor(batch), 0.3)
    kept, fallback = _reference_filter(grads, sigma, 0.6, batch, 0.3)
    assert torch.equal(result.kept, kept)
    assert torch.equal(result.fallback, fallback)
    assert torch.allclose(result.threshold, filter_threshold(torch.tensor(sigma), 0.6, n, torch.tensor(batch)))
    # The cases above really differ: some runs keep all, some drop agents, some fall back, one keeps none.
    counts = kept.sum(-1).tolist()
    assert max(counts) == n and 0 < min(c for c in counts if c) < n and 0 in counts
    assert fallback.any() and not fallback.all()


def test_filter_radius_and_majority_boundaries():
    """Distances exactly equal to the radius count as inside; exactly K/2 neighbours is no majority."""
    # Points on a line at 0, 1, 10 (exact distances): radius 1 -> agents 0 and 1 see 2 > 3/2 agents.
    line = torch.tensor([[[0.0], [1.0], [10.0]]], dtype=torch.float64)
    dist = torch.cdist(line, line)
    assert torch.equal(_median_ball(line, dist, torch.tensor([1.0], dtype=torch.float64)), torch.tensor([[True, True, False]]))
    # Two pairs far apart: every agent has exactly 2 = K/2 within the radius, so S is empty.
    pairs = torch.tensor([[[0.0], [1.0], [10.0], [11.0]]], dtype=torch.float64)
    assert not _median_ball(pairs, torch.cdist(pairs, pairs), torch.tensor([1.0], dtype=torch.float64)).any()
    # Through the filter: B_t huge makes T_μ tiny, the first pass keeps nobody, the fallback
    # radius 2σ = 1 is exactly the distance from the median to the agent at 1.
    result = byzantine_filter(line, 0.5, 0.6, 1e12, 0.0)
    assert result.fallback.all() and torch.equal(result.kept, torch.tensor([[True, True, False]]))


def test_filter_medoid_is_the_member_of_s_closest_to_its_mean():
    # Radius 2.5, K = 7: S = {0, 1, 1.4, 2.5} (4 > 7/2 neighbours each; 3.6 has only 3). The mean of S
    # is 1.225, closest to 1.4, and 3.6 is within 2.5 of 1.4: kept. A median at 0 or 1 would drop it.
    pts = torch.tensor([[[0.0], [1.0], [1.4], [2.5], [3.6], [30.0], [40.0]]], dtype=torch.float64)
    radius = torch.tensor([2.5], dtype=torch.float64)
    kept = _median_ball(pts, torch.cdist(pts, pts), radius)
    assert torch.equal(kept[0], torch.tensor(_reference_pass(pts[0].tolist(), 2.5)))
    assert kept[0].tolist() == [True, True, True, True, True, False, False]


def test_fallback_only_below_one_minus_alpha_times_k():
    """Exactly (1 − α)K agents kept by the first pass is enough: no fallback."""
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(1, 8, 4, generator=g, dtype=torch.float64) * 0.01
    grads[0, 6:] += torch.tensor([0.0, 0.0, 0.0, 1.2], dtype=torch.float64)  # within 2σ = 2, beyond T_μ
    threshold = float(filter_threshold(1.0, 0.6, 8, 1000))
    assert threshold < 1.0
    result = byzantine_filter(grads, 1.0, 0.6, 1000, 0.25)  # (1 − 0.25) * 8 = 6 = kept
    assert not result.fallback.any() and int(result.kept.sum()) == 6
    result = byzantine_filter(grads, 1.0, 0.6, 1000, 0.2)  # needs 6.4: falls back, 2σ keeps all 8
    assert result.fallback.all() and result.kept.all()


def test_filter_threshold_is_float64_exact():
    v = 2 * math.log(2 * 7 / 0.3)
    out = filter_threshold(0.3, 0.3, 7, 13)
    assert out.dtype == torch.float64
    assert math.isclose(float(out), 2 * 0.3 * math.sqrt(v / 13), rel_tol=1e-15)


def test_filtered_mean_weights_only_the_kept_rows():
    grads = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]], [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]]], dtype=torch.float64)
    kept = torch.tensor([[True, True, False], [False, False, True]])
    assert torch.equal(filtered_mean(grads, kept), torch.tensor([[2.0, 3.0], [9.0, 10.0]], dtype=torch.float64))


def test_geometric_inner_steps_by_inversion():
    # γ = B/(B + b) = 0.75; N = 1 + floor(log(1 − u)/log γ): P(N > k) = γ^k, so the boundaries are
    # u = 1 − γ^k (exactly there N jumps to k + 1).
    gamma = 12 / 16
    u = torch.tensor([0.0, 0.2, 1 - gamma - 1e-9, 1 - gamma + 1e-9, 1 - gamma**2 + 1e-9, 0.999], dtype=torch.float64)
    steps = geometric_inner_steps(u, 12, 4)
    expected = [1 + math.floor(math.log1p(-float(x)) / math.log(gamma)) for x in u.double()]
    assert steps.dtype == torch.int64 and steps.tolist() == expected
    assert expected[:5] == [1, 1, 1, 2, 3]
    # A tensor of batch sizes (one per run).
    per_run = geometric_inner_steps(torch.tensor([0.5, 0.5]), torch.tensor([4, 400]), 4)
    assert per_run.tolist() == [1 + math.floor(math.log(0.5) / math.log(g)) for g in (0.5, 400 / 404)]



def test_filter_with_a_single_member_of_s():
    # K = 5, radius 1: only the agent at 0 sees 3 > 5/2 agents (-1, 0, 1); S = {0} still defines the
    # median, and the agents within 1 of it are kept.
    pts = torch.tensor([[[-1.0], [0.0], [1.0], [50.0], [90.0]]], dtype=torch.float64)
    kept = _median_ball(pts, torch.cdist(pts, pts), torch.tensor([1.0], dtype=torch.float64))
    assert kept[0].tolist() == [True, True, True, False, False]


def test_filter_distances_are_exact_for_many_agents():
    # 30 agents (more than 25, where cdist would switch to the |a|² + |b|² − 2ab matrix product,
    # whose cancellation errors at gradients of norm ~1e3 reach ~1e-4): 16 of them within 1e-8 of
    # each other form the majority for a radius of 1e-6, the 14 others are 10 apart.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 1, 50, generator=g, dtype=torch.float64) * 1000
    grads = base + torch.randn(1, 30, 50, generator=g, dtype=torch.float64) * 1e-10
    grads[0, 16:] += torch.arange(1, 15, dtype=torch.float64).reshape(14, 1) * 10.0
    sigma = 1e-6 / float(filter_threshold(1.0, 0.6, 30, 16))  # T_μ = 1e-6
    result = byzantine_filter(grads, sigma, 0.6, 16, 0.48)  # 16 >= (1 - 0.48) * 30 = 15.6
    assert not result.fallback.any()
    assert result.kept[0].tolist() == [True] * 16 + [False] * 14


def test_filter_with_two_batch_axes_equals_each_run_alone():
    """Runs ``[2, 3]`` (e.g. seeds x configurations): every run is filtered on its own."""
    g = torch.Generator().manual_seed(5)
    n, d = 7, 3  # n differs from both batch sizes, so a reduction over a wrong axis cannot pass
    spread = torch.tensor([[0.05, 0.6, 5.0], [0.6, 0.05, 0.6]], dtype=torch.float64).reshape(2, 3, 1, 1)
    grads = torch.randn(2, 3, 1, d, generator=g, dtype=torch.float64) + torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) * spread
    grads[0, 1, 3] += 30.0
    grads[1, 0, :3] += 0.8
    sigma = torch.tensor([[1.0, 1.5, 1.0], [0.5, 1.0, 1.2]], dtype=torch.float64)
    batch = torch.tensor([[16, 40, 16], [8, 16, 64]])
    result = byzantine_filter(grads, sigma, 0.6, batch, 0.3)
    assert result.kept.shape == (2, 3, n) and result.fallback.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            alone = byzantine_filter(grads[i, j].unsqueeze(0), sigma[i, j].reshape(1), 0.6, batch[i, j].reshape(1), 0.3)
            assert torch.equal(result.kept[i, j], alone.kept[0]) and bool(result.fallback[i, j]) == bool(alone.fallback[0])
            kept, fallback = _reference_filter(grads[i, j].unsqueeze(0), [float(sigma[i, j])], 0.6, [int(batch[i, j])], 0.3)
            assert torch.equal(alone.kept, kept) and torch.equal(alone.fallback, fallback)
    assert result.fallback.any() and not result.fallback.all()
    assert len({tuple(k.tolist()) for k in result.kept.reshape(6, n)}) >= 3


def test_filter_radius_uses_sigma_in_float64():
    # 2σ = 0.6 exactly in float64, but 2 * float32(0.3) = 0.60000002: an agent 0.60000001 away is
    # outside the fallback radius (the first pass, with B_t huge, keeps nobody).
    line = torch.tensor([[[0.0], [0.60000001], [10.0]]], dtype=torch.float64)
    result = byzantine_filter(line, 0.3, 0.6, 1e12, 0.0)
    assert result.fallback.all() and not result.kept.any()
    result = byzantine_filter(line, 0.30000001, 0.6, 1e12, 0.0)  # 2σ = 0.60000002: both within
    assert result.kept[0].tolist() == [True, True, False]


# --- the exact evaluator ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def evaluator():
    return TabularEvaluator("fedrl/GridWorld-v0", gamma=GAMMA, agents=[0, 3])


def test_alpha_as_a_list_equals_alpha_as_a_tensor(evaluator):
    theta = torch.randn(2, 100, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 0.3
    as_list = evaluator.meta_objective(theta, [0.5, 2.0])[0]
    as_tensor = evaluator.meta_objective(theta, torch.tensor([0.5, 2.0]))[0]
    one_by_one = torch.stack([evaluator.meta_objective(theta[i], a)[0] for i, a in enumerate([0.5, 2.0])])
    assert torch.equal(as_list, as_tensor)
    assert torch.allclose(as_tensor, one_by_one, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "alpha",
    [torch.tensor([True, False]), torch.tensor([0.5 + 0j, 1.0]), torch.tensor([0.5, -0.1]), torch.tensor([0.5, float("nan")]),
     torch.tensor([float("inf"), 1.0]), [0.5, -2.0]],
)
def test_bad_tensor_alphas_are_rejected(evaluator, alpha):
    with pytest.raises(ValueError, match="alpha must"):
        evaluator.meta_grad(torch.zeros(2, 100, dtype=torch.float64), alpha)


def test_meta_grads_per_agent_keep_the_flat_layout(evaluator):
    theta = torch.randn(100, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 0.3
    flat = evaluator.meta_grads_per_agent(theta, 0.5)
    square = evaluator.meta_grads_per_agent(theta.reshape(25, 4), 0.5)
    assert flat.shape == (2, 100) and square.shape == (2, 25, 4)
    assert torch.equal(flat, square.reshape(2, 100))


def test_scalar_tensor_alpha_broadcasts_over_the_batch(evaluator):
    theta = torch.randn(2, 100, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 0.3
    assert torch.equal(evaluator.meta_grad(theta, torch.tensor(0.5)), evaluator.meta_grad(theta, 0.5))
    assert torch.equal(evaluator.meta_grad(theta, torch.tensor([0.5])), evaluator.meta_grad(theta, 0.5))


@pytest.mark.parametrize("theta", [torch.zeros(100, dtype=torch.bool), torch.zeros(100, dtype=torch.complex128)])
def test_bool_and_complex_theta_are_rejected(evaluator, theta):
    with pytest.raises(ValueError, match="theta must hold real numbers"):
        evaluator.returns(theta)
