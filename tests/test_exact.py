"""Exact evaluation (fedrl_algos.core.exact) against independent computations.

Every reference here is computed separately from the evaluator's value recursion: a forward
recursion over state distributions on the dense transition tensor, brute-force enumeration of every
trajectory, central finite differences, and ``torch.autograd.functional.hessian``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedrl_algos.core.exact import TabularEvaluator
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, stack_params

GAMMA = 0.9


def random_theta(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


def small_tasks(size: int = 3, horizon: int = 3) -> list:
    return [GRIDWORLD.make_params(agent=k, size=size, horizon=horizon) for k in range(8)]


def forward_returns(family, tasks, theta: torch.Tensor, gamma: float = GAMMA) -> torch.Tensor:
    """Independent reference: d_0 = μ, d_{h+1}(s') = Σ_{s,a} d_h(s) π(a|s) P(s'|s,a); J = Σ_h γ^h E_{d_h}[r]."""
    params = stack_params(tasks)
    trans = family.transition_tensor(params)  # [n, S, A, S]
    reward = family.reward_vector(params)  # [n, S] or [n, S, A]
    dist = family.start_distribution(params)  # [n, S]
    pi = torch.softmax(theta.reshape(trans.shape[1], trans.shape[2]), dim=-1)  # [S, A]
    total = torch.zeros(trans.shape[0], dtype=torch.float64)
    for h in range(family.horizon(params) + 1):
        if reward.ndim == 2:
            total = total + gamma**h * (dist * reward).sum(-1)
        else:
            total = total + gamma**h * (dist[:, :, None] * pi * reward).sum((-1, -2))
        dist = torch.einsum("ns,sa,nsat->nt", dist, pi, trans)
    return total


@pytest.fixture(scope="module")
def ev() -> TabularEvaluator:
    return TabularEvaluator("fedrl/GridWorld-v0", gamma=GAMMA)


@pytest.fixture(scope="module")
def ev_small() -> TabularEvaluator:
    return TabularEvaluator(GRIDWORLD, gamma=GAMMA, tasks=small_tasks(size=3, horizon=4))


# --- values ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_returns_match_forward_recursion(ev: TabularEvaluator, seed: int | None) -> None:
    theta = torch.zeros(25, 4, dtype=torch.float64) if seed is None else random_theta(25, 4, seed=seed, scale=2.0)
    expected = forward_returns(GRIDWORLD, GRIDWORLD.train_tasks, theta)
    torch.testing.assert_close(ev.returns(theta), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_returns_match_forward_recursion_for_other_discounts(gamma: float) -> None:
    theta = random_theta(25, 4, seed=2)
    expected = forward_returns(GRIDWORLD, GRIDWORLD.train_tasks, theta, gamma=gamma)
    torch.testing.assert_close(TabularEvaluator(gamma=gamma).returns(theta), expected, atol=1e-12, rtol=0)


def test_heldout_tasks_match_forward_recursion() -> None:
    heldout = GRIDWORLD.heldout_tasks
    ev = TabularEvaluator(tasks=heldout)
    theta = random_theta(100, seed=3)
    assert ev.n_agents == len(heldout) == 17
    torch.testing.assert_close(ev.returns(theta), forward_returns(GRIDWORLD, heldout, theta), atol=1e-12, rtol=0)


def test_brute_force_enumeration_of_trajectories() -> None:
    """J, ∇J (likelihood-ratio form g = Σ_h ∇log π(a_h|s_h) R^h) and ∇²J (the paper's u(ξ;θ)) by
    summing over every trajectory of a 2×2 grid with H = 2."""
    tasks = small_tasks(size=2, horizon=2)
    ev = TabularEvaluator(tasks=tasks, gamma=GAMMA)
    params = stack_params(tasks)
    table = GRIDWORLD.next_state_table(params).numpy()
    reward = GRIDWORLD.reward_vector(params).numpy()
    start = GRIDWORLD.start_distribution(params).numpy()
    n, n_s, n_a, horizon = len(tasks), 4, 4, 2
    theta = random_theta(n_s, n_a, seed=5).numpy()
    pi = np.exp(theta - theta.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    d = n_s * n_a
    values, grads, hessians = np.zeros(n), np.zeros((n, d)), np.zeros((n, d, d))
    for i in range(n):
        for s0 in range(n_s):
            for actions in itertools.product(range(n_a), repeat=horizon + 1):
                states, prob = [s0], start[i, s0]
                for a in actions[:-1]:
                    states.append(table[i, states[-1], a])
                prob *= np.prod([pi[s, a] for s, a in zip(states, actions)])
                rewards = np.array([GAMMA**h * reward[i, s] for h, s in enumerate(states)])
                to_go = rewards[::-1].cumsum()[::-1]  # R^h = Σ_{t≥h} γ^t r_t
                scores, g, hess_nu = np.zeros((horizon + 1, d)), np.zeros(d), np.zeros((d, d))
                for h, (s, a) in enumerate(zip(states, actions)):
                    block = slice(s * n_a, (s + 1) * n_a)
                    scores[h, block] = -pi[s]
                    scores[h, s * n_a + a] += 1.0
                    g += scores[h] * to_go[h]
                    hess_nu[block, block] -= (np.diag(pi[s]) - np.outer(pi[s], pi[s])) * to_go[h]
                values[i] += prob * rewards.sum()
                grads[i] += prob * g
                hessians[i] += prob * (np.outer(g, scores.sum(0)) + hess_nu)
    th = torch.from_numpy(theta)
    np.testing.assert_allclose(ev.returns(th).numpy(), values, atol=1e-13, rtol=0)
    np.testing.assert_allclose(ev.grads(th.reshape(-1)).numpy(), grads, atol=1e-13, rtol=0)
    full = ev.hvps(th.reshape(-1).expand(d, d), torch.eye(d, dtype=torch.float64))  # [d (basis), n, d]
    np.testing.assert_allclose(full.permute(1, 2, 0).numpy(), hessians, atol=1e-13, rtol=0)


def test_uniform_policy_numbers(ev: TabularEvaluator) -> None:
    """θ = 0 on the paper's 8-agent 5×5 family: f(0) is the paper's uniform-random score 0.24."""
    theta = torch.zeros(25, 4, dtype=torch.float64)
    per_agent = ev.returns(theta)
    # The uniform policy is symmetric under the grid's reflections: all corners alike, all midpoints alike.
    torch.testing.assert_close(per_agent[:4], per_agent[0].expand(4), atol=1e-14, rtol=0)
    torch.testing.assert_close(per_agent[4:], per_agent[4].expand(4), atol=1e-14, rtol=0)
    assert per_agent[0] < per_agent[4]  # a corner goal is harder to stumble on than a midpoint
    big_f, f = ev.meta_objective(theta, 2.0)
    assert round(float(f), 2) == 0.24  # paper, section 7: "a uniform-random policy (0.24)"
    assert float(f) == pytest.approx(0.243870, abs=1e-6)
    assert float(big_f) == pytest.approx(0.316538, abs=1e-6)  # one exact PG step with α = 2 helps
    assert float(f) < float(big_f) < 1.0 / (1.0 - GAMMA)


# --- first and second derivatives -------------------------------------------------------------------
def central_differences(fn, theta: torch.Tensor, step: float) -> torch.Tensor:
    """(fn(θ + h e_k) - fn(θ - h e_k)) / 2h for every coordinate k, in one batched call; [d, *out]."""
    d = theta.shape[-1]
    shifts = step * torch.eye(d, dtype=torch.float64)
    out = fn(torch.stack([theta + shifts, theta - shifts]))
    return (out[0] - out[1]) / (2 * step)


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_grads_match_finite_differences(ev: TabularEvaluator, seed: int | None) -> None:
    theta = torch.zeros(100, dtype=torch.float64) if seed is None else random_theta(100, seed=seed, scale=1.5)
    fd = central_differences(ev.returns, theta, step=1e-5)  # [d, n]
    exact = ev.grads(theta)  # [n, d]
    assert exact.shape == (8, 100)
    assert (fd.T - exact).abs().max() <= 1e-8
    assert exact.abs().max() > 1e-3  # the comparison is not between zeros


def test_hvps_match_finite_differences_of_grads(ev: TabularEvaluator) -> None:
    theta = random_theta(25, 4, seed=7)
    v = random_theta(25, 4, seed=8)
    step = 1e-5
    fd = (ev.grads(theta + step * v) - ev.grads(theta - step * v)) / (2 * step)
    exact = ev.hvps(theta, v)
    assert exact.shape == (8, 25, 4)
    assert (fd - exact).abs().max() <= 1e-8
    assert exact.abs().max() > 1e-3


def test_hvps_match_autograd_hessian(ev_small: TabularEvaluator) -> None:
    d = ev_small.dim
    assert d == 36
    theta = random_theta(d, seed=11)
    hessians = torch.stack(
        [torch.autograd.functional.hessian(lambda x, i=i: ev_small.returns(x)[i], theta) for i in range(8)]
    )  # [n, d, d]
    torch.testing.assert_close(hessians, hessians.transpose(-1, -2), atol=1e-14, rtol=0)
    v_shared = random_theta(d, seed=12)
    torch.testing.assert_close(ev_small.hvps(theta, v_shared), hessians @ v_shared, atol=1e-12, rtol=0)
    v_agents = random_theta(8, d, seed=13)
    expected = (hessians @ v_agents.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ev_small.hvps(theta, v_agents), expected, atol=1e-12, rtol=0)
    # Structured layout, per-agent directions.
    got = ev_small.hvps(theta.reshape(9, 4), v_agents.reshape(8, 9, 4))
    torch.testing.assert_close(got.reshape(8, d), expected, atol=1e-12, rtol=0)


# --- meta-objective -------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_meta_grad_matches_finite_differences(ev: TabularEvaluator, alpha: float) -> None:
    theta = random_theta(100, seed=21)
    fd = central_differences(lambda x: ev.meta_objective(x, alpha)[0], theta, step=1e-5)  # [d]
    exact = ev.meta_grad(theta, alpha)
    assert exact.shape == (100,)
    assert (fd - exact).abs().max() <= 1e-8
    assert exact.abs().max() > 1e-3


def test_meta_grad_equals_curvature_formula(ev: TabularEvaluator) -> None:
    """∇F = mean_i (I + α∇²J_i(θ)) ∇J_i(θ + α∇J_i(θ)), assembled from grads, hvps and adapted_params."""
    alpha = 2.0
    theta = random_theta(25, 4, seed=22)
    adapted = ev.adapted_params(theta, alpha)  # [n, S, A]
    torch.testing.assert_close(adapted, theta + alpha * ev.grads(theta), atol=1e-15, rtol=0)
    outer = ev.grads(adapted).diagonal(dim1=0, dim2=1).permute(2, 0, 1)  # ∇J_i(θ_i⁺): [n, S, A]
    per_agent = outer + alpha * ev.hvps(theta, outer)
    torch.testing.assert_close(ev.meta_grads_per_agent(theta, alpha), per_agent, atol=1e-13, rtol=0)
    torch.testing.assert_close(ev.meta_grad(theta, alpha), per_agent.mean(0), atol=1e-13, rtol=0)
    big_f_i, j_i = ev.meta_objective_per_agent(theta, alpha)
    torch.testing.assert_close(big_f_i, ev.returns(adapted).diagonal(), atol=1e-14, rtol=0)
    torch.testing.assert_close(j_i, ev.returns(theta), atol=0, rtol=0)
    big_f, f, grad = ev.meta_objective_and_grad(theta, alpha)
    torch.testing.assert_close(big_f, big_f_i.mean(), atol=1e-15, rtol=0)
    torch.testing.assert_close(f, j_i.mean(), atol=1e-15, rtol=0)
    torch.testing.assert_close(grad, per_agent.mean(0), atol=1e-13, rtol=0)


def test_alpha_zero_is_federated_policy_gradient(ev: TabularEvaluator) -> None:
    theta = random_theta(3, 25, 4, seed=23)
    big_f, f = ev.meta_objective(theta, 0.0)
    assert torch.equal(big_f, f)
    torch.testing.assert_close(ev.meta_grad(theta, 0.0), ev.grads(theta).mean(-3), atol=1e-15, rtol=0)
    torch.testing.assert_close(ev.adapted_params(theta, 0), theta.unsqueeze(-3).expand(3, 8, 25, 4), atol=0, rtol=0)
    # A positive α separates F from f at a generic point.
    assert (ev.meta_objective(theta, 1.0)[0] - f).abs().min() > 1e-4


# --- batching, layouts, dtypes ------------------------------------------------------------------------
def test_batched_equals_looped(ev: TabularEvaluator) -> None:
    batch = (3, 2)
    theta = random_theta(*batch, 25, 4, seed=31)
    v = random_theta(*batch, 8, 25, 4, seed=32)
    alpha = torch.tensor([[0.0, 0.5], [1.0, 2.0], [3.0, 0.25]], dtype=torch.float64)
    out = {
        "returns": ev.returns(theta),
        "grads": ev.grads(theta),
        "hvps": ev.hvps(theta, v),
        "adapted": ev.adapted_params(theta, alpha),
        "meta": ev.meta_objective(theta, alpha),
        "meta_grad": ev.meta_grad(theta, alpha),
    }
    assert out["returns"].shape == (3, 2, 8)
    assert out["grads"].shape == out["hvps"].shape == out["adapted"].shape == (3, 2, 8, 25, 4)
    assert out["meta"][0].shape == out["meta"][1].shape == (3, 2)
    assert out["meta_grad"].shape == (3, 2, 25, 4)
    for b in itertools.product(range(3), range(2)):
        a = float(alpha[b])
        one = {
            "returns": ev.returns(theta[b]),
            "grads": ev.grads(theta[b]),
            "hvps": ev.hvps(theta[b], v[b]),
            "adapted": ev.adapted_params(theta[b], a),
            "meta": ev.meta_objective(theta[b], a),
            "meta_grad": ev.meta_grad(theta[b], a),
        }
        for key, value in one.items():
            torch.testing.assert_close(
                tuple(x[b] for x in out[key]) if key == "meta" else out[key][b],
                value,
                atol=1e-14,
                rtol=0,
                msg=f"{key} at {b}",
            )


def test_flat_and_structured_layouts_agree(ev: TabularEvaluator) -> None:
    theta = random_theta(4, 25, 4, seed=41)
    flat = theta.reshape(4, 100)
    v = random_theta(4, 25, 4, seed=42)
    torch.testing.assert_close(ev.returns(flat), ev.returns(theta), atol=0, rtol=0)
    assert ev.grads(flat).shape == (4, 8, 100)
    torch.testing.assert_close(ev.grads(flat), ev.grads(theta).reshape(4, 8, 100), atol=0, rtol=0)
    torch.testing.assert_close(ev.hvps(flat, v.reshape(4, 100)), ev.hvps(theta, v).reshape(4, 8, 100), atol=0, rtol=0)
    assert ev.meta_grad(flat, 1.0).shape == (4, 100)
    torch.testing.assert_close(ev.meta_grad(flat, 1.0), ev.meta_grad(theta, 1.0).reshape(4, 100), atol=0, rtol=0)
    # float32 and numpy inputs are evaluated in float64.
    out = ev.returns(theta.float().numpy())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ev.returns(theta.float().double()), atol=0, rtol=0)


def test_agents_select_training_tasks(ev: TabularEvaluator) -> None:
    theta = random_theta(25, 4, seed=51)
    sub = TabularEvaluator(agents=[6, 1])
    assert sub.n_agents == 2
    torch.testing.assert_close(sub.returns(theta), ev.returns(theta)[[6, 1]], atol=0, rtol=0)
    torch.testing.assert_close(sub.grads(theta), ev.grads(theta)[[6, 1]], atol=0, rtol=0)
    torch.testing.assert_close(TabularEvaluator(agents=torch.tensor([6, 1])).returns(theta), sub.returns(theta))
    single = TabularEvaluator(agents=range(3, 4))
    torch.testing.assert_close(single.meta_objective(theta, 2.0)[0], ev.meta_objective_per_agent(theta, 2.0)[0][3])


def test_works_under_no_grad_and_inference_mode_and_returns_is_differentiable(ev: TabularEvaluator) -> None:
    theta = random_theta(25, 4, seed=61)
    expected = ev.meta_grad(theta, 1.0)
    with torch.no_grad():
        torch.testing.assert_close(ev.meta_grad(theta, 1.0), expected, atol=0, rtol=0)
    with torch.inference_mode():
        inference_theta = theta.clone()
        torch.testing.assert_close(ev.meta_grad(inference_theta, 1.0), expected, atol=0, rtol=0)
        built_inside = TabularEvaluator()
    torch.testing.assert_close(built_inside.hvps(theta, theta), ev.hvps(theta, theta), atol=0, rtol=0)
    x = theta.clone().requires_grad_(True)
    ev.returns(x).sum().backward()
    torch.testing.assert_close(x.grad, ev.grads(theta).sum(0), atol=1e-15, rtol=0)


def test_intra_op_thread_setting_is_restored(ev: TabularEvaluator) -> None:
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ev.meta_grad(torch.zeros(25, 4), 1.0)
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError):
            ev.meta_grad(torch.zeros(25, 4), -1.0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


# --- other tabular families: dense (stochastic) transitions, reward r(s, a) -----------------------------
class SlipperyGrid:
    """The gridworld with a slip: with probability ``slip`` the action is replaced by a uniform one.

    Exposes only ``transition_tensor`` (no next-state table), so the evaluator takes its dense path;
    ``action_bonus`` adds a reward r(s, a) for action 0 to exercise the state-action reward form.
    """

    env_id = "test/SlipperyGrid"

    def __init__(self, slip: float, action_bonus: float = 0.0, size: int = 3, horizon: int = 4) -> None:
        self.slip, self.action_bonus = slip, action_bonus
        self.train_tasks = small_tasks(size, horizon)

    def transition_tensor(self, params):
        exact = GRIDWORLD.transition_tensor(params)
        return (1 - self.slip) * exact + self.slip * exact.mean(-2, keepdim=True)

    def reward_vector(self, params):
        reward = GRIDWORLD.reward_vector(params)
        if self.action_bonus == 0.0:
            return reward
        bonus = torch.zeros(4, dtype=torch.float64)
        bonus[0] = self.action_bonus
        return reward.unsqueeze(-1) + bonus

    def start_distribution(self, params):
        return GRIDWORLD.start_distribution(params)

    def horizon(self, params):
        return params.horizon


def test_dense_path_equals_table_path(ev_small: TabularEvaluator) -> None:
    dense = TabularEvaluator(SlipperyGrid(slip=0.0))
    assert dense._next is None and ev_small._next is not None
    theta = random_theta(2, 36, seed=71)
    torch.testing.assert_close(dense.returns(theta), ev_small.returns(theta), atol=1e-14, rtol=0)
    torch.testing.assert_close(dense.meta_grad(theta, 2.0), ev_small.meta_grad(theta, 2.0), atol=1e-13, rtol=0)


@pytest.mark.parametrize("action_bonus", [0.0, 0.3])
def test_stochastic_family_against_forward_recursion_and_finite_differences(action_bonus: float) -> None:
    family = SlipperyGrid(slip=0.25, action_bonus=action_bonus)
    ev = TabularEvaluator(family)
    theta = random_theta(36, seed=72)
    expected = forward_returns(family, family.train_tasks, theta)
    torch.testing.assert_close(ev.returns(theta), expected, atol=1e-12, rtol=0)
    fd = central_differences(ev.returns, theta, step=1e-5)
    assert (fd.T - ev.grads(theta)).abs().max() <= 1e-8
    fd_meta = central_differences(lambda x: ev.meta_objective(x, 1.0)[0], theta, step=1e-5)
    assert (fd_meta - ev.meta_grad(theta, 1.0)).abs().max() <= 1e-8


# --- argument validation --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"env_id_or_family": "fedrl/Nope-v0"}, "env_id_or_family"),
        ({"env_id_or_family": ARC_NAVIGATION}, "env_id_or_family"),
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": "0.9"}, "gamma"),
        ({"agents": [8]}, "agents"),
        ({"agents": [-1]}, "agents"),
        ({"agents": []}, "agents"),
        ({"agents": [0.5]}, "agents"),
        ({"agents": [0], "tasks": small_tasks()}, "agents"),
        ({"tasks": []}, "tasks"),
        ({"tasks": ["goal"]}, "tasks"),
        ({"tasks": small_tasks(3, 3) + small_tasks(4, 3)}, "tasks"),
        ({"device": "no-such-device"}, "device"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TabularEvaluator(**kwargs)


def test_methods_reject_bad_arguments(ev: TabularEvaluator) -> None:
    theta = torch.zeros(2, 25, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="theta"):
        ev.returns(torch.zeros(25, 3))
    with pytest.raises(ValueError, match="theta"):
        ev.grads(torch.zeros(99))
    with pytest.raises(ValueError, match="v must"):
        ev.hvps(theta, torch.zeros(2, 25, 3))
    with pytest.raises(ValueError, match="v must"):
        ev.hvps(theta, torch.zeros(2, 7, 25, 4))
    with pytest.raises(ValueError, match="alpha"):
        ev.meta_objective(theta, -1.0)
    with pytest.raises(ValueError, match="alpha"):
        ev.meta_grad(theta, float("nan"))
    with pytest.raises(ValueError, match="alpha"):
        ev.meta_grad(theta, torch.ones(3))
    with pytest.raises(ValueError, match="alpha"):
        ev.adapted_params(theta, True)
