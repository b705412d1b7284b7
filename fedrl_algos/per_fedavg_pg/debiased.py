"""The debiased (stochastic-adaptation) meta-objective of SG-MRL and its unbiased meta-gradient.

Paper: Fallah, Georgiev, Mokhtari, Ozdaglar, "On the convergence theory of debiased model-agnostic
meta-reinforcement learning" (SG-MRL; ref. [5] of the Per-FedAvg-PG paper, which names it as the
remedy for its noisy adaptation step). Docs: ``docs/algorithms/per_fedavg_pg.md``.

Per-FedAvg-PG's objective ``F_i(θ) = J_i(θ + α∇J_i(θ))`` (eq. (5)) adapts with the *exact* gradient,
but every adaptation actually made (in training and on a new task) uses an estimate from ``m_in``
trajectories. The debiased objective is the return after the adaptation step that is really taken,

    F_i^D(θ) = E_{D_in ~ p(·; θ)} [ J_i(θ̃) ],   θ̃ = θ + α ĝ_in(D_in; θ),

where ``D_in`` is ``m_in`` trajectories sampled with θ and ``ĝ_in(D; θ) = (1/m) Σ_j Σ_h ψ_{j,h} ∇log π(a_{j,h}|s_{j,h}; θ)``
(``ψ``: reward-to-go, or reward-to-go minus a batch baseline — functions of D's rewards, and for
``"linear"`` and ``"critic"`` of D's observations through the fitted w or the critic's fixed φ, never
of θ). Both
θ̃ and the *distribution* of ``D_in`` depend on θ, so (differentiating ``Σ_D p(D; θ) J(θ̃(D, θ))``)

    ∇F_i^D(θ) = E_{D_in} [ (I + α ∇_θ ĝ_in(D_in; θ)) ∇J_i(θ̃) + J_i(θ̃) Σ_{ξ∈D_in} ∇log q(ξ; θ) ],

with ``∇_θ ĝ_in(D; θ) = (1/m) Σ_{ξ∈D} ∇²ν(ξ; θ)`` (symmetric; ``ν = Σ_h ψ_h log π``) — the Jacobian of
the estimate at *fixed* trajectories, not the paper's Ĥ of eq. (3) — and ``Σ_ξ ∇log q(ξ)`` the score of
the whole batch. The estimator (:func:`debiased_meta_gradient`) draws one outer batch ``D_out`` of
``m_out`` trajectories at θ̃ and uses the *same* ``D_in`` in the curvature term as in the step:

    ∇̂F_i^D = ĝ_out + α (1/m_in) Σ_{ξ∈D_in} ∇²ν(ξ) ĝ_out + Σ_{ξ_j∈D_in} (Ĵ_out − b_j) ∇log q(ξ_j),

``ĝ_out`` and ``Ĵ_out`` (the mean discounted return of ``D_out``) being unbiased for ∇J_i(θ̃) and
J_i(θ̃) given ``D_in``. The baseline ``b_j`` may be any function of the *other* inner trajectories
(``E[b_j ∇log q(ξ_j) | D_in∖ξ_j] = 0``), so the estimator stays unbiased: ``"loo"`` takes the mean
discounted return of ``D_in∖ξ_j`` (an estimate of J_i(θ), the level that J_i(θ̃) fluctuates about).
No Hessian batch is drawn: a step costs ``m_in + m_out`` trajectories.
"""

from __future__ import annotations

import torch

from fedrl_algos.core.critic import CriticBaseline
from fedrl_algos.core.directions import SamplerFn, scale
from fedrl_algos.core.gpomdp import time_baseline
from fedrl_algos.core.score_calculus import log_prob_hvp
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.per_fedavg_pg.update import _MetaBase

__all__ = ["SCORE_BASELINES", "DebiasedMetaGradient", "debiased_meta_gradient", "score_term_baseline"]

#: accepted values of ``score_baseline`` (the baseline of the score-function term)
SCORE_BASELINES = ("loo", None)


def _check_score_baseline(score_baseline: object) -> str | None:
    if score_baseline not in SCORE_BASELINES:
        raise ValueError(f"score_baseline must be one of {SCORE_BASELINES}, got {score_baseline!r}")
    return score_baseline  # type: ignore[return-value]


def score_term_baseline(traj_in: Trajectories, gamma: float, score_baseline: str | None = "loo") -> torch.Tensor:
    """``b_j [*B, m]``: the mean discounted return of the other inner trajectories (``"loo"``; 0 for
    ``m = 1``) or 0 (``None``). A function of ``D_in∖ξ_j`` only, so the score term stays unbiased.

    :param traj_in: the inner batch ``[*B, m, T, ...]``
    :param gamma: discount
    :param score_baseline: ``"loo"`` or ``None``
    """
    _check_score_baseline(score_baseline)
    returns = traj_in.returns(gamma)
    if score_baseline is None:
        return torch.zeros_like(returns)
    values = returns.unsqueeze(-1)
    return time_baseline(values, torch.ones_like(values), "loo").squeeze(-1)


