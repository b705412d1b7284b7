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
from fedrl_algos.core.tabular import probs_table

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

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]`` (or broadcastable to it)
    :param gamma: discount

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


def _tabular_index(policy, theta: torch.Tensor, traj: Trajectories) -> tuple[torch.Size, int, torch.Tensor, torch.Tensor]:
    """``(batch, rows, pos, key)``: every sample's state row ``pos = row·S + s_h`` and cell ``key = pos·A + a_h``.

    They index the flattened ``[rows·S]`` and ``[rows·S·A]`` tables, so the closed forms below are
    1-D gathers and ``index_add_`` sums over samples plus a few ``[rows, S, A]`` table operations.
    """
    batch = theta.shape[:-1]
    n_rows = batch.numel()
    offsets = torch.arange(n_rows, device=theta.device).unsqueeze(-1) * policy.n_states
    pos = (traj.obs.long().reshape(n_rows, -1) + offsets).reshape(-1)
    key = torch.add(traj.actions.long().reshape(-1), pos, alpha=policy.n_actions)
    return batch, n_rows, pos, key


def tabular_policy_gradient(policy, theta: torch.Tensor, traj: Trajectories, gamma: float) -> torch.Tensor:
    """Closed form of :func:`policy_gradient` for the tabular softmax: ``∇log π(a|s) = e_{s,a} − π(·|s)``.

    With ``W[s, a] = Σ_{(ξ,h): s_h=s, a_h=a} R^h`` (one ``index_add_`` over the samples) and
    ``W_s = Σ_a W[s, a]``, the sum ``Σ_{ξ,h} R^h (e_{s_h,a_h} − π(·|s_h))`` is ``W − W_s π(·|s)``:
    the same estimate as summing the per-sample terms, in O(samples + S·A) work.
    """
    batch, n_rows, _, key = _tabular_index(policy, theta, traj)
    s, a = policy.n_states, policy.n_actions
    reward_to_go = discounted_rewards_to_go(traj.rewards, gamma) * traj.mask
    w = torch.zeros(n_rows * s * a, dtype=reward_to_go.dtype, device=theta.device)
    w = w.index_add_(0, key, reward_to_go.reshape(-1)).view(n_rows, s, a)
    # softmax(θ[s, :]) per state, shared with the rollout that drew the batch (core.tabular)
    probs = probs_table(policy, theta).reshape(n_rows, s, a)
    grad = w - w.sum(-1, keepdim=True) * probs
    return grad.reshape(*batch, s * a) / traj.n_trajectories


def tabular_hvp(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float) -> torch.Tensor:
    """Closed form of :func:`autograd_hvp` for the tabular softmax.

    With ``π_s = π(·|s)``: ``∇log π(a|s)ᵀv = v[s,a] − π_s·v_s`` and
    ``∇²log π(a|s) v = −(π_s ⊙ v_s − π_s (π_s·v_s))`` on row ``s`` (independent of ``a``). With
    ``c_ξ = Σ_h (v[s_h,a_h] − π_{s_h}·v_{s_h})`` the per-sample weight ``R^h c_ξ`` multiplies the score
    ``e_{s,a} − π_s`` and ``R^h`` multiplies the second term, so, as in :func:`tabular_policy_gradient`,
    both sums over samples reduce to per-(s, a) sums: with ``U[s, a] = Σ R^h c_ξ`` and
    ``W[s, a] = Σ R^h`` over the samples in cell (s, a), the estimate is
    ``U − U_s π_s − W_s π_s ⊙ (v_s − π_s·v_s)``.
    """
    batch, n_rows, pos, key = _tabular_index(policy, theta, traj)
    s, a = policy.n_states, policy.n_actions
    reward_to_go = discounted_rewards_to_go(traj.rewards, gamma) * traj.mask
    probs = probs_table(policy, theta).reshape(n_rows, s, a)
    v_tab = v.to(theta.dtype).expand_as(theta).reshape(n_rows, s, a)
    pv = (probs * v_tab).sum(-1, keepdim=True)  # π_s·v_s, [rows, S, 1]
    score_dot_v = v_tab.reshape(-1).index_select(0, key) - pv.reshape(-1).index_select(0, pos)
    c = (score_dot_v.view(traj.mask.shape) * traj.mask).sum(-1, keepdim=True)  # ∇log q(ξ)ᵀv, [*B, m, 1]
    both = torch.stack([reward_to_go * c, reward_to_go]).reshape(2, -1)  # per-sample weights U, W
    cells = torch.zeros(2, n_rows * s * a, dtype=both.dtype, device=theta.device)
    cells = cells.index_add_(1, key, both).view(2, n_rows, s, a)
    u, w = cells[0], cells[1]
    hv = u - u.sum(-1, keepdim=True) * probs - w.sum(-1, keepdim=True) * probs * (v_tab - pv)
    return hv.reshape(*batch, s * a) / traj.n_trajectories


def hessian_vector_product(
    policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float, closed_form: bool | None = None
) -> torch.Tensor:
    """``Ĥv = (1/m) Σ_ξ u(ξ; θ) v``, the paper's curvature estimate applied to ``v``: ``[*B, d]``.

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]``
    :param gamma: discount
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
