"""The linear feature baseline (garage's ``LinearFeatureBaseline``), cross-fitted so the estimate stays unbiased.

A state-dependent baseline ``b_{j,h} = φ(s_{j,h}, h)ᵀ w`` for the step weights of GPOMDP/REINFORCE
(:mod:`fedrl_algos.core.gpomdp`). The features are garage's, per step,

    φ(s, h) = [s, s², h/100, (h/100)², (h/100)³, 1]      (s: the flattened observation clipped to [−10, 10]),

or, for integer (``Discrete``) observations such as the tabular gridworld's state index,
``[onehot(s), h/100, (h/100)², (h/100)³, 1]`` (``onehot(s)² = onehot(s)`` adds nothing). ``w``
minimises the ridge-regularised squared error ``Σ mask (φᵀw − y)² + λ‖w‖²`` against the
returns-to-go ``y`` of running steps (``mask > 0``; the steps after termination are left out).

**Which batch the fit uses: cross-fitting.** A baseline keeps the policy gradient unbiased only if
it is independent of the trajectory j it is subtracted from, given ``s_{j,h}``: then
``E[b(s_{j,h}) ∇log π(a_{j,h}|s_{j,h})] = 0``. A ``w`` fitted on a batch that contains j depends on
j's own actions and returns (with one-hot features and few trajectories it nearly reproduces j's
returns and shrinks ψ towards 0). garage fits ``w`` on the *previous* iteration's batch; that needs
per-agent state carried from step to step — through rounds, through the server's averaging of θ
(after which the previous batch was drawn by another policy), through Flower's messages and saved
models — and at the first step there is no previous batch. Here the ``m`` trajectories of each
batch row are dealt into ``K`` folds (trajectory j goes to fold ``j mod K``; an interleaved deal,
so a batch whose tail is masked out — FedPG-BR's ``B_t < B_max`` — still fills every fold) and the
baseline of fold k's trajectories is fitted on the other ``K − 1`` folds (leave-one-fold-out). The
trajectories of a batch are independent, so ``b_{j,h}`` is independent of trajectory j and
every estimator built on it stays unbiased — also MFPO's and FedPG-BR's importance-weighted paired
gradients (``E_θ[w_j Σ_h (R^h_j − b(s_{j,h})) ∇log π_{θ'}(a|s)] = ∇J(θ')``, the baseline term vanishing
under θ' step by step). It is stateless: nothing is kept across steps or rounds, nothing travels
in Flower's messages, and a saved model needs nothing new.

``K = min(10, m)`` by default (:data:`LINEAR_FOLDS`): each fit sees ``(K−1)/K`` of the batch. Fewer
folds fit on less data and the baseline is worse — on the gridworld (GPOMDP, γ = 0.9, random θ) the
trace of the estimate's covariance relative to ``"loo"`` was 0.86 with K = 2, 0.74 with K = 5 and
0.72 with K = m = 20; at m = 5, K = 2 (fits on 2 trajectories) was *worse* than ``"loo"`` (1.14)
and K = 5 better (0.97); at m = 100, K = 10 and K = 100 gave 0.62 and 0.61. Ten folds keep the
work at ten ``p × p`` systems per batch row whatever m is.

**Range clipping.** ``φᵀw_{−k}`` is clipped to ``[min, max]`` of the targets that fold k's fit saw
(the running steps of the other folds), so it is still a function of the other trajectories only.
A fit on a few short episodes extrapolates badly to a longer held-out one (the cubic time
polynomial, the squared observations), and one such baseline far outside every observed return
makes a huge step weight: on CartPole at the initial MLP policy with m = 5 the unclipped fit had
6.9× the variance of ``"loo"`` on one agent (1.4× clipped); where the fit is good (the gridworld)
clipping changes nothing measurable. ``λ`` is garage's 1e-5. Measurements:
``docs/algorithms/baselines.md``.

Everything is batched over the leading dimensions ``[*B]`` (runs, agents) and the folds: one
Gram matrix per fold from one batched matmul, one batched ``torch.linalg.solve``; no loop over
agents, trajectories or folds. The fit runs in float64 whatever the trajectories' dtype (the
systems are ``p × p`` with ``p = 2·obs_dim + 4``; float32 Gram matrices of thousands of steps lose
the small ridge) and the baseline is returned in the targets' dtype.
"""

