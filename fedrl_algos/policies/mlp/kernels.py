"""Closed-form kernels of the one-hidden-layer softmax MLP policy (the paper's arc-navigation net).

For ``π(·|x; θ) = softmax(W2ᵀ tanh(W1ᵀx + b1) + b2)`` (:class:`~fedrl_algos.policies.MlpPolicy` with
one ``tanh`` hidden layer and a ``Discrete`` action space) this module computes, without autograd
(``MlpPolicy.score_gradient``/``hvp`` call these for such a network; ``ψ_h`` are the step weights,
``R^h`` for the paper's estimators). Each function takes the network as a
:class:`~fedrl_algos.policies.mlp.network.SoftmaxMlp` (``policy.softmax_mlp``: its sizes and kernel
choice), not the policy:

* :func:`mlp_policy_gradient` — the score-function estimate ``(1/m) Σ_ξ Σ_h ∇log π(a_h|s_h) ψ_h``
  (hand-written backprop);
* :func:`mlp_hvp` — the paper's curvature estimate applied to a vector,
  ``(1/m) Σ_ξ [g(ξ) (∇log q(ξ)ᵀv) + ∇²ν(ξ) v]``: the rank-one part needs the directional derivative
  ``∇log π(a|x)ᵀv`` (a hand-written forward-mode pass), the second part the directional derivative
  of the backprop of ``ν`` along ``v`` (hand-written second-order backprop). Nothing ``d × d`` is formed;
* :func:`mlp_sample` — actions drawn exactly as :meth:`MlpPolicy.sample` does (same random numbers,
  same inverse-CDF rule) but about 5× faster on CPU (``FastMlpPolicy.sample``);
* :func:`mlp_rollout` — a whole rollout with that sampler (``FastMlpPolicy``'s kernel rollout plan).

Everything works feature-major (``[rows, features, samples]``): the per-sample feature axes are
tiny (2, 32, 8), and reductions or elementwise passes along a contiguous sample axis vectorize far
better on CPU than along an 8-wide last axis. ``tanh`` is evaluated as ``2σ(2z) − 1`` (one
vectorized sigmoid; PyTorch's CPU ``tanh`` is several times slower). Big intermediates are kept
cache-sized by processing the trajectory axis in chunks of about :data:`CHUNK_SAMPLES` samples.

Derivation (one sample ``x``, action ``a``, weight ``w = R^h``; ``h = tanh(z)``, ``z = W1ᵀx + b1``,
``l = W2ᵀh + b2``, ``p = softmax(l)``, ``δ = e_a − p``, direction ``v = (V1, c1, V2, c2)``)::

    ∇_{W2} log π = h δᵀ,   ∇_{b2} = δ,   ∇_{W1} = x (g ⊙ W2δ)ᵀ,   ∇_{b1} = g ⊙ W2δ,   g = 1 − h²
    forward mode:  dz = V1ᵀx + c1,  dh = g ⊙ dz,  dl = W2ᵀdh + V2ᵀh + c2,
                   ∇log πᵀv = dl_a − pᵀdl,   dδ = −p ⊙ (dl − pᵀdl)
    d(∇ log π)[v]: W2: dh δᵀ + h dδᵀ,  b2: dδ,
                   z-signal: −2 h ⊙ dh ⊙ W2δ + g ⊙ (V2δ + W2 dδ),  W1: x (z-signal)ᵀ,  b1: z-signal

With ``c_ξ = Σ_h ∇log π(a_h|s_h)ᵀv`` the estimate sums, over samples, the backprop of the output
signal ``u = c_ξ w δ + w dδ`` plus the extra terms ``dh (wδ)ᵀ`` (W2) and ``g ⊙ V2(wδ) − 2h ⊙ dh ⊙ W2(wδ)``
(z-signal).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedrl_algos.core.curvature import coupled_score_weights
from fedrl_algos.core.trajectories import Trajectories, check_rollout_batch
from fedrl_algos.policies.mlp.compiled import (
    compiled_gradient_applies,
    compiled_policy_gradient,
    compiled_rollout,
    compiled_rollout_applies,
)
from fedrl_algos.policies.mlp.compiled_hvp import compiled_hvp, compiled_hvp_applies
from fedrl_algos.policies.mlp.network import SoftmaxMlp
from fedrl_algos.policies.mlp.network import unpack_weights as _unpack
from fedrl_envs.params import repeat_params
from fedrl_envs.rng import RandomStreams

__all__ = [
    "CHUNK_SAMPLES",
    "PG_CHUNK_SAMPLES",
    "mlp_hvp",
    "mlp_policy_gradient",
    "mlp_rollout",
    "mlp_sample",
]

#: samples (trajectories × time steps × batch rows) the Hessian-vector product processes at once:
#: keeps each ``[rows, 32, samples]`` intermediate around a megabyte (cache-sized) in float32
CHUNK_SAMPLES = 8192
#: the same for the policy gradient, whose tiles are cheaper (measured fastest on 2 CPU cores)
PG_CHUNK_SAMPLES = 2048


def _pack(gw1: torch.Tensor, gb1: torch.Tensor, gw2: torch.Tensor, gb2: torch.Tensor) -> torch.Tensor:
    rows = gw1.shape[0]
    return torch.cat([gw1.reshape(rows, -1), gb1, gw2.reshape(rows, -1), gb2], dim=-1)


def _hidden(w1: torch.Tensor, b1: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = tanh(W1ᵀx + b1)`` and ``g = 1 − h²``, feature-major ``[R, h, N]``, via ``2σ(2z) − 1``."""
    s = torch.baddbmm((2.0 * b1).unsqueeze(-1), (2.0 * w1).transpose(-1, -2), xt).sigmoid_()
    g = s * (1.0 - s)
    g.mul_(4.0)
    hid = s.mul_(2.0).sub_(1.0)
    return hid, g


