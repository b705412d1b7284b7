"""The tanh-squashed Gaussian at tanh's saturation: ``log π`` is the likelihood of the actions the sampler returns.

In floating point every pre-squash draw ``|u| ≥ b = atanh(1 − ε)`` (≈ 8.3 in float32) becomes the
same clipped action (``b = atanh(1 − 5ε/4)`` ≈ 8.2 in float32), so the action's distribution has
an atom at each end. These tests hold
``log π`` to that distribution where the pre-squash mean is near or beyond ``b``:

* the log-probability of a saturated action is the Gaussian's tail mass ``log Φ((μ − b)/σ)``;
* Monte Carlo: importance weights ``π_θ'(a)/π_θ(a)`` of the policy's own float32 samples average to
  1, and the score ``∂ log π/∂μ`` to 0 (both fail with the density of the clipped ``u`` at the atom);
* autograd against central differences at a saturated action (float64);
* MFPO with the paper's settings on heterogeneous Pendulum keeps finite parameters through its
  first two rounds (it became non-finite at local step 5 with the density at the atom).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_algos.policies.heads import GaussianHead
from fedrl_envs import RandomStreams, derive_keys

BOX32 = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
# where float32's tanh starts to round to the clipped end 1 − ε: atanh(1 − 5ε/4)
B32 = math.atanh(1.0 - 1.25 * torch.finfo(torch.float32).eps)


def _draw(head: GaussianHead, mean: float, log_std: float, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` float32 actions of the head with a scalar mean and log σ: ``[n, 1]``."""
    m = torch.full((1, n, 1), mean, dtype=torch.float32)
    s = torch.full((1, 1, 1), log_std, dtype=torch.float32)
    return head.sample(m, s, RandomStreams(derive_keys(seed, torch.arange(1))))[0]


