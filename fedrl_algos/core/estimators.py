"""Policy-gradient and policy-Hessian estimators (Per-FedAvg-PG paper, section 2, eq. (2)–(3)).

Notation: a trajectory ξ = (s_0, a_0, …, s_H, a_H); ``R^h = Σ_{t ≥ h} γ^t r_t`` is the reward-to-go
with *absolute* discounting (as in the paper, so that E[g] = ∇J exactly); ``ν(ξ; θ) = Σ_h log π(a_h|s_h) R^h``
and ``log q(ξ; θ) = Σ_h log π(a_h|s_h) + const``. Then

* ``g(ξ; θ) = ∇ν = Σ_h ∇log π(a_h|s_h) R^h`` with ``E[g] = ∇J`` (eq. (2));
* ``u(ξ; θ) = g ∇log qᵀ + ∇²ν`` with ``E[u] = ∇²J`` (eq. (3)).

Both are sums weighted per step by ``ψ_h`` (here ``ψ_h = R^h``; GPOMDP and REINFORCE with baselines
use other weights, :mod:`fedrl_algos.core.gpomdp`). The policy computes them —
:meth:`~fedrl_algos.core.protocols.FlatPolicyProtocol.score_gradient` and ``hvp`` — by the autograd
functions of this module (:func:`autograd_score_gradient`, :func:`autograd_hvp`; any policy) unless
it has a closed form (the tabular softmax, the paper's softmax MLP). ``u`` is never formed.
"""

from __future__ import annotations

import torch
from torch.func import jvp

from fedrl_algos.core.trajectories import Trajectories, fitted_to_batch

__all__ = [
    "discounted_rewards_to_go",
    "relative_rewards_to_go",
    "reward_to_go_weights",
    "masked_log_prob",
    "autograd_score_gradient",
    "autograd_hvp",
    "policy_gradient",
    "hessian_vector_product",
]


def discounted_rewards_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``R^h = Σ_{t ≥ h} γ^t r_t`` along the last axis (absolute discounting)."""
    steps = rewards.shape[-1]
    discount = gamma ** torch.arange(steps, dtype=rewards.dtype, device=rewards.device)
    discounted = rewards * discount
    return discounted.flip(-1).cumsum(-1).flip(-1)


def relative_rewards_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G^h = Σ_{t ≥ h} γ^(t−h) r_t`` along the last axis (discounting relative to step h).

    ``G^h = R^h / γ^h`` in exact arithmetic, but that quotient overflows once ``γ^h`` underflows;
    the product with the upper-triangular matrix ``γ^(t−h)`` (``T × T``, underflowing harmlessly
    to 0 far from the diagonal) is exact at every length and one batched matmul.
    """
    steps = rewards.shape[-1]
    index = torch.arange(steps, device=rewards.device)
    lag = (index.unsqueeze(0) - index.unsqueeze(1)).to(rewards.dtype)  # [h, t] = t − h
    discount = torch.where(lag >= 0, gamma ** lag.clamp(min=0), 0.0)
    return rewards @ discount.transpose(0, 1)


def reward_to_go_weights(traj: Trajectories, gamma: float) -> torch.Tensor:
    """The step weights of eq. (2) and (3), ``ψ_h = mask_h R^h``: ``[*B, m, T]``."""
    return discounted_rewards_to_go(traj.rewards, gamma) * traj.mask


@fitted_to_batch
def masked_log_prob(policy, theta: torch.Tensor, traj: Trajectories) -> torch.Tensor:
    """``log π(a_h | s_h; θ)`` with 0 after termination: ``[*B, m, T]``.

    ``torch.where`` (not a product with the mask) keeps a ``-inf`` log-probability of a step after
    termination (states there are never reset and may leave the network's range) from becoming NaN.
    """
    logp = policy.log_prob(theta, traj.obs, traj.actions)
    return torch.where(traj.mask > 0, logp, torch.zeros_like(logp))