def _softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Softmax along the feature axis (-2) of a feature-major ``[R, o, N]`` tensor (in place)."""
    logits = logits.sub_(logits.amax(-2, keepdim=True)).exp_()
    return logits.div_(logits.sum(-2, keepdim=True))


def _flat_inputs(theta: torch.Tensor, obs: torch.Tensor, n_batch: int):
    """Flatten ``theta [*B, d]`` to ``[R, d]`` and ``obs [*B, *M, i]`` to feature-major ``[R, i, N]``."""
    rows = math.prod(theta.shape[:n_batch])
    th = theta.reshape(rows, theta.shape[-1])
    xt = obs.to(theta.dtype).reshape(rows, -1, obs.shape[-1]).transpose(-1, -2)
    return th, xt


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------


def mlp_sample(net: SoftmaxMlp, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
    """Actions ``[*B, *M]`` for ``theta [*B, d]``, ``obs [*B, *M, i]``, one random stream per row.

    Draws the same uniforms as :meth:`MlpPolicy.sample` and applies the same inverse-CDF rule
    (action = number of CDF entries below the uniform), with the CDF left unnormalized
    (``cumsum(e) < u·Σe``); the two agree except where a uniform falls within rounding error of a
    CDF boundary.
    """
    n_batch = streams.keys.dim()
    m_shape = obs.shape[n_batch:-1]
    th, xt = _flat_inputs(theta.expand(*obs.shape[:n_batch], theta.shape[-1]), obs, n_batch)
    u = streams.uniform(m_shape, dtype=theta.dtype).reshape(th.shape[0], 1, -1)
    w1, b1, w2, b2 = _unpack(net, th)
    # logits = W2ᵀ(2σ(2z) − 1) + b2 = (2W2)ᵀσ(2z) + (b2 − W2ᵀ1)
    s = torch.baddbmm((2.0 * b1).unsqueeze(-1), (2.0 * w1).transpose(-1, -2), xt).sigmoid_()
    logits = torch.baddbmm((b2 - w2.sum(-2)).unsqueeze(-1), (2.0 * w2).transpose(-1, -2), s)
    cdf = logits.sub_(logits.amax(-2, keepdim=True)).exp_().cumsum_(-2)
    actions = (cdf < cdf[:, -1:, :] * u).sum(-2).clamp_(max=net.n_actions - 1)
    return actions.reshape(*obs.shape[:n_batch], *m_shape)


def mlp_rollout(
    family: Any,
    params: Any,
    net: SoftmaxMlp,
    theta: torch.Tensor,
    streams: RandomStreams,
    n_trajectories: int,
    horizon: int | None = None,
):
    """:func:`~fedrl_algos.core.sampling.generic_rollout` specialised to this network: the same trajectories.

    Bitwise the trajectories ``generic_rollout(..., FastMlpPolicy, ...)`` returns (same random
    numbers in the same order, same sampling rule, streams left in the same state), with the whole
    episode's uniforms drawn in one call and the network's transformed weights computed once instead
    of at every step: about half the per-step operations, which is what small batches pay for.
    """
    transition = compiled_rollout_applies(net, family, params, theta)
    if transition is not None:
        return compiled_rollout(family, params, net, theta, streams, n_trajectories, transition, horizon)
    batch = theta.shape[:-1]
    m = check_rollout_batch(theta, streams, n_trajectories)
    rows = math.prod(batch)
    row_params = repeat_params(params, m)
    if horizon is None:
        horizon = family.horizon(params)
    steps = horizon + 1
    noise = streams.uniform((m, family.reset_noise_dim))
    uniforms = streams.uniform((steps, m), dtype=theta.dtype).reshape(rows, steps, 1, m)
    state = family.reset(row_params, noise.reshape(rows * m, -1))
    w1, b1, w2, b2 = _unpack(net, theta.reshape(rows, -1))
    a1, a1b = (2.0 * w1).transpose(-1, -2), (2.0 * b1).unsqueeze(-1)
    a2, a2b = (2.0 * w2).transpose(-1, -2), (b2 - w2.sum(-2)).unsqueeze(-1)
    last = net.n_actions - 1
    obs_list, act_list, rew_list, done_list = [], [], [], []
    for t in range(steps):
        obs = family.observe(state, row_params)
        xt = obs.to(theta.dtype).reshape(rows, m, -1).transpose(-1, -2)
        cdf = torch.baddbmm(a2b, a2, torch.baddbmm(a1b, a1, xt).sigmoid_())
        cdf = cdf.sub_(cdf.amax(-2, keepdim=True)).exp_().cumsum_(-2)
        action = (cdf < cdf[:, -1:, :] * uniforms[:, t]).sum(-2).clamp_(max=last)  # [rows, m]
        state, reward, terminated = family.fast_step(state, action.reshape(rows * m), row_params)
        obs_list.append(obs)
        act_list.append(action)
        rew_list.append(reward)
        done_list.append(terminated)
    return Trajectories.from_steps(
        torch.stack(obs_list, dim=1).reshape(*batch, m, steps, *obs_list[0].shape[1:]),
        torch.stack(act_list, dim=-1).reshape(*batch, m, steps),
        torch.stack(rew_list, dim=-1).reshape(*batch, m, steps),
        torch.stack(done_list, dim=-1).reshape(*batch, m, steps),
        theta.dtype,
    )


# --------------------------------------------------------------------------------------------
# policy gradient and Hessian-vector product
# --------------------------------------------------------------------------------------------


def _blocks(rows: int, m: int, steps: int, chunk_samples: int | None) -> list[tuple[int, int, int, int]]:
    """Tiles ``(row0, n_rows, traj0, n_traj)`` of about ``chunk_samples`` samples each.

    The trajectory tiling of a row depends only on ``m`` and ``steps`` (never on how many rows are
    batched together), so each row sums its trajectories in the same order whatever the batch.
    """
    total = chunk_samples or CHUNK_SAMPLES
    per_row = max(1, min(m, max(1, total // 8) // max(1, steps)))
    row_block = max(1, total // (per_row * max(1, steps)))
    return [
        (r, min(row_block, rows - r), t, min(per_row, m - t))
        for r in range(0, rows, row_block)
        for t in range(0, m, per_row)
    ]


def _prepare(theta, traj, weights):
    n_batch = theta.dim() - 1
    batch = theta.shape[:-1]
    rows = math.prod(batch)
    th = theta.reshape(rows, theta.shape[-1])
    m, steps = traj.rewards.shape[-2], traj.rewards.shape[-1]
    mask = traj.mask.to(theta.dtype).reshape(rows, m, steps)
    weight = weights.to(theta.dtype).reshape(rows, m, steps)
    obs = traj.obs.reshape(rows, m, steps, -1)
    actions = traj.actions.reshape(rows, m, steps)
    return n_batch, batch, rows, th, m, steps, mask, weight, obs, actions


def _delta(probs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``e_a − p`` feature-major ``[R, o, N]`` for actions ``[R, N]``."""
    delta = probs.neg()
    return delta.scatter_add_(-2, actions.long().unsqueeze(-2), torch.ones_like(delta[:, :1, :]))


