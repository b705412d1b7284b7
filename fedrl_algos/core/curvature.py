"""Curvature estimators ``Ĥv ≈ ∇²J(θ) v`` of the exact Per-FedAvg-PG variant: the paper's, a causal
baseline-corrected one (unbiased, lower variance) and ProMP's LVC (biased).

Notation as in :mod:`fedrl_algos.core.estimators`: ``ℓ_h = log π(a_h|s_h; θ)`` (0 after termination),
``s_h = ∇ℓ_h``, ``c_h = s_hᵀv``, ``C_h = Σ_{t ≤ h} c_t`` (``C_{-1} = 0``), step weights ``Ψ_h`` (0 after
termination). All three estimators have the form

    Ĥv = (1/m) Σ_ξ [ Σ_h ω_h s_h + Σ_h Ψ_h ∇²ℓ_h v ]

and differ only in how the directional scores enter the first-order weights ``ω_h`` (the *coupling*,
:func:`coupled_score_weights`) and in ``Ψ``:

* ``"paper"`` — eq. (3), ``u(ξ) = g ∇log qᵀ + ∇²ν``: ``Ψ_h = R^h`` (reward-to-go) and
  ``ω_h = Ψ_h C_H`` (every score of the episode multiplies every reward-to-go). Unbiased.
* ``"causal"`` — the Hessian of the DiCE surrogate ``Σ_t (γ^t r_t − b_t) ⊡(a_{≤t})``, i.e.
  ``Σ_t (γ^t r_t − b_t) [S_t S_tᵀ + Σ_{t' ≤ t} ∇²ℓ_{t'}]`` with ``S_t = Σ_{t' ≤ t} s_{t'}``: each
  reward multiplies only the scores of the steps up to it. Summing by parts, with
  ``Ψ_h = Σ_{t ≥ h} (γ^t r_t − b_t)`` (reward-to-go minus baseline-to-go), the first-order weights
  are ``ω_h = Ψ_h C_{h−1} + Σ_{t ≥ h} Ψ_t c_t`` (the pair (h, t) of scores gets ``Ψ_{max(h,t)}``).
  Unbiased for any baseline independent of the trajectory: the batch's leave-one-out mean
  (:func:`~fedrl_algos.core.gpomdp.gpomdp_weights` with ``"loo"``). Derivation in
  ``docs/algorithms/per_fedavg_pg.md``.
* ``"lvc"`` — ProMP's low-variance curvature (Rothfuss et al. 2019), the Hessian of
  ``Σ_t [π(a_t|s_t)/⊥π(a_t|s_t)] Ψ_t``: ``ω_h = Ψ_h c_h`` (only the diagonal pairs h = t), same
  ``Ψ`` as ``"causal"``. **Biased**: it drops the cross terms ``s_h s_tᵀ`` (h ≠ t) of the exact Hessian.

Everything is batched over ``[*B, m, T]`` like the paper's estimator and never forms a ``d × d``
matrix; the tabular softmax and the paper's MLP compute it in closed form
(:meth:`~fedrl_algos.policies.FlatPolicy.curvature_hvp`), any policy by autograd
(:func:`autograd_curvature_hvp`).

Whatever the estimator, the exact variant's step is ``ĝ_out + αĤĝ_out``, and from a small batch the
term ``αĤĝ_out`` is both long and noisy: on arc navigation after 50–100 first-order rounds, at m_h = 50,
it is a median 1.7–2.7 times as long as ``ĝ_out`` (up to 18 times), and the step's total variance is
8–13 times the first-order one. :func:`clip_curvature_term` bounds it relative to ``ĝ_out`` (a trust
region on the preconditioner ``I + αĤ``; **biased** where it acts; measured in
``docs/algorithms/per_fedavg_pg.md``).
"""

from __future__ import annotations

import torch
from torch.func import jvp

from fedrl_algos.core.estimators import autograd_hvp, hessian_vector_product, masked_log_prob, reward_to_go_weights
from fedrl_algos.core.gpomdp import gpomdp_weights
from fedrl_algos.core.trajectories import Trajectories, fitted_to_batch

__all__ = [
    "CURVATURES",
    "check_curvature",
    "coupled_score_weights",
    "curvature_weights",
    "autograd_curvature_hvp",
    "curvature_hvp",
    "curvature_vector_product",
    "check_curvature_clip",
    "clip_curvature_term",
]

