"""The curvature product of the paper's softmax MLP as compiled loops: ``FastMlpPolicy(kernels="numba")``.

:func:`compiled_hvp` computes what :func:`~fedrl_algos.policies.mlp.kernels.mlp_hvp` computes,
``(1/m) Σ_ξ [Σ_h ω_h ∇ℓ_h + Σ_h ψ_h ∇²ℓ_h v]`` (the derivation and the signals ``u``, ``q`` are in that
module's docstring; the couplings ω in :func:`~fedrl_algos.core.curvature.coupled_score_weights`),
with one pass over the samples instead of about forty torch operations on ``[rows, 32, samples]``
tiles, each of which streams its tile through memory:

1. the trajectories that can contribute (some ``ψ_h ≠ 0``; with the paper's coupling the others
   add exactly zero) are gathered row by row into one list of samples, cut into tiles of whole
   trajectories; a tile's samples form segments, one per row it touches;
2. per tile, the hidden pre-activations (compiled), ``σ(2z)`` (torch's vectorized ``sigmoid_``), the
   tanh units and centred logits (compiled), ``exp`` (torch's ``exp_``): the transcendental
   functions stay torch's, which vectorizes them;
3. one compiled loop runs the forward-mode pass, the couplings and the second-order backprop on
   blocks of a few trajectories, every loop along the block's samples (feature-major scratch that
   stays in the L1 cache), and sums each block's contribution into its row in float64.

The loop is compiled with LLVM's ``reassoc`` and ``contract`` flags, so that its sums over samples
vectorize: they round differently from torch's kernel (relative error against float64 autograd
about 1e-6, as torch's, tested), the same bits on every call, and a row's result depends only on
its own data (never on the rest of the batch or on the tiling within a block).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies.mlp.compiled import _plain_float32, compiled_gradient_applies
from fedrl_algos.policies.mlp.network import SoftmaxMlp, unpack_weights

__all__ = ["compiled_hvp", "compiled_hvp_applies", "HVP_TILE_SAMPLES", "HVP_BLOCK_TRAJECTORIES"]

#: samples of one tile (whole trajectories): its ``[32, samples]`` units stay cache-sized between
#: the compiled loops and torch's ``sigmoid_``/``exp_``
HVP_TILE_SAMPLES = 4096
#: trajectories of one block of the fused loop: its feature-major scratch stays in the L1 cache
HVP_BLOCK_TRAJECTORIES = 16
#: the couplings by number, as the fused loop takes them
_COUPLING_CODES = {"paper": 0, "lvc": 1, "causal": 2}


def compiled_hvp_applies(net: SoftmaxMlp, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> bool:
    """Whether :func:`compiled_hvp` applies: where the compiled policy gradient applies
    (:func:`~fedrl_algos.policies.mlp.compiled.compiled_gradient_applies`) with a float32 CPU direction."""
    return _plain_float32(v.expand_as(theta)) and compiled_gradient_applies(net, theta, traj, weights)


def compiled_hvp(
    net: SoftmaxMlp, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor, coupling: str = "paper",
    tile_samples: int | None = None,
) -> torch.Tensor:
    """:func:`~fedrl_algos.policies.mlp.kernels.mlp_hvp` through the compiled loops: ``[*B, d]``.

    :param net: the network (``MlpPolicy.softmax_mlp``)
    :param theta: parameters ``[*B, d]`` the trajectories were sampled with
    :param traj: trajectories ``[*B, m, T, ...]``
    :param v: direction ``[*B, d]`` (or broadcastable to it)
    :param weights: step weights ``ψ [*B, m, T]``
    :param coupling: ``"paper"``, ``"causal"`` or ``"lvc"``
    :param tile_samples: samples per tile (default :data:`HVP_TILE_SAMPLES`; the result does not depend on it)
    """
    batch = theta.shape[:-1]
    rows, d = math.prod(batch), theta.shape[-1]
    m, steps = traj.rewards.shape[-2], traj.rewards.shape[-1]
    th = theta.reshape(rows, d)
    vv = v.to(theta.dtype).expand(*batch, d).reshape(rows, d)
    psi = weights.expand(*batch, m, steps).reshape(rows, m, steps)
    contributes = (psi != 0).any(-1)  # [rows, m]: the others add exactly zero to every coupling's sum
    which = contributes.reshape(-1).nonzero().squeeze(-1)  # row-major: row by row, each row's in order
    total = np.zeros((rows, d), np.float64)
    if which.numel():
        n_in = traj.obs.shape[-1]
        obs = traj.obs.to(torch.float32).reshape(rows * m, steps, n_in).index_select(0, which)
        x = np.ascontiguousarray(obs.reshape(-1, n_in).numpy().T)  # [i, samples] feature-major
        acts = traj.actions.to(torch.int64).reshape(rows * m, steps).index_select(0, which).reshape(-1).numpy()
        psi_s = psi.reshape(rows * m, steps).index_select(0, which).reshape(-1).contiguous().numpy()
        mask = traj.mask.to(torch.float32).reshape(rows * m, steps).index_select(0, which).reshape(-1).contiguous().numpy()
        row_of = (which // m).numpy()
        row_start = np.searchsorted(row_of, np.arange(rows + 1)) * steps  # sample offset of each row's segment
        _run_tiles(net, th, vv, x, acts, psi_s, mask, row_start, steps, _COUPLING_CODES[coupling],
                   tile_samples or HVP_TILE_SAMPLES, total)
    return torch.from_numpy((total / m).astype(np.float32)).reshape(*batch, d)


def _run_tiles(net, th, vv, x, acts, psi, mask, row_start, steps, coupling, tile_samples, total) -> None:
    loops = _hvp_loops()
    w1, b1, w2, b2 = unpack_weights(net, th)
    v1, c1, v2, c2 = unpack_weights(net, vv)
    a1, a1b = (2.0 * w1).contiguous().numpy(), (2.0 * b1).contiguous().numpy()
    w2n, b2n = w2.contiguous().numpy(), b2.contiguous().numpy()
    v1n, c1n, v2n, c2n = (t.contiguous().numpy() for t in (v1, c1, v2, c2))
    n_hidden, n_out = w2n.shape[1], w2n.shape[2]
    # Blocks of whole trajectories start at every row's segment start and every HVP_BLOCK_TRAJECTORIES
    # trajectories after it; tiles are runs of whole blocks. A row's float32 block sums, hence its
    # result, then depend on its own samples only, not on the tiling or on the other rows.
    block = HVP_BLOCK_TRAJECTORIES * steps
    blocks_per_row = -(-np.diff(row_start) // block)  # ceil: a row's last block may be shorter
    first_block = np.cumsum(blocks_per_row) - blocks_per_row
    within = np.arange(int(blocks_per_row.sum())) - np.repeat(first_block, blocks_per_row)
    block_starts = np.append(np.repeat(row_start[:-1], blocks_per_row) + within * block, row_start[-1])
    per_tile = max(1, tile_samples // block)
    cuts = block_starts[::per_tile]
    if cuts[-1] != row_start[-1]:
        cuts = np.append(cuts, row_start[-1])
    scratch = np.empty((3 * n_hidden + 5 * n_out + 4, block), np.float32)
    for s0, s1 in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        # the rows this tile touches and their segments' bounds within it
        r_lo = int(np.searchsorted(row_start, s0, side="right")) - 1
        r_hi = int(np.searchsorted(row_start, s1, side="left"))
        seg_rows = np.arange(r_lo, r_hi, dtype=np.int64)
        bounds = np.clip(row_start[r_lo : r_hi + 1], s0, s1) - s0
        keep = bounds[1:] > bounds[:-1]
        seg_rows, seg_lo, seg_hi = seg_rows[keep], bounds[:-1][keep], bounds[1:][keep]
        nt = s1 - s0
        # C-contiguous arrays: the loops' inner stride is then known to be one element, and they vectorize
        sig, hid, exps = np.empty((n_hidden, nt), np.float32), np.empty((n_hidden, nt), np.float32), np.empty((n_out, nt), np.float32)
        xt = np.ascontiguousarray(x[:, s0:s1])
        loops.pre_activations(a1, a1b, xt, seg_rows, seg_lo, seg_hi, sig)
        torch.from_numpy(sig).sigmoid_()
        loops.units_and_logits(sig, w2n, b2n, seg_rows, seg_lo, seg_hi, hid, exps)
        torch.from_numpy(exps).exp_()
        loops.curvature(exps, sig, hid, xt, acts[s0:s1], psi[s0:s1], mask[s0:s1], w2n, v1n, c1n, v2n, c2n,
                        seg_rows, seg_lo, seg_hi, steps, coupling, scratch, total)


# --------------------------------------------------------------------------------------------
# the compiled loops (feature-major: ``[features, samples]``; segment k holds row seg_rows[k]'s
# samples [seg_lo[k], seg_hi[k]) of the tile)
# --------------------------------------------------------------------------------------------


def _affine(w, b, inputs, lo, hi, out):
    """``out[j, lo:hi] = b[j] + Σ_i w[i, j] inputs[i, lo:hi]`` for one row's weights ``w [in, out]``."""
    n = hi - lo
    for j in range(w.shape[1]):
        row = out[j, lo:hi]  # 1-D views looped from 0: no negative-index checks, so the loops vectorize
        bj = b[j]
        for c in range(n):
            row[c] = bj
        for i in range(w.shape[0]):
            wij = w[i, j]
            xi = inputs[i, lo:hi]
            for c in range(n):
                row[c] += wij * xi[c]