from __future__ import annotations

import math

import torch

from fedrl_algos.core.trajectories import Trajectories

__all__ = [
    "LINEAR_FOLDS",
    "LINEAR_RIDGE",
    "MAX_LINEAR_FEATURES",
    "linear_features",
    "fit_linear",
    "cross_fitted_linear_baseline",
    "linear_baseline",
]

#: folds of the cross-fit, at most (each trajectory's baseline is fitted on the other K − 1 folds)
LINEAR_FOLDS = 10
#: ridge coefficient λ of the least-squares fit (garage's ``reg_coeff``)
LINEAR_RIDGE = 1e-5
#: the most features a fit takes: observations with more values (images) are refused
MAX_LINEAR_FEATURES = 2048
#: the time feature is ``h / TIME_SCALE`` (garage's)
TIME_SCALE = 100.0
#: observations are clipped to ``[−OBS_CLIP, OBS_CLIP]`` before the features (garage's)
OBS_CLIP = 10.0


def linear_features(obs: torch.Tensor, batch_dims: int, n_states: int | None = None) -> torch.Tensor:
    """The features ``φ(s_{j,h}, h)`` of every step: ``[*B, m, T, p]``, float64.

    :param obs: observations ``[*B, m, T, *obs_shape]`` (``Trajectories.obs``)
    :param batch_dims: how many leading axes are ``[*B, m, T]`` (``traj.rewards.dim()``)
    :param n_states: for integer scalar observations, the number of states of the one-hot
        encoding (default ``obs.max() + 1``, which gives the same fit: states absent from the batch
        have zero columns and get weight 0; it costs one host synchronisation)
    :raise ValueError: for observations with so many values that the features exceed
        :data:`MAX_LINEAR_FEATURES` (images: use ``baseline="loo"``)
    """
    if batch_dims < 1 or obs.dim() < batch_dims:
        raise ValueError(f"obs must have at least batch_dims={batch_dims} axes [*B, m, T], got shape {tuple(obs.shape)}")
    lead = obs.shape[:batch_dims]
    n_steps = lead[-1]
    t = torch.arange(n_steps, device=obs.device, dtype=torch.float64) / TIME_SCALE
    time = torch.stack((t, t**2, t**3, torch.ones_like(t)), -1).expand(*lead, 4)
    if obs.dim() == batch_dims and not (obs.is_floating_point() or obs.is_complex()) and obs.dtype != torch.bool:
        n = int(obs.max()) + 1 if n_states is None else int(n_states)
        if n + 4 > MAX_LINEAR_FEATURES:
            raise ValueError(f"baseline='linear' one-hot encodes the {n} states in {n + 4} features, more than "
                             f"MAX_LINEAR_FEATURES={MAX_LINEAR_FEATURES}; use baseline='loo'")
        state = torch.nn.functional.one_hot(obs.clamp(min=0, max=n - 1), n).to(torch.float64)
        return torch.cat((state, time), -1)
    flat = obs.reshape(*lead, -1).to(torch.float64)
    p = 2 * flat.shape[-1] + 4
    if p > MAX_LINEAR_FEATURES:
        raise ValueError(f"baseline='linear' fits {p} features to observations of {flat.shape[-1]} values, more than "
                         f"MAX_LINEAR_FEATURES={MAX_LINEAR_FEATURES} (image observations); use baseline='loo'")
    flat = flat.clamp(-OBS_CLIP, OBS_CLIP)
    return torch.cat((flat, flat**2, time), -1)


