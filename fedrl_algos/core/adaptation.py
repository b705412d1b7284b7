"""The adaptation (inner) policy gradient ĝ_in, with an optional variance-reducing baseline.

The paper's adaptation step uses the estimate of eq. (2), ``ĝ = (1/m) Σ_j Σ_h R^h_j ∇log π(a_{j,h}|s_{j,h})``
with the reward-to-go ``R^h = Σ_{t≥h} γ^t r_t`` (a GPOMDP sum without a baseline). With
``baseline="loo"`` each reward-to-go is reduced by the time-dependent mean reward-to-go of the
*other* trajectories of the batch that are still running at h,

    ψ_{j,h} = R^h_j − b_{j,h},   b_{j,h} = mean_{k≠j} R^h_k,

which does not depend on trajectory j, so ``E[ĝ] = ∇J`` still holds exactly (for m ≥ 2; with one
trajectory there is nothing to leave out and b = 0). ``baseline="mean"`` includes j itself: a bias
of O(1/m), as :func:`~fedrl_algos.core.gpomdp.time_baseline` documents. ``baseline="linear"``
subtracts ``γ^h φ(s_{j,h}, h)ᵀw``, garage's linear feature baseline with ``w`` fitted on the other
folds of the batch (:mod:`fedrl_algos.core.baselines`): a function of trajectory j's state and of
the *other* trajectories, so the estimate stays unbiased too. ``baseline="critic"`` weights step h
with ``γ^h A_h``, the GAE(λ) advantage under every agent's learned value function V_φ
(:class:`~fedrl_algos.core.critic.CriticBaseline`, passed as ``critic``); with λ = 1 that is
``R^h − γ^h V_φ(s_{j,h})``, unbiased whenever φ was fitted on other batches (these functions never fit
it; an estimator that does fits after the weights). The baselines are computed per batch row, so
the estimate of a row depends on its own trajectories only.

Every baseline here is a function of the batch's observations and rewards (and of a fixed φ) only, never of θ, so the
Jacobian ``∇_θ ĝ_in(D; θ) = (1/m) Σ_ξ ∇²ν(ξ)`` at fixed trajectories (the debiased meta-gradient's
curvature term, :mod:`fedrl_algos.per_fedavg_pg.debiased`) keeps its form with any of them.
"""

from __future__ import annotations

from typing import Any

import torch

from fedrl_algos.core.critic import CriticBaseline
from fedrl_algos.core.estimators import policy_gradient, reward_to_go_weights
from fedrl_algos.core.gpomdp import gpomdp_weights
from fedrl_algos.core.trajectories import Trajectories, fitted_to_batch

__all__ = ["ADAPTATION_BASELINES", "CRITIC_BASELINE", "check_adaptation_baseline", "adaptation_weights", "adaptation_gradient"]

#: accepted values of ``adaptation_baseline`` (``None``: the paper's estimator, eq. (2)) that need nothing but the batch
ADAPTATION_BASELINES = (None, "loo", "mean", "linear")
#: the learned critic: accepted where the caller holds every agent's critics (``allow_critic``)
CRITIC_BASELINE = "critic"


def check_adaptation_baseline(baseline: Any, name: str = "adaptation_baseline", allow_critic: bool = False) -> str | None:
    """``baseline`` if it is one of :data:`ADAPTATION_BASELINES` (or, with ``allow_critic``,
    ``"critic"``), else a ``ValueError`` naming ``name``."""
    accepted = (*ADAPTATION_BASELINES, CRITIC_BASELINE) if allow_critic else ADAPTATION_BASELINES
    if baseline is not None and not isinstance(baseline, str):
        raise TypeError(f"{name} must be None or one of {accepted[1:]}, got {type(baseline).__name__}")
    if baseline == CRITIC_BASELINE and not allow_critic:
        raise ValueError(f"{name} must be one of {accepted}, got 'critic': the learned critic needs every agent's value "
                         "function, which a model trained with it holds (e.g. PerFedAvgPG(adaptation_baseline='critic'))")
    if baseline not in accepted:
        raise ValueError(f"{name} must be one of {accepted}, got {baseline!r}")
    return baseline


def adaptation_weights(traj: Trajectories, gamma: float, baseline: str | None = None, critic: CriticBaseline | None = None
                       ) -> torch.Tensor:
    """The step weights ``ψ [*B, m, T]`` of the adaptation gradient: ``R^h`` (``None``), ``R^h − b_{j,h}``
    or, with ``"critic"``, ``γ^h A_h`` under ``critic`` (nothing is fitted).

    :param traj: trajectories ``[*B, m, T, ...]``
    :param gamma: discount γ
    :param baseline: one of :data:`ADAPTATION_BASELINES` or ``"critic"``
    :param critic: every row's critic (batch ``[*B]``; ``baseline="critic"`` only)
    """
    if baseline is None:
        return reward_to_go_weights(traj, gamma)
    if baseline == CRITIC_BASELINE:
        if not isinstance(critic, CriticBaseline):
            raise ValueError(f"baseline='critic' needs critic, every row's CriticBaseline, got {type(critic).__name__}")
        return critic.step_weights(traj)[0]
    return gpomdp_weights(traj, gamma, check_adaptation_baseline(baseline, "baseline"))


@fitted_to_batch
def adaptation_gradient(policy, theta: torch.Tensor, traj: Trajectories, gamma: float, baseline: str | None = None,
                        critic: CriticBaseline | None = None) -> torch.Tensor:
    """``ĝ_in [*B, d]`` from trajectories sampled at ``theta [*B, d]`` (``baseline=None``: exactly
    :func:`~fedrl_algos.core.estimators.policy_gradient`).

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param gamma: discount
    :param baseline: ``None``, ``"loo"``, ``"mean"``, ``"linear"`` or ``"critic"`` (see the module docstring)
    :param critic: every row's critic, for ``baseline="critic"`` (not fitted here)
    """
    if baseline is None:
        return policy_gradient(policy, theta, traj, gamma)
    return policy.score_gradient(theta, traj, adaptation_weights(traj, gamma, baseline, critic))