def _pre_activations(a1, a1b, x, seg_rows, seg_lo, seg_hi, out):
    """``out[j, c] = Σ_k a1[r, k, j] x[k, c] + a1b[r, j]`` (``2z``, the argument of ``σ(2z)``)."""
    for k in range(seg_rows.shape[0]):
        r = seg_rows[k]
        affine(a1[r], a1b[r], x, seg_lo[k], seg_hi[k], out)  # noqa: F821 (bound by _HvpLoops)


def _units_and_logits(sig, w2, b2, seg_rows, seg_lo, seg_hi, hid, out):
    """``hid = 2σ − 1`` (``tanh z``) and ``out = W2ᵀhid + b2`` less its maximum over the outputs."""
    n_hidden, n_out = w2.shape[1], w2.shape[2]
    two, one = np.float32(2.0), np.float32(1.0)
    for k in range(seg_rows.shape[0]):
        r, lo, hi = seg_rows[k], seg_lo[k], seg_hi[k]
        n = hi - lo
        for j in range(n_hidden):
            sj, hj = sig[j, lo:hi], hid[j, lo:hi]
            for c in range(n):
                hj[c] = two * sj[c] - one
        affine(w2[r], b2[r], hid, lo, hi, out)  # noqa: F821 (bound by _HvpLoops)
        top = out[0, lo:hi].copy()
        for q in range(1, n_out):
            oq = out[q, lo:hi]
            for c in range(n):
                top[c] = max(top[c], oq[c])
        for q in range(n_out):
            oq = out[q, lo:hi]
            for c in range(n):
                oq[c] -= top[c]