def fit_linear(gram: torch.Tensor, moment: torch.Tensor, ridge: float = LINEAR_RIDGE) -> torch.Tensor:
    """``w = (G + λI)⁻¹ c`` for every batch row: ``[*B, p]``.

    ``G + λI`` is symmetric positive definite for ``λ > 0`` (``G = XᵀX``), so the batched solve
    always succeeds; a row without data (``G = 0``, ``c = 0``) gets ``w = 0``.

    :param gram: ``XᵀX`` ``[*B, p, p]`` over the steps fitted (masked)
    :param moment: ``Xᵀy`` ``[*B, p]``
    :param ridge: λ > 0
    """
    if not ridge > 0:
        raise ValueError(f"ridge must be > 0, got {ridge!r}")
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram + ridge * eye, moment.unsqueeze(-1)).squeeze(-1)


def _fold_sums(
    features: torch.Tensor, targets: torch.Tensor, alive: torch.Tensor, folds: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-fold ``XᵀX`` ``[*B, K, p, p]``, ``Xᵀy`` ``[*B, K, p]`` and the smallest and largest target
    ``[*B, K]`` (±inf for a fold without a running step) of the running steps, trajectory j in fold
    ``j mod K`` (the batch is padded with masked trajectories to a multiple of K, then reshaped so
    that each fold's steps are one matrix)."""
    *batch, m, n_steps, p = features.shape
    pad = (-m) % folds
    if pad:
        features = torch.nn.functional.pad(features, (0, 0, 0, 0, 0, pad))
        targets = torch.nn.functional.pad(targets, (0, 0, 0, pad))
        alive = torch.nn.functional.pad(alive, (0, 0, 0, pad))
    rows = (m + pad) // folds
    # [*B, rows, K, T, ...] -> [*B, K, rows·T, ...]: trajectory rows·r + k sits in fold k
    x = features.reshape(*batch, rows, folds, n_steps, p).transpose(-4, -3).reshape(*batch, folds, rows * n_steps, p)
    a = alive.reshape(*batch, rows, folds, n_steps).transpose(-3, -2).reshape(*batch, folds, rows * n_steps)
    y = targets.reshape(*batch, rows, folds, n_steps).transpose(-3, -2).reshape(*batch, folds, rows * n_steps)
    # where, not a product: a stopped step's observation or target never enters (not even as NaN)
    stopped = a <= 0
    x = x.masked_fill(stopped.unsqueeze(-1), 0.0)
    low = y.masked_fill(stopped, math.inf).amin(-1)
    high = y.masked_fill(stopped, -math.inf).amax(-1)
    y = y.masked_fill(stopped, 0.0)
    return x.transpose(-1, -2) @ x, (x.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1), low, high


def _exclusive(per_fold: torch.Tensor, axis: int, scan, identity: float) -> torch.Tensor:
    """The exclusive prefix and suffix ``scan`` (a cumulative sum, max or min) of every fold along
    ``axis``: combined, a reduction over the *other* folds in which fold k's own values never enter
    (not even through rounding, as they would in ``total − own``)."""
    edge = torch.full_like(per_fold.narrow(axis, 0, 1), identity)
    n = per_fold.shape[axis]
    prefix = torch.cat((edge, scan(per_fold, axis).narrow(axis, 0, n - 1)), axis)
    suffix = torch.cat((scan(per_fold.flip(axis), axis).narrow(axis, 0, n - 1).flip(axis), edge), axis)
    return prefix, suffix


def _others_sum(per_fold: torch.Tensor, axis: int) -> torch.Tensor:
    prefix, suffix = _exclusive(per_fold, axis, torch.cumsum, 0.0)
    return prefix + suffix


def _others_range(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest target of the other folds ``[*B, K]``; ``(0, 0)`` where they have none."""
    lo = torch.minimum(*_exclusive(low, -1, lambda x, d: torch.cummin(x, d).values, math.inf))
    hi = torch.maximum(*_exclusive(high, -1, lambda x, d: torch.cummax(x, d).values, -math.inf))
    empty = lo > hi
    return torch.where(empty, torch.zeros_like(lo), lo), torch.where(empty, torch.zeros_like(hi), hi)


def cross_fitted_linear_baseline(
    features: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    folds: int = LINEAR_FOLDS,
    ridge: float = LINEAR_RIDGE,
    clip: bool = True,
) -> torch.Tensor:
    """``b_{j,h} = φ_{j,h}ᵀ w_{−k(j)}`` with ``w_{−k}`` fitted on every fold but trajectory j's: ``[*B, m, T]``.

    Trajectory j is in fold ``k(j) = j mod K`` with ``K = min(folds, m)``; ``w_{−k}`` is the ridge
    least-squares fit (:func:`fit_linear`) of ``targets`` on ``features`` over the running steps
    (``mask > 0``) of the other folds. The baseline of trajectory j is thus a function of the
    other trajectories (and of j's own states and time steps) only; see the module docstring. With
    one trajectory there is nothing to fit on and the baseline is 0 (as ``"loo"``'s).

    :param features: ``φ`` ``[*B, m, T, p]`` (:func:`linear_features`)
    :param targets: the values fitted, e.g. rewards-to-go ``[*B, m, T]``
    :param mask: ``[*B, m, T]``; steps with ``mask <= 0`` are not fitted
    :param folds: K ≥ 2 (``folds >= m``: leave-one-trajectory-out)
    :param ridge: λ > 0
    :param clip: clip ``φᵀw_{−k}`` to the range of the targets of the other folds (see the module
        docstring)
    :return: the baseline in ``targets``' dtype; 0 where ``mask <= 0``
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"folds must be an int >= 2, got {folds!r}")
    m = features.shape[-3]
    if m < 2:
        return torch.zeros_like(targets)
    k = min(folds, m)
    alive = (mask > 0).to(torch.float64)
    gram, moment, low, high = _fold_sums(features, targets.to(torch.float64), alive, k)
    # leave-one-fold-out: fold k's weights and target range from the other folds
    w = fit_linear(_others_sum(gram, -3), _others_sum(moment, -2), ridge)  # [*B, K, p]
    low, high = _others_range(low, high)  # [*B, K]
    fold_of = torch.arange(m, device=features.device) % k
    w_j = w.index_select(-2, fold_of)  # [*B, m, p]
    baseline = (features @ w_j.unsqueeze(-1)).squeeze(-1)
    if clip:
        baseline = torch.minimum(torch.maximum(baseline, low.index_select(-1, fold_of).unsqueeze(-1)),
                                 high.index_select(-1, fold_of).unsqueeze(-1))
    return baseline.masked_fill(alive <= 0, 0.0).to(targets.dtype)


def linear_baseline(
    traj: Trajectories,
    targets: torch.Tensor,
    folds: int = LINEAR_FOLDS,
    ridge: float = LINEAR_RIDGE,
    n_states: int | None = None,
    clip: bool = True,
) -> torch.Tensor:
    """The cross-fitted linear feature baseline of ``targets`` for the trajectories ``traj``: ``[*B, m, T]``.

    :param traj: trajectories ``[*B, m, T, ...]`` (their observations, time steps and mask)
    :param targets: the values fitted ``[*B, m, T]`` (e.g. the rewards-to-go)
    :param folds: K of :func:`cross_fitted_linear_baseline`
    :param ridge: λ of :func:`fit_linear`
    :param n_states: states of the one-hot encoding of integer observations (:func:`linear_features`)
    :param clip: clip to the range of the other folds' targets (:func:`cross_fitted_linear_baseline`)
    """
    features = linear_features(traj.obs, traj.rewards.dim(), n_states)
    return cross_fitted_linear_baseline(features, targets, traj.mask, folds, ridge, clip)