def _tile(x: torch.Tensor, r0: int, nr: int, t0: int, nt: int) -> torch.Tensor:
    return x.narrow(0, r0, nr).narrow(1, t0, nt)


def mlp_policy_gradient(
    net: SoftmaxMlp, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor, chunk_samples: int | None = None
) -> torch.Tensor:
    """Closed form of :func:`~fedrl_algos.core.estimators.autograd_score_gradient`: ``[*B, d]``.

    :param net: the network (``MlpPolicy.softmax_mlp``)
    :param theta: parameters ``[*B, d]``
    :param traj: trajectories ``[*B, m, T, ...]``
    :param weights: step weights ``ψ [*B, m, T]``
    :param chunk_samples: samples per tile (default :data:`PG_CHUNK_SAMPLES`)
    """
    if compiled_gradient_applies(net, theta, traj, weights):
        return compiled_policy_gradient(net, theta, traj, weights)
    _, batch, rows, th, m, steps, _, weight, obs, actions = _prepare(theta, traj, weights)
    w1, b1, w2, b2 = _unpack(net, th)
    w2t = w2.transpose(-1, -2)
    total = torch.zeros_like(th)
    for r0, nr, t0, nt in _blocks(rows, m, steps, chunk_samples or PG_CHUNK_SAMPLES):
        n = nt * steps
        xt = _tile(obs, r0, nr, t0, nt).reshape(nr, n, -1).to(th.dtype).transpose(-1, -2)
        act = _tile(actions, r0, nr, t0, nt).reshape(nr, n)
        w = _tile(weight, r0, nr, t0, nt).reshape(nr, 1, n)
        rw1, rb1, rw2, rb2 = w1.narrow(0, r0, nr), b1.narrow(0, r0, nr), w2.narrow(0, r0, nr), b2.narrow(0, r0, nr)
        hid, g = _hidden(rw1, rb1, xt)
        probs = _softmax_rows(torch.baddbmm(rb2.unsqueeze(-1), w2t.narrow(0, r0, nr), hid))
        out = _delta(probs, act).mul_(w)  # [r, o, N]
        zsig = torch.bmm(rw2, out).mul_(g)  # [r, h, N]
        part = _pack(
            torch.bmm(xt, zsig.transpose(-1, -2)), zsig.sum(-1), torch.bmm(hid, out.transpose(-1, -2)), out.sum(-1)
        )
        total.narrow(0, r0, nr).add_(part)
    return (total / m).reshape(*batch, -1)