#: accepted values of every ``curvature`` argument (``"paper"``: eq. (3), the default)
CURVATURES = ("paper", "causal", "lvc")


def check_curvature(curvature: str) -> str:
    """``curvature`` if it is one of :data:`CURVATURES`, else ``ValueError`` naming the argument."""
    if not isinstance(curvature, str) or curvature not in CURVATURES:
        raise ValueError(f"curvature must be one of {CURVATURES}, got {curvature!r}")
    return curvature


def check_curvature_clip(curvature_clip: float | None) -> float | None:
    """``curvature_clip`` as a float if it is ``None`` or a positive finite number; else ``TypeError``
    (not a number) or ``ValueError`` naming the argument."""
    if curvature_clip is None:
        return None
    if isinstance(curvature_clip, bool) or not isinstance(curvature_clip, (int, float)):
        raise TypeError(f"curvature_clip must be None or a positive number, got {type(curvature_clip).__name__}")
    value = float(curvature_clip)
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"curvature_clip must be None or a positive finite number, got {curvature_clip!r}")
    return value


def clip_curvature_term(term: torch.Tensor, g_out: torch.Tensor, max_ratio: float | None) -> torch.Tensor:
    """The curvature term ``αĤĝ_out`` of each row, shortened where needed so that
    ``‖term‖ ≤ max_ratio · ‖ĝ_out‖`` (its direction kept): ``[*B, d]``.

    Rows within the bound are returned unchanged (bitwise), so the step equals eq. (7)'s wherever
    the bound does not act, and ``max_ratio=None`` returns ``term`` itself. The bound scales with
    ``ĝ_out`` because the term is linear in it: a row's step ``ĝ_out + term`` is at most
    ``(1 + max_ratio)‖ĝ_out‖`` long.

    :param term: ``αĤĝ_out`` per row ``[*B, d]``
    :param g_out: the outer gradient ``ĝ_out`` of the same rows ``[*B, d]``
    :param max_ratio: the bound ``c`` (``None``: no bound)
    """
    if max_ratio is None:
        return term
    norm = torch.linalg.vector_norm(term, dim=-1, keepdim=True)
    limit = max_ratio * torch.linalg.vector_norm(g_out, dim=-1, keepdim=True)
    factor = limit / norm.clamp_min(torch.finfo(norm.dtype).tiny)
    return torch.where(norm > limit, term * factor, term)


def coupled_score_weights(score_v: torch.Tensor, weights: torch.Tensor, coupling: str) -> torch.Tensor:
    """First-order weights ``ω [*B, m, T]`` of the estimator ``coupling`` (module docstring).

    :param score_v: directional scores ``c_h = ∇ℓ_hᵀv``, 0 after termination: ``[*B, m, T]``
    :param weights: step weights ``Ψ [*B, m, T]``
    :param coupling: ``"paper"``, ``"causal"`` or ``"lvc"``
    """
    if coupling == "paper":
        return weights * score_v.sum(-1, keepdim=True)
    if coupling == "lvc":
        return weights * score_v
    if coupling == "causal":
        # Ψ_h C_{h-1} + Σ_{t≥h} Ψ_t c_t: an exclusive prefix sum and a suffix sum, no differences
        # of large numbers (the form ω_h = Σ_{t≥h}(Ψ_t − Ψ_{t+1}) C_t would cancel).
        before = torch.cat([torch.zeros_like(score_v[..., :1]), score_v[..., :-1].cumsum(-1)], dim=-1)
        after = (weights * score_v).flip(-1).cumsum(-1).flip(-1)
        return weights * before + after
    raise ValueError(f"coupling must be one of {CURVATURES}, got {coupling!r}")


def curvature_weights(traj: Trajectories, gamma: float, curvature: str) -> torch.Tensor:
    """The step weights ``Ψ [*B, m, T]`` of ``curvature``, computed on the whole batch.

    ``"paper"``: ``R^h`` (:func:`~fedrl_algos.core.estimators.reward_to_go_weights`); ``"causal"`` and
    ``"lvc"``: ``R^h − B^h`` with ``B^h`` the leave-one-out mean of the other trajectories' ``R^h``
    (over those still running at h), 0 with one trajectory. The baseline couples the trajectories
    of a batch, so a chunked product must compute these weights before chunking.
    """
    check_curvature(curvature)
    if curvature == "paper":
        return reward_to_go_weights(traj, gamma)
    return gpomdp_weights(traj, gamma, "loo")