def autograd_score_gradient(
    policy,
    theta: torch.Tensor,
    traj: Trajectories,
    weights: torch.Tensor,
    traj_weights: torch.Tensor | None = None,
    per_trajectory: bool = False,
) -> torch.Tensor:
    """``(1/m) Σ_j c_j Σ_h ψ_{j,h} ∇log π(a_{j,h}|s_{j,h}; θ)`` by one autograd call: ``[*B, d]``.

    :param policy: any flat policy (only ``log_prob`` is used)
    :param theta: parameters ``[*B, d]``
    :param traj: trajectories ``[*B, m, T, ...]``
    :param weights: step weights ``ψ [*B, m, T]``, treated as constants
    :param traj_weights: per-trajectory weights ``c [*B, m]`` (default 1), treated as constants
    :param per_trajectory: return the un-averaged per-trajectory terms ``c_j Σ_h ψ ∇log π``
        ``[*B, m, d]`` instead (one autograd call: every trajectory gets its own copy of θ)
    """
    psi = weights.detach()
    if traj_weights is not None:
        psi = psi * traj_weights.detach().unsqueeze(-1)
    m = traj.n_trajectories
    with torch.enable_grad():
        if per_trajectory:
            batch = theta.shape[:-1]
            th = theta.detach().unsqueeze(-2).expand(*batch, m, theta.shape[-1]).contiguous().requires_grad_(True)
            # Each trajectory is its own batch row with one "trajectory" of T steps.
            one_each = Trajectories(
                traj.obs.unsqueeze(len(batch) + 1), traj.actions.unsqueeze(len(batch) + 1), traj.rewards.unsqueeze(-2), traj.mask.unsqueeze(-2)
            )
            (grad,) = torch.autograd.grad((masked_log_prob(policy, th, one_each) * psi.unsqueeze(-2)).sum(), th)
            return grad
        th = theta.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad((masked_log_prob(policy, th, traj) * psi).sum(), th)
    return grad / m


def autograd_hvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(1/m) Σ_ξ u(ξ; θ) v`` by automatic differentiation, for any policy: ``[*B, d]``.

    :param policy: any flat policy (only ``log_prob`` is used)
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]`` (or broadcastable to it)
    :param weights: step weights ``ψ [*B, m, T]`` of ``ν = Σ_h ψ_h log π(a_h|s_h)`` (eq. (3): ``R^h``)

    ``g(ξ)(∇log q(ξ)ᵀv)`` is ``∇_θ Σ_ξ c_ξ ν(ξ)`` with ``c_ξ = ∇log q(ξ)ᵀv`` held fixed, and ``c`` is
    one forward-mode JVP; ``∇²ν·v`` is the gradient of ``∇ν·v`` (double backward).
    """
    psi = weights.detach()
    # Forward-mode AD needs dense tensors (broadcast views share memory across rows).
    theta = theta.detach().contiguous()
    v = v.detach().to(theta.dtype).expand_as(theta).contiguous()

    def log_q(th: torch.Tensor) -> torch.Tensor:
        return masked_log_prob(policy, th, traj).sum(-1)

    _, directional = jvp(log_q, (theta,), (v,))
    with torch.enable_grad():
        th = theta.requires_grad_(True)
        nu = (masked_log_prob(policy, th, traj) * psi).sum(-1)
        (grad_nu,) = torch.autograd.grad(nu.sum(), th, create_graph=True)
        total = (directional.detach() * nu).sum() + (grad_nu * v).sum()
        (hv,) = torch.autograd.grad(total, th)
    return hv / traj.n_trajectories


@fitted_to_batch
def policy_gradient(policy, theta: torch.Tensor, traj: Trajectories, gamma: float, closed_form: bool = True) -> torch.Tensor:
    """The estimate of eq. (2), ``(1/m) Σ_ξ g(ξ; θ)``, for every batch row: ``[*B, d]``.

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param gamma: discount
    :param closed_form: let the policy compute it (its closed form where it has one); ``False``
        forces :func:`autograd_score_gradient` (for checks)
    """
    weights = reward_to_go_weights(traj, gamma)
    if not closed_form:
        return autograd_score_gradient(policy, theta, traj, weights)
    return policy.score_gradient(theta, traj, weights)


@fitted_to_batch
def hessian_vector_product(
    policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float, closed_form: bool = True
) -> torch.Tensor:
    """``Ĥv = (1/m) Σ_ξ u(ξ; θ) v``, the curvature estimate of eq. (3) applied to ``v``: ``[*B, d]``.

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]``
    :param gamma: discount
    :param closed_form: let the policy compute it (its closed form where it has one); ``False``
        forces :func:`autograd_hvp` (for checks)
    """
    weights = reward_to_go_weights(traj, gamma)
    if not closed_form:
        return autograd_hvp(policy, theta, traj, v, weights)
    return policy.hvp(theta, traj, v, weights)
