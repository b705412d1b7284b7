"""Policy-gradient and policy-Hessian estimators (paper section 2, eq. (2)–(3)).

Notation: a trajectory ξ = (s_0, a_0, …, s_H, a_H); ``R^h = Σ_{t ≥ h} γ^t r_t`` is the reward-to-go
with *absolute* discounting (as in the paper, so that E[g] = ∇J exactly); ``ν(ξ; θ) = Σ_h log π(a_h|s_h) R^h``
and ``log q(ξ; θ) = Σ_h log π(a_h|s_h) + const``. Then

* ``g(ξ; θ) = ∇ν = Σ_h ∇log π(a_h|s_h) R^h`` with ``E[g] = ∇J``;
* ``u(ξ; θ) = g ∇log qᵀ + ∇²ν`` with ``E[u] = ∇²J``.

``u`` is never formed: :func:`hessian_vector_product` returns the batch mean of ``u(ξ)·v`` either by
autograd (a forward-mode JVP of ``log q`` along ``v`` for the rank-one part, a double backward for
``∇²ν·v``; any policy) or in closed form for the tabular softmax (:func:`tabular_hvp`) and the
one-hidden-layer softmax MLP (:func:`fedrl_algos.core.mlp_hvp.mlp_hvp`).
"""

from __future__ import annotations

import torch
from torch.func import jvp

from fedrl_algos.core.rollout import Trajectories

__all__ = [
    "discounted_rewards_to_go",
    "policy_gradient",
    "hessian_vector_product",
    "autograd_hvp",
    "tabular_policy_gradient",
    "tabular_hvp",
]


def discounted_rewards_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``R^h = Σ_{t ≥ h} γ^t r_t`` along the last axis (absolute discounting)."""
    steps = rewards.shape[-1]
    discount = gamma ** torch.arange(steps, dtype=rewards.dtype, device=rewards.device)
    discounted = rewards * discount
    return discounted.flip(-1).cumsum(-1).flip(-1)


def _is_tabular(policy: object) -> bool:
    from fedrl_algos.policies import TabularPolicy

    return isinstance(policy, TabularPolicy)


def _is_softmax_mlp(policy: object) -> bool:
    from fedrl_algos.core.mlp_hvp import is_softmax_mlp

    return is_softmax_mlp(policy)


def _masked_log_prob(policy, theta: torch.Tensor, traj: Trajectories) -> torch.Tensor:
    return policy.log_prob(theta, traj.obs, traj.actions) * traj.mask


def policy_gradient(
    policy, theta: torch.Tensor, traj: Trajectories, gamma: float, closed_form: bool | None = None
) -> torch.Tensor:
    """REINFORCE estimate ``(1/m) Σ_ξ g(ξ; θ)`` for every batch row: ``[*B, d]``.

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param gamma: discount
    :param closed_form: use the closed form (default: whenever there is one — the tabular softmax,
        or the one-hidden-layer softmax MLP of :mod:`fedrl_algos.core.mlp_hvp`)
    """
    if closed_form is None:
        closed_form = _is_tabular(policy) or _is_softmax_mlp(policy)
    if closed_form:
        if _is_softmax_mlp(policy):
            from fedrl_algos.core.mlp_hvp import mlp_policy_gradient

            return mlp_policy_gradient(policy, theta, traj, gamma)
        return tabular_policy_gradient(policy, theta, traj, gamma)
    reward_to_go = discounted_rewards_to_go(traj.rewards, gamma)
    with torch.enable_grad():
        th = theta.detach().requires_grad_(True)
        surrogate = (_masked_log_prob(policy, th, traj) * reward_to_go).sum()
        (grad,) = torch.autograd.grad(surrogate, th)
    return grad / traj.n_trajectories


def autograd_hvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float) -> torch.Tensor:
    """``(1/m) Σ_ξ u(ξ; θ) v`` by automatic differentiation, for any policy: ``[*B, d]``.

    ``g(ξ)(∇log q(ξ)ᵀv)`` is ``∇_θ Σ_ξ c_ξ ν(ξ)`` with ``c_ξ = ∇log q(ξ)ᵀv`` held fixed, and ``c`` is
    one forward-mode JVP; ``∇²ν·v`` is the gradient of ``∇ν·v`` (double backward).
    """
    reward_to_go = discounted_rewards_to_go(traj.rewards, gamma)
    # Forward-mode AD needs dense tensors (broadcast views share memory across rows).
    theta = theta.detach().contiguous()
    v = v.detach().to(theta.dtype).expand_as(theta).contiguous()

    def log_q(th: torch.Tensor) -> torch.Tensor:
        return _masked_log_prob(policy, th, traj).sum(-1)

    _, directional = jvp(log_q, (theta,), (v,))
    with torch.enable_grad():
        th = theta.requires_grad_(True)
        nu = (_masked_log_prob(policy, th, traj) * reward_to_go).sum(-1)
        (grad_nu,) = torch.autograd.grad(nu.sum(), th, create_graph=True)
        total = (directional.detach() * nu).sum() + (grad_nu * v).sum()
        (hv,) = torch.autograd.grad(total, th)
    return hv / traj.n_trajectories


def _tabular_pieces(policy, theta: torch.Tensor, traj: Trajectories):
    batch = theta.shape[:-1]
    probs = torch.softmax(policy.logits(theta, traj.obs), dim=-1)  # [*B, m, T, A]
    onehot = torch.nn.functional.one_hot(traj.actions.long(), policy.n_actions).to(theta.dtype)
    return batch, probs, onehot


def _scatter_rows(policy, batch: torch.Size, obs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Sum per-(traj, time) row contributions ``[*B, m, T, A]`` into ``[*B, S*A]`` by state."""
    n_actions = policy.n_actions
    idx = obs.long().reshape(*batch, -1, 1).expand(*batch, -1, n_actions)
    out = torch.zeros(*batch, policy.n_states, n_actions, dtype=weights.dtype, device=weights.device)
    out.scatter_add_(-2, idx, weights.reshape(*batch, -1, n_actions))
    return out.reshape(*batch, policy.n_states * n_actions)