def _log_prob(head: GaussianHead, mean: float, log_std: float, actions: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    m = torch.full(actions.shape, mean, dtype=dtype)
    return head.log_prob(m, torch.full((1,), log_std, dtype=dtype), actions)


def test_a_saturated_action_has_the_tail_probability():
    head = GaussianHead(BOX32, "tanh")
    actions = _draw(head, 20.0, 0.0, 50)
    assert torch.unique(actions).numel() == 1 and float(actions.max()) < 2.0  # all on the clipped end, inside the space
    expected = torch.special.log_ndtr(torch.tensor(20.0 - B32, dtype=torch.float64))
    torch.testing.assert_close(_log_prob(head, 20.0, 0.0, actions).double(), expected.expand(50), rtol=0, atol=1e-6)
    # The lower end, with σ ≠ 1 and a float64 mean reading float32 actions (float32's b applies).
    low_actions = _draw(head, -15.0, 0.5, 20)
    got = _log_prob(head, -15.0, 0.5, low_actions, dtype=torch.float64)
    torch.testing.assert_close(got, torch.special.log_ndtr(torch.tensor((-B32 + 15.0) / math.exp(0.5), dtype=torch.float64)).expand(20))


def test_importance_weights_and_score_of_saturating_samples_are_unbiased():
    """Under the mean μ = 8 (σ = 1) about 40 % of float32 draws saturate. With log π the likelihood
    of the stored actions, ``E[π_θ'(a)/π_θ(a)] = 1`` and ``E[∂ log π/∂μ] = 0``. The density of the
    clipped ``u`` at the atom gave a score mean of −0.26; what is left (≈ 0.003, about 2 Monte Carlo
    standard errors) is float32's quantization of ``u`` just inside ``b`` (bins up to ~0.2 wide)."""
    head = GaussianHead(BOX32, "tanh")
    n = 400_000
    actions = _draw(head, 8.0, 0.0, n, seed=3)
    saturated = float((actions >= actions.max()).double().mean())
    assert 0.35 < saturated < 0.5
    log_w = _log_prob(head, 7.5, 0.2, actions, torch.float64) - _log_prob(head, 8.0, 0.0, actions, torch.float64)
    w = log_w.exp()
    assert abs(float(w.mean()) - 1.0) < 4 * float(w.std()) / math.sqrt(n)
    mean = torch.full(actions.shape, 8.0, dtype=torch.float64, requires_grad=True)
    logp = head.log_prob(mean, torch.zeros(1, dtype=torch.float64), actions)
    (score,) = torch.autograd.grad(logp.sum(), mean)
    assert abs(float(score.mean())) < 0.01
    assert float(score.abs().max()) < 10  # bounded: |u − μ|/σ² of the interior draws, the tail's ratio at the atom


def test_log_prob_gradient_at_a_saturated_action_matches_finite_differences():
    box = gym.spaces.Box(np.array([-1.0, 0.0]), np.array([3.0, 0.5]), dtype=np.float64)
    head = GaussianHead(box, "tanh")
    mean = torch.tensor([[30.0, 0.3], [-25.0, 19.0], [0.2, -0.4]], dtype=torch.float64)
    log_std = torch.tensor([0.3, -0.2], dtype=torch.float64)
    actions = head.sample(mean.unsqueeze(0), log_std, RandomStreams(derive_keys(2, torch.arange(1))))[0]
    upper, lower, _ = head._saturated(actions)
    saturated = upper | lower
    assert saturated[0, 0] and saturated[1, 0] and not saturated[2].any()  # atoms and density terms both tested

    def f(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return head.log_prob(m, s, actions).sum()

    m, s = mean.clone().requires_grad_(True), log_std.clone().requires_grad_(True)
    gm, gs = torch.autograd.grad(f(m, s), (m, s))
    step = 1e-6
    fd_m = torch.zeros_like(mean)
    for idx in np.ndindex(*mean.shape):
        e = torch.zeros_like(mean)
        e[idx] = step
        fd_m[idx] = (f(mean + e, log_std) - f(mean - e, log_std)) / (2 * step)
    fd_s = torch.stack([(f(mean, log_std + step * e) - f(mean, log_std - step * e)) / (2 * step) for e in torch.eye(2, dtype=torch.float64)])
    torch.testing.assert_close(gm, fd_m, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(gs, fd_s, rtol=1e-5, atol=1e-8)
    assert torch.isfinite(gm).all() and float(gm[0, 0].abs()) < 1e-12  # deep in the atom the action ignores μ (the density gave (b − μ)/σ² ≈ −6.4)


def test_mfpo_paper_settings_on_pendulum_stay_finite():
    """The paper's tanh-Gaussian MFPO (ReLU 16-16, K = 10, D = 20, α_t, ν_t) on the heterogeneous
    Pendulum family: two rounds keep finite parameters and directions."""
    from fedrl_algos.mfpo import MFPOState, MFPOUpdate
    from fedrl_algos.reproduce.mfpo import GAMMA, MethodConfig, Population

    cfg = MethodConfig(activation="relu", squash="tanh")
    pop = Population("pendulum", [0], 10, cfg)
    update = MFPOUpdate(pop.policy, GAMMA, cfg.local_steps, cfg.n_trajectories, cfg.n_trajectories * cfg.local_steps,
                        cfg.step_size, cfg.momentum, max_importance_weight=cfg.max_importance_weight)
    state = MFPOState.initial(pop.initial_theta(), pop.n_agents)
    for _ in range(2):
        state, info = update.round(pop.federation.sampler, state)
        assert torch.isfinite(state.theta).all() and torch.isfinite(state.direction).all()
        assert torch.isfinite(info["return"]).all()


def test_log_normal_cdf_has_accurate_finite_gradients_far_in_the_tail():
    """Values equal torch's ``log_ndtr`` (float64); derivatives match central differences of those
    values where torch's own derivative is ``inf`` (float32) or off by 2× (float64)."""
    from fedrl_algos.policies.heads import log_normal_cdf

    x = torch.tensor([-1e6, -1e4, -4.7e4, -100.0, -25.0, -20.0, -19.9, -3.0, 0.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(log_normal_cdf(x), torch.special.log_ndtr(x), rtol=1e-12, atol=0)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(log_normal_cdf(xg).sum(), xg)
    h = 1e-4 * x.abs().clamp(min=1.0)
    fd = (torch.special.log_ndtr(x + h) - torch.special.log_ndtr(x - h)) / (2 * h)
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-9)
    x32 = torch.tensor([-4.7e4, -1e30, 30.0], dtype=torch.float32, requires_grad=True)
    (g32,) = torch.autograd.grad(log_normal_cdf(x32).sum(), x32)
    assert torch.isfinite(g32).all() and float(g32[0]) == pytest.approx(4.7e4, rel=1e-6)


def test_previous_parameters_far_on_the_other_side_give_finite_scores():
    """MFPO evaluates θ_{t−1}'s log π on θ_t's actions: an action on the lower end under a mean
    5e4 above the upper one (float32) has a huge negative log-probability and a finite score."""
    head = GaussianHead(BOX32, "tanh")
    actions = _draw(head, -20.0, 0.0, 4)
    mean = torch.full(actions.shape, 5e4, dtype=torch.float32, requires_grad=True)
    log_std = torch.zeros(1, dtype=torch.float32, requires_grad=True)
    logp = head.log_prob(mean, log_std, actions)
    gm, gs = torch.autograd.grad(logp.sum(), (mean, log_std))
    assert torch.isfinite(logp).all() and torch.isfinite(gm).all() and torch.isfinite(gs).all()
    assert float(gm[0, 0]) == pytest.approx(-(5e4 + B32), rel=1e-4)
