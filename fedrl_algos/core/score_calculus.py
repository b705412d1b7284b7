"""Second-order pieces of score-function estimators that the policy-Hessian estimate of eq. (3) does not expose.

Notation as in :mod:`fedrl_algos.core.estimators`: for a trajectory ξ, ``log q(ξ; θ) = Σ_h log π(a_h|s_h)``
(the transition terms do not depend on θ) and ``ν(ξ; θ) = Σ_h ψ_h log π(a_h|s_h)`` for step weights ψ
that are functions of the trajectories' rewards only (reward-to-go, with or without a batch
baseline). The curvature estimate of eq. (3) applied to v is

    u(ξ) v = g(ξ) (∇log q(ξ)ᵀv) + ∇²ν(ξ) v,    g = ∇ν,

and the policy computes it (:meth:`~fedrl_algos.core.protocols.FlatPolicyProtocol.hvp`). The
stochastic-adaptation meta-gradient needs the second part alone: with the trajectories held fixed,
the Jacobian of the batch estimate ĝ(θ) = (1/m) Σ_ξ ∇ν(ξ; θ) is (1/m) Σ_ξ ∇²ν(ξ; θ). This module
computes it as

    (1/m) Σ_ξ ∇²ν(ξ) v = policy.hvp(θ, ξ, v, ψ) − policy.score_gradient(θ, ξ, ψ · c),   c_ξ = ∇log q(ξ)ᵀv,

so both policy closed forms are used and only the per-trajectory directional derivatives c (one
forward-mode JVP) come from autograd; :func:`autograd_log_prob_hvp` is the all-autograd reference
(a double backward), and no d×d matrix is ever formed.
"""

from __future__ import annotations

import torch
from torch.func import jvp

from fedrl_algos.core.estimators import masked_log_prob
from fedrl_algos.core.trajectories import Trajectories, fitted_to_batch

__all__ = ["log_likelihood_jvp", "log_prob_hvp", "autograd_log_prob_hvp"]


@fitted_to_batch
def log_likelihood_jvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor) -> torch.Tensor:
    """``c_ξ = ∇log q(ξ; θ)ᵀ v`` for every trajectory by one forward-mode JVP: ``[*B, m]``.

    :param policy: any flat policy (only ``log_prob`` is used)
    :param theta: parameters ``[*B, d]``
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction broadcastable to ``theta``
    """
    # Forward-mode AD needs dense tensors (broadcast views share memory across rows).
    theta = theta.detach().contiguous()
    v = v.detach().to(theta.dtype).expand_as(theta).contiguous()

    def log_q(th: torch.Tensor) -> torch.Tensor:
        return masked_log_prob(policy, th, traj).sum(-1)

    _, directional = jvp(log_q, (theta,), (v,))
    return directional.detach()


@fitted_to_batch
def log_prob_hvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(1/m) Σ_ξ ∇²ν(ξ; θ) v`` with ``ν = Σ_h ψ_h log π(a_h|s_h)``, through the policy's calculus: ``[*B, d]``.

    The Jacobian of the batch estimate ``(1/m) Σ_ξ Σ_h ψ_h ∇log π`` with respect to θ (trajectories
    and ψ fixed), applied to ``v``: the policy's curvature estimate minus its outer-product part.

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]``
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]`` (or broadcastable to it)
    :param weights: step weights ``ψ [*B, m, T]``, treated as constants
    """
    psi = weights.detach()
    c = log_likelihood_jvp(policy, theta, traj, v)
    full = policy.hvp(theta, traj, v, psi)
    outer = policy.score_gradient(theta, traj, psi * c.unsqueeze(-1))
    return full - outer


def autograd_log_prob_hvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """:func:`log_prob_hvp` by a double backward through ``log_prob`` (any policy; the reference in tests).

    :param policy: any flat policy (only ``log_prob`` is used)
    :param theta: parameters ``[*B, d]``
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction broadcastable to ``theta``
    :param weights: step weights ``ψ [*B, m, T]``
    """
    psi = weights.detach()
    v = v.detach().to(theta.dtype).expand_as(theta)
    with torch.enable_grad():
        th = theta.detach().requires_grad_(True)
        nu = (masked_log_prob(policy, th, traj) * psi).sum()
        (grad_nu,) = torch.autograd.grad(nu, th, create_graph=True)
        (hv,) = torch.autograd.grad((grad_nu * v).sum(), th)
    return hv / traj.n_trajectories