def debiased_meta_gradient(
    policy,
    theta: torch.Tensor,
    traj_in: Trajectories,
    inner_weights: torch.Tensor,
    g_out: torch.Tensor,
    j_out: torch.Tensor,
    alpha: float | torch.Tensor,
    gamma: float,
    score_baseline: str | None = "loo",
) -> torch.Tensor:
    """``∇̂F^D = ĝ_out + α ∇_θĝ_in(D_in)·ĝ_out + Σ_j (Ĵ_out − b_j) ∇log q(ξ_j)`` for every row: ``[*B, d]``.

    A pure function of the inner batch and of the outer estimates, so that a test can put exact
    values (∇J(θ̃), J(θ̃)) in place of ``g_out``/``j_out`` and average over every possible ``D_in``.

    :param policy: a flat policy (its ``score_gradient`` and ``hvp``; forward-mode autograd for
        the per-trajectory directional derivatives)
    :param theta: parameters ``[*B, d]`` the inner batch was sampled with
    :param traj_in: the inner batch ``D_in`` ``[*B, m_in, T, ...]``
    :param inner_weights: the step weights ψ of ĝ_in on ``traj_in`` ``[*B, m_in, T]``
        (:func:`~fedrl_algos.core.adaptation.adaptation_weights`)
    :param g_out: an unbiased estimate of ∇J(θ̃) ``[*B, d]``
    :param j_out: an unbiased estimate of J(θ̃) ``[*B]``
    :param alpha: step size α of the adaptation (a number or a tensor broadcastable to θ)
    :param gamma: discount (of the baseline's returns)
    :param score_baseline: baseline of the score term (:func:`score_term_baseline`)
    """
    m = traj_in.n_trajectories
    curvature = log_prob_hvp(policy, theta, traj_in, g_out, inner_weights)
    coefficient = (j_out.detach().unsqueeze(-1) - score_term_baseline(traj_in, gamma, score_baseline)) * m  # [*B, m]
    # score_gradient averages over the batch; the score of D_in is the sum, hence the factor m.
    score = policy.score_gradient(theta, traj_in, traj_in.mask * coefficient.unsqueeze(-1).to(traj_in.mask.dtype))
    return g_out + scale(alpha, curvature) + score


class DebiasedMetaGradient(_MetaBase):
    """The unbiased meta-gradient of the debiased objective ``E_{D_in}[J_i(θ + α ĝ_in(D_in))]`` (SG-MRL).

    ``D_in`` (m_in trajectories at θ) gives ĝ_in and θ̃; ``D_out`` (m_out at θ̃) gives ``ĝ_out`` and
    ``Ĵ_out``; :func:`debiased_meta_gradient` combines them. Cost ``m_in + m_out`` trajectories.
    With a number ``α = 0`` the objective is J_i(θ) and the estimator is ``ĝ_out`` (the score term has
    mean zero then and is left out).

    :param policy: the flat policy
    :param gamma: discount γ
    :param alpha: adaptation step size α (a number, or a tensor broadcastable to θ)
    :param m_in: inner batch
    :param m_out: outer batch
    :param inner_baseline: baseline of ĝ_in (``None``: eq. (2); ``"loo"``/``"mean"``/``"linear"``:
        :mod:`fedrl_algos.core.adaptation`; ``"critic"``: every agent's critic, ``critics``); it
        defines the objective (the step that is taken)
    :param score_baseline: baseline of the score-function term (``"loo"`` or ``None``)
    :param outer_baseline: baseline of ĝ_out (``None``: eq. (2); ``"loo"``/``"mean"``/``"linear"``/``"critic"``); the
        objective is unchanged
    :param critics: every agent's critic (:class:`~fedrl_algos.core.critic.CriticBaseline`) where a
        baseline is ``"critic"``
    """

    name = "debiased"

    def __init__(
        self,
        policy,
        gamma: float,
        alpha: float | torch.Tensor,
        m_in: int,
        m_out: int,
        inner_baseline: str | None = None,
        score_baseline: str | None = "loo",
        outer_baseline: str | None = None,
        critics: CriticBaseline | None = None,
    ) -> None:
        super().__init__(policy, gamma, alpha, m_in, m_out, inner_baseline, outer_baseline, critics)
        self.score_baseline = _check_score_baseline(score_baseline)

    @property
    def trajectories_per_step(self) -> int:
        return self.m_in + self.m_out

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        traj_in = sampler(theta, self.m_in)
        psi_in = self.step_weights(traj_in, self.inner_baseline)
        adapted = theta + scale(self.alpha, self.policy.score_gradient(theta, traj_in, psi_in))
        traj_out = sampler(adapted, self.m_out)
        g_out = self.gradient(adapted, traj_out, self.outer_baseline)
        if not isinstance(self.alpha, torch.Tensor) and self.alpha == 0.0:
            return g_out
        j_out = traj_out.returns(self.gamma).mean(-1)
        return debiased_meta_gradient(
            self.policy, theta, traj_in, psi_in, g_out, j_out, self.alpha, self.gamma, self.score_baseline
        )