def tabular_policy_gradient(policy, theta: torch.Tensor, traj: Trajectories, gamma: float) -> torch.Tensor:
    """Closed form of :func:`policy_gradient` for the tabular softmax: ``∇log π(a|s) = e_{s,a} − π(·|s)``."""
    batch, probs, onehot = _tabular_pieces(policy, theta, traj)
    reward_to_go = discounted_rewards_to_go(traj.rewards, gamma) * traj.mask
    weights = reward_to_go.unsqueeze(-1) * (onehot - probs)
    return _scatter_rows(policy, batch, traj.obs, weights) / traj.n_trajectories


def tabular_hvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float) -> torch.Tensor:
    """Closed form of :func:`autograd_hvp` for the tabular softmax.

    With ``π_s = π(·|s)``: ``∇log π(a|s)ᵀv = v[s,a] − π_s·v_s`` and
    ``∇²log π(a|s) v = −(π_s ⊙ v_s − π_s (π_s·v_s))`` on row ``s`` (independent of ``a``).
    """
    batch, probs, onehot = _tabular_pieces(policy, theta, traj)
    reward_to_go = discounted_rewards_to_go(traj.rewards, gamma) * traj.mask
    v_rows = policy.logits(v.to(theta.dtype), traj.obs)  # v[s_h, :] for every (ξ, h)
    pv = (probs * v_rows).sum(-1, keepdim=True)
    score_dot_v = ((onehot * v_rows).sum(-1, keepdim=True) - pv).squeeze(-1) * traj.mask
    c = score_dot_v.sum(-1, keepdim=True)  # ∇log q(ξ)ᵀv, [*B, m, 1]
    weights = reward_to_go.unsqueeze(-1) * (c.unsqueeze(-1) * (onehot - probs) - probs * (v_rows - pv))
    return _scatter_rows(policy, batch, traj.obs, weights) / traj.n_trajectories


def hessian_vector_product(
    policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float, closed_form: bool | None = None
) -> torch.Tensor:
    """``Ĥv = (1/m) Σ_ξ u(ξ; θ) v``, the paper's curvature estimate applied to ``v``: ``[*B, d]``.

    :param closed_form: use the closed form (default: whenever there is one — the tabular softmax,
        or the one-hidden-layer softmax MLP of :mod:`fedrl_algos.core.mlp_hvp`)
    """
    if closed_form is None:
        closed_form = _is_tabular(policy) or _is_softmax_mlp(policy)
    if closed_form:
        if _is_softmax_mlp(policy):
            from fedrl_algos.core.mlp_hvp import mlp_hvp

            return mlp_hvp(policy, theta, traj, v, gamma)
        return tabular_hvp(policy, theta, traj, v, gamma)
    return autograd_hvp(policy, theta, traj, v, gamma)