def _curvature(exps, sig, hid, x, actions, psi, mask, w2, v1, c1, v2, c2, seg_rows, seg_lo, seg_hi, steps, coupling,
               scratch, total):
    """Add every block's ``Σ_h ω_h ∇ℓ_h + Σ_h ψ_h ∇²ℓ_h v`` to its row of ``total`` (float64, θ's layout
    ``W1 [i, h], b1 [h], W2 [h, o], b2 [o]``). Blocks hold whole trajectories (``steps`` samples each).

    Per sample (the notation of :mod:`.kernels`): ``p = softmax``, ``g = 1 − h² = 4σ(1 − σ)``,
    ``dh = g ⊙ (V1ᵀx + c1)``, ``dl = V2ᵀh + W2ᵀdh + c2 − pᵀ(…)``, ``c = dl_a`` (the directional score),
    ω from the trajectory's ``c`` (coupling 0 paper, 1 lvc, 2 causal), ``δ = e_a − p``,
    ``q = ψδ``, ``u = ωδ − ψ p ⊙ dl``; then ``∇b2 += u``, ``∇W2 += h uᵀ + dh qᵀ``,
    ``z = g ⊙ (W2u + V2q) − 2h ⊙ dh ⊙ (W2q)``, ``∇b1 += z``, ``∇W1 += x zᵀ``.
    Every inner loop runs from 0 over 1-D views of the block, so that it vectorizes.
    """
    n_in = x.shape[0]
    n_hidden, n_out = w2.shape[1], w2.shape[2]
    block = scratch.shape[1]
    d = total.shape[1]
    b1_at = n_in * n_hidden
    w2_at = b1_at + n_hidden
    b2_at = w2_at + n_hidden * n_out
    zero, one, two, four = np.float32(0.0), np.float32(1.0), np.float32(2.0), np.float32(4.0)
    o = 3 * n_hidden + 5 * n_out
    part = np.zeros(d, np.float32)
    for k in range(seg_rows.shape[0]):
        r, lo, hi = seg_rows[k], seg_lo[k], seg_hi[k]
        acc = total[r]
        for b0 in range(lo, hi, block):
            nb = min(block, hi - b0)
            b1_ = b0 + nb
            inv, sv, om, t2 = scratch[o, :nb], scratch[o + 1, :nb], scratch[o + 2, :nb], scratch[o + 3, :nb]
            act, w_blk, m_blk = actions[b0:b1_], psi[b0:b1_], mask[b0:b1_]
            # forward pass and forward mode
            for c in range(nb):
                inv[c] = zero
            for q in range(n_out):
                eq = exps[q, b0:b1_]
                for c in range(nb):
                    inv[c] += eq[c]
            for c in range(nb):
                inv[c] = one / inv[c]
            for q in range(n_out):
                eq, pq, hq = exps[q, b0:b1_], scratch[3 * n_hidden + q, :nb], scratch[3 * n_hidden + 4 * n_out + q, :nb]
                for c in range(nb):
                    pq[c] = eq[c] * inv[c]
                    hq[c] = one if act[c] == q else zero
            for j in range(n_hidden):
                gj, dhj, sj = scratch[j, :nb], scratch[n_hidden + j, :nb], sig[j, b0:b1_]
                cj = c1[r, j]
                for c in range(nb):
                    gj[c] = four * sj[c] * (one - sj[c])
                    dhj[c] = cj
                for i in range(n_in):
                    a = v1[r, i, j]
                    xi = x[i, b0:b1_]
                    for c in range(nb):
                        dhj[c] += a * xi[c]
                for c in range(nb):
                    dhj[c] *= gj[c]
            for q in range(n_out):
                dlq = scratch[3 * n_hidden + n_out + q, :nb]
                cq = c2[r, q]
                for c in range(nb):
                    dlq[c] = cq
                j = 0
                while j + 2 <= n_hidden:  # two hidden units a pass: half the loads and stores of dl
                    a0, bw0, a1, bw1 = v2[r, j, q], w2[r, j, q], v2[r, j + 1, q], w2[r, j + 1, q]
                    h0, dh0 = hid[j, b0:b1_], scratch[n_hidden + j, :nb]
                    h1, dh1 = hid[j + 1, b0:b1_], scratch[n_hidden + j + 1, :nb]
                    for c in range(nb):
                        dlq[c] += (a0 * h0[c] + bw0 * dh0[c]) + (a1 * h1[c] + bw1 * dh1[c])
                    j += 2
                while j < n_hidden:
                    a, bw = v2[r, j, q], w2[r, j, q]
                    hj, dhj = hid[j, b0:b1_], scratch[n_hidden + j, :nb]
                    for c in range(nb):
                        dlq[c] += a * hj[c] + bw * dhj[c]
                    j += 1
            for c in range(nb):
                t2[c] = zero
                sv[c] = zero
            for q in range(n_out):
                pq, dlq = scratch[3 * n_hidden + q, :nb], scratch[3 * n_hidden + n_out + q, :nb]
                for c in range(nb):
                    t2[c] += pq[c] * dlq[c]
            for q in range(n_out):
                dlq, hq = scratch[3 * n_hidden + n_out + q, :nb], scratch[3 * n_hidden + 4 * n_out + q, :nb]
                for c in range(nb):
                    dlq[c] -= t2[c]
                    sv[c] += hq[c] * dlq[c]
            for c in range(nb):
                sv[c] *= m_blk[c]
            # the couplings ω, trajectory by trajectory
            for t0 in range(0, nb, steps):
                if coupling == 0:  # every score of the episode times every ψ_h
                    total_score = zero
                    for h in range(t0, t0 + steps):
                        total_score += sv[h]
                    for h in range(t0, t0 + steps):
                        om[h] = w_blk[h] * total_score
                elif coupling == 1:  # the diagonal pairs only
                    for h in range(t0, t0 + steps):
                        om[h] = w_blk[h] * sv[h]
                else:  # ψ_h C_{h−1} + Σ_{t≥h} ψ_t c_t
                    after = zero
                    for h in range(t0 + steps - 1, t0 - 1, -1):
                        after += w_blk[h] * sv[h]
                        om[h] = after
                    before = zero
                    for h in range(t0, t0 + steps):
                        om[h] += w_blk[h] * before
                        before += sv[h]
            # output signals u = ωδ − ψ p ⊙ dl and q = ψδ
            for q in range(n_out):
                pq, dlq = scratch[3 * n_hidden + q, :nb], scratch[3 * n_hidden + n_out + q, :nb]
                uq, qq = scratch[3 * n_hidden + 2 * n_out + q, :nb], scratch[3 * n_hidden + 3 * n_out + q, :nb]
                hq = scratch[3 * n_hidden + 4 * n_out + q, :nb]
                s = zero
                for c in range(nb):
                    delta = hq[c] - pq[c]
                    qq[c] = w_blk[c] * delta
                    uq[c] = om[c] * delta - w_blk[c] * pq[c] * dlq[c]
                    s += uq[c]
                part[b2_at + q] = s
            # z-signal and the hidden layer's gradients
            for j in range(n_hidden):
                zj, gj, dhj, hj = scratch[2 * n_hidden + j, :nb], scratch[j, :nb], scratch[n_hidden + j, :nb], hid[j, b0:b1_]
                for c in range(nb):
                    zj[c] = zero
                    t2[c] = zero
                q = 0
                while q + 2 <= n_out:  # two outputs a pass: half the loads and stores of z and W2q
                    a0, bv0, a1, bv1 = w2[r, j, q], v2[r, j, q], w2[r, j, q + 1], v2[r, j, q + 1]
                    u0, q0 = scratch[3 * n_hidden + 2 * n_out + q, :nb], scratch[3 * n_hidden + 3 * n_out + q, :nb]
                    u1, q1 = scratch[3 * n_hidden + 2 * n_out + q + 1, :nb], scratch[3 * n_hidden + 3 * n_out + q + 1, :nb]
                    su0 = zero
                    su1 = zero
                    for c in range(nb):
                        zj[c] += (a0 * u0[c] + bv0 * q0[c]) + (a1 * u1[c] + bv1 * q1[c])
                        t2[c] += a0 * q0[c] + a1 * q1[c]
                        su0 += hj[c] * u0[c] + dhj[c] * q0[c]
                        su1 += hj[c] * u1[c] + dhj[c] * q1[c]
                    part[w2_at + j * n_out + q] = su0
                    part[w2_at + j * n_out + q + 1] = su1
                    q += 2
                while q < n_out:
                    a, bv = w2[r, j, q], v2[r, j, q]
                    uq, qq = scratch[3 * n_hidden + 2 * n_out + q, :nb], scratch[3 * n_hidden + 3 * n_out + q, :nb]
                    su = zero
                    for c in range(nb):
                        zj[c] += a * uq[c] + bv * qq[c]
                        t2[c] += a * qq[c]
                        su += hj[c] * uq[c] + dhj[c] * qq[c]
                    part[w2_at + j * n_out + q] = su
                    q += 1
                sb = zero
                for c in range(nb):
                    zj[c] = gj[c] * zj[c] - two * hj[c] * dhj[c] * t2[c]
                    sb += zj[c]
                part[b1_at + j] = sb
                for i in range(n_in):
                    xi = x[i, b0:b1_]
                    sx = zero
                    for c in range(nb):
                        sx += xi[c] * zj[c]
                    part[i * n_hidden + j] = sx
            for e in range(d):
                acc[e] += np.float64(part[e])


class _HvpLoops:
    def __init__(self) -> None:
        from fedrl_envs.fused import compile_loop, inline

        fast = frozenset({"reassoc", "contract"})
        affine = {"affine": inline(_affine)}
        self.pre_activations = compile_loop(_pre_activations, affine, (_affine,), fastmath=fast)
        self.units_and_logits = compile_loop(_units_and_logits, affine, (_affine,), fastmath=fast)
        self.curvature = compile_loop(_curvature, {}, fastmath=fast)


@functools.cache
def _hvp_loops() -> _HvpLoops:
    return _HvpLoops()