def _step_score_directional(policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor) -> torch.Tensor:
    """``c_h = ∇ℓ_hᵀv`` for every step (one forward-mode JVP), 0 after termination: ``[*B, m, T]``."""
    _, directional = jvp(lambda th: masked_log_prob(policy, th, traj), (theta,), (v,))
    return directional


def autograd_curvature_hvp(
    policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor, coupling: str
) -> torch.Tensor:
    """``(1/m) Σ_ξ [Σ_h ω_h s_h + Σ_h Ψ_h ∇²ℓ_h v]`` by automatic differentiation, for any policy: ``[*B, d]``.

    :param policy: any flat policy (only ``log_prob`` is used)
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]`` (or broadcastable to it)
    :param weights: step weights ``Ψ [*B, m, T]``
    :param coupling: ``"paper"``, ``"causal"`` or ``"lvc"`` (:func:`coupled_score_weights`)

    ``Σ_h ω_h s_h`` is the gradient of ``Σ_h ω_h ℓ_h`` with ω held fixed (ω from one JVP giving every
    step's ``c_h``); ``Σ_h Ψ_h ∇²ℓ_h v`` is the gradient of ``(Σ_h Ψ_h s_h)ᵀv`` (double backward).
    ``"paper"`` is :func:`~fedrl_algos.core.estimators.autograd_hvp` itself.
    """
    if coupling == "paper":
        return autograd_hvp(policy, theta, traj, v, weights)
    psi = weights.detach()
    theta = theta.detach().contiguous()
    v = v.detach().to(theta.dtype).expand_as(theta).contiguous()
    omega = coupled_score_weights(_step_score_directional(policy, theta, traj, v).detach(), psi, coupling)
    with torch.enable_grad():
        th = theta.requires_grad_(True)
        logp = masked_log_prob(policy, th, traj)
        (grad_nu,) = torch.autograd.grad((logp * psi).sum(), th, create_graph=True)
        total = (omega * logp).sum() + (grad_nu * v).sum()
        (hv,) = torch.autograd.grad(total, th)
    return hv / traj.n_trajectories


@fitted_to_batch
def curvature_hvp(
    policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor, coupling: str,
    closed_form: bool = True,
) -> torch.Tensor:
    """``(1/m) Σ_ξ [Σ_h ω_h s_h + Σ_h Ψ_h ∇²ℓ_h v]`` with the given weights: ``[*B, d]``.

    :param policy: a flat policy; its ``curvature_hvp`` (closed form where it has one) is used when
        it has that method, :func:`autograd_curvature_hvp` otherwise
    :param theta: parameters ``[*B, d]``; :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]``; :param weights: ``Ψ [*B, m, T]`` (:func:`curvature_weights`)
    :param coupling: ``"paper"``, ``"causal"`` or ``"lvc"``
    :param closed_form: ``False`` forces :func:`autograd_curvature_hvp` (for checks)
    """
    check_curvature(coupling)
    method = getattr(policy, "curvature_hvp", None)
    if not closed_form or method is None:
        return autograd_curvature_hvp(policy, theta, traj, v, weights, coupling)
    return method(theta, traj, v, weights, coupling)


@fitted_to_batch
def curvature_vector_product(
    policy, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, gamma: float, curvature: str = "paper",
    closed_form: bool = True,
) -> torch.Tensor:
    """``Ĥv`` of the estimator ``curvature`` from one batch (module docstring): ``[*B, d]``.

    ``"paper"`` is exactly :func:`~fedrl_algos.core.estimators.hessian_vector_product` (same
    operations, same result).

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]``
    :param gamma: discount
    :param curvature: ``"paper"`` (eq. (3)), ``"causal"`` (unbiased, baseline-corrected) or ``"lvc"`` (biased)
    :param closed_form: ``False`` forces autograd (for checks)
    """
    check_curvature(curvature)
    if curvature == "paper":
        return hessian_vector_product(policy, theta, traj, v, gamma, closed_form)
    return curvature_hvp(policy, theta, traj, v, curvature_weights(traj, gamma, curvature), curvature, closed_form)