def _contributing_first(weight: torch.Tensor, per_row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Reorder trajectories and rows so that the ones that can contribute come first.

    A trajectory whose weights ``ψ_h`` all vanish contributes exactly zero to the policy gradient
    and to ``u(ξ)v`` (both are weighted by ``ψ_h``). Each row's trajectories are stably sorted with
    the contributing ones first, rows are sorted by their number of contributing trajectories.

    :return: trajectory order ``[R, m']`` (truncated to whole tiles of ``per_row``), row order
        ``[R]``, contributing counts in row order ``[R]``, and ``m'``
    """
    contributes = (weight != 0).any(-1)  # [R, m]
    count = contributes.sum(-1)
    traj_order = torch.argsort((~contributes).to(torch.int8), dim=-1, stable=True)
    row_order = torch.argsort(count, descending=True, stable=True)
    m = weight.shape[1]
    kept = min(m, -(-int(count.max()) // per_row) * per_row) if count.numel() else 0
    return traj_order[:, :kept], row_order, count[row_order], kept


def mlp_hvp(
    net: SoftmaxMlp, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor,
    chunk_samples: int | None = None, coupling: str = "paper",
) -> torch.Tensor:
    """Closed form of :func:`~fedrl_algos.core.estimators.autograd_hvp`: ``(1/m) Σ_ξ u(ξ; θ) v``, ``[*B, d]``.

    Arguments as for :func:`mlp_policy_gradient`, the direction ``v [*B, d]``, and ``coupling``: how
    the directional scores enter the output signal's first-order weights (``"paper"``: ``c_ξ ψ_h``;
    ``"causal"``/``"lvc"``: :func:`~fedrl_algos.core.curvature.coupled_score_weights`; every tile
    holds whole trajectories, so the per-trajectory prefix and suffix sums are tile-local).

    Trajectories without weight (all ``ψ_h = 0``) contribute exactly zero and are skipped: each row
    processes its rewarded trajectories first, in tiles of a fixed number of trajectories, and
    stops after the tile holding its last rewarded one (rows are grouped by that count). A row's
    result therefore depends only on its own data, not on the rest of the batch.

    With ``kernels="numba"`` (float32 on the CPU) the compiled loops of
    :mod:`~fedrl_algos.policies.mlp.compiled_hvp` compute it instead (the same quantity, rounded differently).
    """
    if chunk_samples is None and compiled_hvp_applies(net, theta, traj, v, weights):
        return compiled_hvp(net, theta, traj, v, weights, coupling)
    _, batch, rows, th, m, steps, mask, weight, obs, actions = _prepare(theta, traj, weights)
    total_samples = chunk_samples or CHUNK_SAMPLES
    per_row = max(1, min(m, max(1, total_samples // 8) // max(1, steps)))
    row_block = max(1, total_samples // (per_row * max(1, steps)))
    traj_order, row_order, counts, kept = _contributing_first(weight, per_row)
    result = torch.zeros_like(th)
    if kept == 0:
        return result.reshape(*batch, -1)
    # gather rows (sorted by count) and their contributing-first trajectories, up to ``kept``
    t_idx = traj_order.index_select(0, row_order)  # [R, m']
    r_idx = row_order.unsqueeze(-1)
    obs, actions = obs[r_idx, t_idx], actions[r_idx, t_idx]
    weight, mask = weight[r_idx, t_idx], mask[r_idx, t_idx]
    th, vv = th.index_select(0, row_order), v.to(th.dtype).expand(*batch, th.shape[-1]).reshape(rows, -1)
    vv = vv.index_select(0, row_order)
    w1, b1, w2, b2 = _unpack(net, th)
    v1, c1, v2, c2 = _unpack(net, vv)
    n_out = w2.shape[-1]
    w2t, v1t, v2t = w2.transpose(-1, -2), v1.transpose(-1, -2), v2.transpose(-1, -2)
    w2v2 = torch.cat([w2, v2], dim=-1)  # [R, h, 2o]: W2·u + V2·q in one product
    total = torch.zeros_like(th)
    counts = counts.tolist()
    for r0 in range(0, rows, row_block):
        nr = min(row_block, rows - r0)

        def rows_of(x: torch.Tensor, r0: int = r0, nr: int = nr) -> torch.Tensor:
            return x.narrow(0, r0, nr)

        for t0 in range(0, counts[r0], per_row):  # counts are descending: row r0 has the most
            nt = min(per_row, m - t0)
            n = nt * steps
            xt = _tile(obs, r0, nr, t0, nt).reshape(nr, n, -1).to(th.dtype).transpose(-1, -2)
            act = _tile(actions, r0, nr, t0, nt).reshape(nr, n)
            tile_weight = _tile(weight, r0, nr, t0, nt)
            w = tile_weight.reshape(nr, 1, n)
            hid, g = _hidden(rows_of(w1), rows_of(b1), xt)
            probs = _softmax_rows(torch.baddbmm(rows_of(b2).unsqueeze(-1), rows_of(w2t), hid))
            # forward mode: dh, dl and the score's directional derivative ∇log π(a|x)ᵀv
            dh = torch.baddbmm(rows_of(c1).unsqueeze(-1), rows_of(v1t), xt).mul_(g)
            dl = torch.baddbmm(rows_of(c2).unsqueeze(-1), rows_of(v2t), hid).baddbmm_(rows_of(w2t), dh)  # [r, o, N]
            dl.sub_((probs * dl).sum(-2, keepdim=True))  # dl − pᵀdl
            score_v = torch.gather(dl, -2, act.long().unsqueeze(-2))  # [r, 1, N]
            # ω_h: c_ξ · R^h for the paper's estimator (c_ξ = Σ_h ∇log π_hᵀv), other couplings by the same rule
            cw = coupled_score_weights(score_v.reshape(nr, nt, steps) * _tile(mask, r0, nr, t0, nt), tile_weight, coupling)
            cw = cw.reshape(nr, 1, n)
            # output signals: u = c w δ + w dδ (dδ = −p ⊙ (dl − pᵀdl)), q = w δ
            delta = _delta(probs, act)
            signals = torch.empty(nr, 2 * n_out, n, dtype=th.dtype, device=th.device)
            u, q = signals[:, :n_out], signals[:, n_out:]
            torch.mul(delta, w, out=q)
            torch.mul(delta, cw, out=u)
            u.addcmul_(probs.mul_(dl), w, value=-1.0)
            # z-signal: g ⊙ (W2 u + V2 q) − 2 h ⊙ dh ⊙ (W2 q)
            zsig = torch.bmm(rows_of(w2v2), signals).mul_(g)
            zsig.addcmul_(torch.bmm(rows_of(w2), q).mul_(hid), dh, value=-2.0)
            gw2 = torch.bmm(hid, u.transpose(-1, -2)).baddbmm_(dh, q.transpose(-1, -2))
            part = _pack(torch.bmm(xt, zsig.transpose(-1, -2)), zsig.sum(-1), gw2, u.sum(-1))
            total.narrow(0, r0, nr).add_(part)
    result.index_copy_(0, row_order, total)
    return (result / m).reshape(*batch, -1)
