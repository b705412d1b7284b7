"""Compiled rollouts and policy gradients of the paper's softmax MLP: ``FastMlpPolicy(kernels="numba")``.

On the CPU a rollout of :func:`~fedrl_algos.policies.mlp.kernels.mlp_rollout` costs about 30 torch
operations a time step, and at the batches of the neural experiments (60 rows × 10 trajectories)
each of them is a few microseconds of dispatch plus, for the two batched matrix products, one small
BLAS call per row: about 0.3 ms a time step. Here a time step is four calls, two loops compiled
by `Numba <https://numba.pydata.org>`_ and torch's vectorized ``sigmoid_`` and ``exp_``:

1. ``σ`` of the hidden pre-activations ``2W1ᵀx + 2b1``, in place (torch);
2. the logits in the σ form of :func:`~fedrl_algos.policies.mlp.kernels.mlp_rollout`,
   ``(2W2)ᵀσ + (b2 − W2ᵀ1)``, less their maximum (compiled);
3. ``exp`` in place (torch);
4. one compiled pass that draws every action by the same inverse-CDF rule from the same uniforms,
   steps every environment through the family's compiled transition
   (:meth:`TaskFamily.compiled_transition <fedrl_envs.family.TaskFamily.compiled_transition>`,
   bitwise its torch step), records the step and computes the next pre-activations.

The intermediates are feature-major over all environments (``[features, environments]``), so the
loops run along environments. With few trajectories a row (:data:`PER_ENV_WEIGHTS_BELOW`) every
environment gets a copy of its row's weights, in blocks of :data:`ENV_BLOCK` environments, and
the layers are one loop over all of them; otherwise each row's weights run over its own segment, in
blocks of whole rows of about :data:`SEGMENT_BLOCK` environments.
Both compute every element with the same operations in the same order (tested bitwise).

The policy gradient (:func:`compiled_policy_gradient`) runs the same forward pass in the tanh form
torch's kernel uses (``W2ᵀh + b2``), then back-propagates each sample; a trajectory's samples are
summed in float32 in their order and the trajectories in float64, so a row's gradient depends
neither on the rest of the batch nor on the tiling.

**Not bitwise the torch kernels.** The random numbers (drawn by a compiled loop with
:meth:`RandomStreams.uniform <fedrl_envs.rng.RandomStreams.uniform>`'s bits), the reset, the
environment step, σ, exp and the cumulative sums (torch accumulates them in float64 too) are those
of ``kernels="torch"``; the matrix products are summed in a fixed sequential order where torch's
BLAS uses its own blocking (the hidden layer's two-term sums happen to agree; the 32-term output
sums differ in the last bit for some logits), so an action whose uniform falls within rounding
error of a CDF boundary may differ, and the trajectories part from there. Runs are therefore
reproducible (same seed, same bits, on any batch) but not bitwise comparable with
``kernels="torch"`` (``tests/test_compiled_mlp.py`` bounds the differences; ``docs/reproduction.md``
compares the experiments' results). The curvature products (Hessian-vector products) run as
compiled loops too: :mod:`fedrl_algos.policies.mlp.compiled_hvp`.

Numba is optional (``pip install "fedrl[fast]"``); the loops are compiled on first use and cached on
disk (:func:`fedrl_envs.fused.compile_loop`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from fedrl_algos.core.trajectories import Trajectories, check_rollout_batch
from fedrl_algos.policies.kernel_choice import resolve_kernels
from fedrl_algos.policies.mlp.network import SoftmaxMlp, unpack_weights
from fedrl_envs.fused import numba_available
from fedrl_envs.params import repeat_params
from fedrl_envs.rng import RandomStreams, uniform32_of_finalizer_input_numpy, uniform32_rows_numpy

__all__ = ["compiled_rollout_applies", "compiled_rollout", "compiled_gradient_applies", "compiled_policy_gradient",
           "GRADIENT_CHUNK_SAMPLES"]

#: samples (rows × trajectories × steps) of one tile of the policy gradient: the ``[rows, n, 32]``
#: hidden activations stay around a few megabytes
GRADIENT_CHUNK_SAMPLES = 32768
#: rollouts with fewer trajectories a row than this give every environment its row's weights (one
#: long loop over all environments instead of a short one per row)
PER_ENV_WEIGHTS_BELOW = 64
#: environments of one block of such a rollout: their weight copies (360 floats each) stay in cache
ENV_BLOCK = 1024
#: environments of one block of a rollout with many trajectories a row (whole rows, at least one): the
#: step's ``[32, environments]`` hidden units stay in cache across its four calls instead of
#: streaming through memory (m_h = 1000: 60 000 environments, 7.7 MB a pass); the same bits
SEGMENT_BLOCK = 8192


def _plain_float32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad


def compiled_rollout_applies(net: SoftmaxMlp, family: Any, params: Any, theta: torch.Tensor) -> tuple[Any, tuple[Any, ...]] | None:
    """The family's compiled transition and its data when a compiled rollout applies, else ``None``.

    It applies to the network of a ``FastMlpPolicy`` built with ``kernels="numba"`` (or ``"auto"``
    with Numba installed), float32 CPU parameters without gradients, and a family with a compiled
    transition for these parameters (:meth:`~fedrl_envs.family.TaskFamily.compiled_transition`).
    """
    if resolve_kernels(net.kernels, theta.device) != "numba" or not _plain_float32(theta):
        return None
    if not numba_available():
        return None
    hook = getattr(family, "compiled_transition", None)
    return None if hook is None else hook(params, math.prod(theta.shape[:-1]))


def _as_arrays(*tensors: torch.Tensor) -> tuple[np.ndarray, ...]:
    return tuple(t.contiguous().numpy() for t in tensors)


def _rollout_weights(net: SoftmaxMlp, theta: torch.Tensor) -> tuple[np.ndarray, ...]:
    """``theta [R, d]`` as the σ-form weights the rollout loops take: ``2W1 [R, i, h]``, ``2b1 [R, h]``,
    ``2W2 [R, h, o]``, ``b2 − W2ᵀ1 [R, o]`` (``tanh z = 2σ(2z) − 1``: the tensors
    :func:`~fedrl_algos.policies.mlp.kernels.mlp_rollout` computes)."""
    w1, b1, w2, b2 = unpack_weights(net, theta)
    return _as_arrays(2.0 * w1, 2.0 * b1, 2.0 * w2, b2 - w2.sum(-2))


def _gradient_weights(net: SoftmaxMlp, theta: torch.Tensor) -> tuple[np.ndarray, ...]:
    """``theta [R, d]`` as the gradient loops take it: ``2W1``, ``2b1`` (the pre-activations of σ(2z)),
    ``W2 [R, h, o]``, ``b2 [R, o]`` (the tanh-form logits) and ``W2ᵀ [R, o, h]`` (the backprop)."""
    w1, b1, w2, b2 = unpack_weights(net, theta)
    return _as_arrays(2.0 * w1, 2.0 * b1, w2, b2, w2.transpose(-1, -2))


def compiled_rollout(
    family: Any, params: Any, net: SoftmaxMlp, theta: torch.Tensor, streams: RandomStreams, n_trajectories: int,
    transition: tuple[Any, tuple[Any, ...]], horizon: int | None = None,
) -> Trajectories:
    """:func:`~fedrl_algos.policies.mlp.kernels.mlp_rollout` through the compiled loops (module docstring).

    The same random numbers in the same order (the streams are left in the same state), the same
    reset and sampling rule.

    :param transition: what :func:`compiled_rollout_applies` returned for these arguments
    """
    batch = theta.shape[:-1]
    m = check_rollout_batch(theta, streams, n_trajectories)
    rows = math.prod(batch)
    if horizon is None:
        horizon = family.horizon(params)
    steps = horizon + 1
    n_envs = rows * m
    step_fn, data = transition
    loops = _loops(step_fn)
    noise = _uniforms(loops, streams, m * family.reset_noise_dim)
    # [rows, steps·m] as drawn (step-major); environment-major [rows·m, steps] for the loops
    uniforms = np.ascontiguousarray(_uniforms(loops, streams, steps * m).reshape(rows, steps, m).transpose(0, 2, 1))
    uniforms = uniforms.reshape(n_envs, steps)
    start = family.reset(repeat_params(params, m), torch.from_numpy(noise).reshape(n_envs, -1))
    state = start.to(torch.float32).reshape(n_envs, -1).numpy().copy()  # an own, writable, contiguous copy
    a1, a1b, a2, a2b = _rollout_weights(net, theta.reshape(rows, -1))
    n_in, n_hidden, n_out = a1.shape[1], a2.shape[1], a2.shape[2]
    if state.shape[1] != n_in:
        raise ValueError(f"observations must have {n_in} features (the policy's input), got {state.shape[1]}")
    obs = np.empty((n_envs, steps, n_in), np.float32)
    actions = np.empty((n_envs, steps), np.int64)
    rewards = np.empty((n_envs, steps), np.float32)
    terminated = np.empty((n_envs, steps), np.bool_)
    # Few environments a row: every environment gets its row's weights (one long loop over all of
    # them), in blocks that keep those copies cache-sized; many: the row's weights over its segment,
    # in blocks of whole rows that keep a step's intermediates cache-sized. Environments never
    # interact, so the blocks run one after the other, each through every time step.
    per_env = m < PER_ENV_WEIGHTS_BELOW
    block = max(1, (ENV_BLOCK if per_env else SEGMENT_BLOCK) // m)
    for r0 in range(0, rows, block):
        r1 = min(rows, r0 + block)
        envs = slice(r0 * m, r1 * m)
        nb = (r1 - r0) * m
        inputs = np.ascontiguousarray(state[envs].T)  # [i, nb]: feature-major, the loops run along environments
        hidden, exps = np.empty((n_hidden, nb), np.float32), np.empty((n_out, nb), np.float32)
        hidden_t, exps_t = torch.from_numpy(hidden), torch.from_numpy(exps)
        if per_env:
            e1, e1b = np.empty((n_in, n_hidden, nb), np.float32), np.empty((n_hidden, nb), np.float32)
            e2, e2b = np.empty((n_hidden, n_out, nb), np.float32), np.empty((n_out, nb), np.float32)
            loops.per_env_weights(a1[r0:r1], a1b[r0:r1], a2[r0:r1], a2b[r0:r1], m, e1, e1b, e2, e2b)
        block_state, block_u = state[envs], uniforms[envs]
        block_out = (obs[envs], actions[envs], rewards[envs], terminated[envs])
        if per_env:
            loops.hidden_inputs_per_env(e1, e1b, inputs, hidden)
            for t in range(steps):
                hidden_t.sigmoid_()
                loops.centred_logits_per_env(e2, e2b, hidden, exps)
                exps_t.exp_()
                loops.act_step_and_next_inputs(exps, block_u, t, block_state, data, r0, m, inputs, *block_out, e1, e1b, hidden)
            continue
        w1_rows, b1_rows, w2_rows, b2_rows = a1[r0:r1], a1b[r0:r1], a2[r0:r1], a2b[r0:r1]
        for t in range(steps):
            loops.hidden_inputs(w1_rows, b1_rows, inputs, m, hidden)
            hidden_t.sigmoid_()
            loops.centred_logits(w2_rows, b2_rows, hidden, m, exps)
            exps_t.exp_()
            loops.act_and_step(exps, block_u, t, block_state, data, r0, m, inputs, *block_out)
    return Trajectories.from_steps(
        torch.from_numpy(obs).reshape(*batch, m, steps, n_in),
        torch.from_numpy(actions).reshape(*batch, m, steps),
        torch.from_numpy(rewards).reshape(*batch, m, steps),
        torch.from_numpy(terminated).reshape(*batch, m, steps),
        theta.dtype,
    )


def _uniforms(loops: _Loops, streams: RandomStreams, count: int) -> np.ndarray:
    """``streams.uniform((count,))`` as a ``[rows, count]`` array, the same bits, drawn by a compiled loop
    (:func:`fedrl_envs.rng.uniform32_rows_numpy`); the counters advance as that call advances them."""
    if streams.keys.device.type != "cpu":
        return streams.uniform((count,)).reshape(-1, count).cpu().numpy()
    keys = streams.keys.reshape(-1).contiguous().numpy().view(np.uint64)
    counters = streams.counters.reshape(-1).contiguous().numpy().view(np.uint64)
    out = np.empty((keys.shape[0], count), np.float32)
    loops.uniform_rows(keys, counters, out)
    streams.advance(count)
    return out


def compiled_gradient_applies(net: SoftmaxMlp, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor) -> bool:
    """Whether :func:`compiled_policy_gradient` applies: the network's kernels resolve to ``"numba"``,
    float32 CPU tensors without gradients (parameters, observations, weights), integer actions."""
    return (
        resolve_kernels(net.kernels, theta.device) == "numba"
        and _plain_float32(theta) and _plain_float32(weights)
        and traj.obs.device.type == "cpu" and not traj.obs.requires_grad and traj.obs.is_floating_point()
        and traj.actions.device.type == "cpu" and not traj.actions.is_floating_point() and traj.actions.dtype != torch.bool
        and numba_available()
    )


def compiled_policy_gradient(
    net: SoftmaxMlp, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor, chunk_samples: int | None = None
) -> torch.Tensor:
    """:func:`~fedrl_algos.policies.mlp.kernels.mlp_policy_gradient` through the compiled loops: ``[*B, d]``.

    ``(1/m) Σ_ξ Σ_h ∇log π(a_h|s_h) ψ_h``: each sample back-propagated, a trajectory's samples summed
    in float32 in their order, the trajectories' sums in float64, rounded to float32 at the end.
    The probabilities are computed as torch's kernel computes them (``h = 2σ(2z) − 1``, then
    ``W2ᵀh + b2``), in a fixed order.

    :param chunk_samples: samples per tile (default :data:`GRADIENT_CHUNK_SAMPLES`; the result does not depend on it)
    """
    batch = theta.shape[:-1]
    rows = math.prod(batch)
    d = theta.shape[-1]
    m, steps = traj.rewards.shape[-2], traj.rewards.shape[-1]
    n = m * steps
    th = theta.reshape(rows, d)
    a1, a1b, w2, b2, w2t = _gradient_weights(net, th)
    n_in, n_hidden, n_out = a1.shape[1], w2.shape[1], w2.shape[2]
    inputs = traj.obs.to(torch.float32).reshape(rows, n, n_in).numpy()
    acts = traj.actions.to(torch.int64).reshape(rows, n).numpy()
    weight = weights.expand(*batch, m, steps).reshape(rows, n).numpy()
    loops = _loops(None)
    # float64 sums in the loops' layout: ∇W1 [i, h], ∇b1 [h], ∇W2ᵀ [o, h], ∇b2 [o] (contiguous along h)
    total = np.zeros((rows, d), np.float64)
    per_tile = max(1, chunk_samples or GRADIENT_CHUNK_SAMPLES)
    samples = min(n, max(1, per_tile // steps) * steps)  # whole trajectories: a tile never splits one's sum
    row_block = max(1, per_tile // samples)
    for r0 in range(0, rows, row_block):
        nr = min(row_block, rows - r0)
        rs = slice(r0, r0 + nr)
        for n0 in range(0, n, samples):
            nn = min(samples, n - n0)
            ns = slice(n0, n0 + nn)
            # sample-major tiles: row r's nn samples are columns [r·nn, (r + 1)·nn) of every feature
            x = np.ascontiguousarray(inputs[rs, ns].reshape(nr * nn, n_in).T)
            tile_actions = np.ascontiguousarray(acts[rs, ns]).reshape(-1)
            tile_weights = np.ascontiguousarray(weight[rs, ns]).reshape(-1)
            sig, hid = np.empty((n_hidden, nr * nn), np.float32), np.empty((n_hidden, nr * nn), np.float32)
            exps = np.empty((n_out, nr * nn), np.float32)
            loops.hidden_inputs(a1[rs], a1b[rs], x, nn, sig)
            torch.from_numpy(sig).sigmoid_()
            # the logits from h = 2σ − 1 and W2, as torch's kernel computes them: without the σ form's
            # offset b2 − W2ᵀ1, whose rounding error scales with |W2|, not with |W2ᵀh|
            loops.tanh_of_sigmoid(sig, hid)
            loops.centred_logits(w2[rs], b2[rs], hid, nn, exps)
            torch.from_numpy(exps).exp_()
            loops.backprop(exps, sig, hid, x, tile_actions, tile_weights, w2t[rs], nn, steps, total[rs])
    grad = torch.from_numpy((total / m).astype(np.float32))
    # back to θ's layout: W1 and b1 as they are, W2 from its transpose, b2
    w2_at = n_in * n_hidden + n_hidden
    gw2 = grad[:, w2_at : w2_at + n_hidden * n_out].reshape(rows, n_out, n_hidden).transpose(1, 2).reshape(rows, -1)
    grad = torch.cat([grad[:, :w2_at], gw2, grad[:, w2_at + n_hidden * n_out :]], dim=1)
    return grad.reshape(*batch, d)


# --------------------------------------------------------------------------------------------
# the compiled loops
# --------------------------------------------------------------------------------------------


def _hidden_inputs(a1, a1b, x, seg, out):
    """``out[j, c] = Σ_k a1[r, k, j] x[k, c] + a1b[r, j]`` for the columns ``c`` of row ``r``'s segment
    ``[r·seg, (r + 1)·seg)`` (feature-major ``[features, columns]``): the terms summed in order, the
    bias added last (torch's order for two inputs)."""
    rows, n_in, n_hidden = a1.shape
    for r in range(rows):
        lo, hi = r * seg, (r + 1) * seg
        x0 = x[0, lo:hi]
        for j in range(n_hidden):
            row = out[j, lo:hi]
            w0 = a1[r, 0, j]
            b = a1b[r, j]
            if n_in == 2:  # the arc policy's inputs: one pass
                w1 = a1[r, 1, j]
                x1 = x[1, lo:hi]
                for c in range(seg):
                    row[c] = (w0 * x0[c] + w1 * x1[c]) + b
                continue
            for c in range(seg):
                row[c] = w0 * x0[c]
            for k in range(1, n_in):
                w = a1[r, k, j]
                xk = x[k, lo:hi]
                for c in range(seg):
                    row[c] += w * xk[c]
            for c in range(seg):
                row[c] += b


def _centred_logits(a2, a2b, sig, seg, out):
    """``out[:, c] = a2[r]ᵀ sig[:, c] + a2b[r]`` less its maximum over the outputs, for the columns of
    row ``r``'s segment (feature-major).

    Each output sums the hidden units in order and adds the bias last. Two outputs and four hidden
    units share a pass over the segment (the same operations for every element, fewer loops).
    """
    rows, n_hidden, n_out = a2.shape
    top = np.empty(seg, np.float32)
    for r in range(rows):
        lo, hi = r * seg, (r + 1) * seg
        q = 0
        while q < n_out:
            pair = q + 1 < n_out
            qb = q + 1 if pair else q
            ra, rb = out[q, lo:hi], out[qb, lo:hi]
            s0 = sig[0, lo:hi]
            wa, wb = a2[r, 0, q], a2[r, 0, qb]
            for c in range(seg):
                ra[c] = wa * s0[c]
                rb[c] = wb * s0[c]  # the same row again when unpaired: written, never accumulated twice
            j = 1
            while j + 4 <= n_hidden:
                s0, s1, s2, s3 = sig[j, lo:hi], sig[j + 1, lo:hi], sig[j + 2, lo:hi], sig[j + 3, lo:hi]
                a0, a1, a2_, a3 = a2[r, j, q], a2[r, j + 1, q], a2[r, j + 2, q], a2[r, j + 3, q]
                b0, b1, b2, b3 = a2[r, j, qb], a2[r, j + 1, qb], a2[r, j + 2, qb], a2[r, j + 3, qb]
                if pair:
                    for c in range(seg):
                        ra[c] = (((ra[c] + a0 * s0[c]) + a1 * s1[c]) + a2_ * s2[c]) + a3 * s3[c]
                        rb[c] = (((rb[c] + b0 * s0[c]) + b1 * s1[c]) + b2 * s2[c]) + b3 * s3[c]
                else:
                    for c in range(seg):
                        ra[c] = (((ra[c] + a0 * s0[c]) + a1 * s1[c]) + a2_ * s2[c]) + a3 * s3[c]
                j += 4
            while j < n_hidden:
                s0 = sig[j, lo:hi]
                a0, b0 = a2[r, j, q], a2[r, j, qb]
                if pair:
                    for c in range(seg):
                        ra[c] += a0 * s0[c]
                        rb[c] += b0 * s0[c]
                else:
                    for c in range(seg):
                        ra[c] += a0 * s0[c]
                j += 1
            q += 2
        for q in range(n_out):
            row = out[q, lo:hi]
            b = a2b[r, q]
            for c in range(seg):
                row[c] += b
                top[c] = row[c] if q == 0 else max(top[c], row[c])
        for q in range(n_out):
            row = out[q, lo:hi]
            for c in range(seg):
                row[c] -= top[c]


def _per_env_weights(a1, a1b, a2, a2b, m, e1, e1b, e2, e2b):
    """Every environment's copy of its row's weights: ``e1[k, j, c] = a1[c // m, k, j]`` and so on, so
    that :func:`_hidden_inputs_per_env` and :func:`_centred_logits_per_env` run one loop over all
    columns (environments) whatever their row."""
    rows, n_in, n_hidden = a1.shape
    n_out = a2.shape[2]
    for r in range(rows):
        lo, hi = r * m, (r + 1) * m
        for j in range(n_hidden):
            for k in range(n_in):
                e1[k, j, lo:hi] = a1[r, k, j]
            e1b[j, lo:hi] = a1b[r, j]
            for q in range(n_out):
                e2[j, q, lo:hi] = a2[r, j, q]
        for q in range(n_out):
            e2b[q, lo:hi] = a2b[r, q]


def _hidden_inputs_per_env(e1, e1b, x, out):
    """:func:`_hidden_inputs` with per-column weights: the same operations in the same order."""
    n_in, n_hidden, n = e1.shape
    x0 = x[0]
    for j in range(n_hidden):
        row = out[j]
        w0 = e1[0, j]
        b = e1b[j]
        if n_in == 2:
            w1 = e1[1, j]
            x1 = x[1]
            for c in range(n):
                row[c] = (w0[c] * x0[c] + w1[c] * x1[c]) + b[c]
            continue
        for c in range(n):
            row[c] = w0[c] * x0[c]
        for k in range(1, n_in):
            w = e1[k, j]
            xk = x[k]
            for c in range(n):
                row[c] += w[c] * xk[c]
        for c in range(n):
            row[c] += b[c]


def _centred_logits_per_env(e2, e2b, sig, out):
    """:func:`_centred_logits` with per-column weights: the same operations in the same order."""
    n_hidden, n_out, n = e2.shape
    top = np.empty(n, np.float32)
    for q in range(n_out):
        row = out[q]
        w0 = e2[0, q]
        s0 = sig[0]
        for c in range(n):
            row[c] = w0[c] * s0[c]
        j = 1
        while j + 4 <= n_hidden:
            wa, wb, wc, wd = e2[j, q], e2[j + 1, q], e2[j + 2, q], e2[j + 3, q]
            sa, sb, sc, sd = sig[j], sig[j + 1], sig[j + 2], sig[j + 3]
            for c in range(n):
                row[c] = (((row[c] + wa[c] * sa[c]) + wb[c] * sb[c]) + wc[c] * sc[c]) + wd[c] * sd[c]
            j += 4
        while j < n_hidden:
            wa, sa = e2[j, q], sig[j]
            for c in range(n):
                row[c] += wa[c] * sa[c]
            j += 1
        b = e2b[q]
        for c in range(n):
            row[c] += b[c]
            top[c] = row[c] if q == 0 else max(top[c], row[c])
    for q in range(n_out):
        row = out[q]
        for c in range(n):
            row[c] -= top[c]


def _act_and_step(exps, uniforms, t, state, data, r0, m, inputs, obs, actions, rewards, terminated):
    """Time step ``t`` of every environment ``c`` (of batch row ``r0 + c // m``): draw, step, record,
    next inputs.

    The action is the number of entries of the unnormalized CDF (cumulative sums of ``exps[:, c]``,
    accumulated in float64 and rounded to float32 as torch's ``cumsum`` does) below ``u·CDF[-1]``,
    at most the last action: :func:`~fedrl_algos.policies.mlp.kernels.mlp_rollout`'s rule.
    """
    n_out, n = exps.shape
    n_in = inputs.shape[0]
    cdf = np.empty(n_out, np.float32)
    for c in range(n):
        acc = 0.0
        for q in range(n_out):
            acc += np.float64(exps[q, c])
            cdf[q] = np.float32(acc)
        threshold = cdf[n_out - 1] * uniforms[c, t]
        action = 0
        for q in range(n_out):
            action += cdf[q] < threshold
        action = min(action, n_out - 1)
        for k in range(n_in):
            obs[c, t, k] = state[c, k]
        reward, ended = transition(state, c, action, r0 + c // m, data)  # noqa: F821 (bound by _loops)
        actions[c, t] = action
        rewards[c, t] = reward
        terminated[c, t] = ended
        for k in range(n_in):
            inputs[k, c] = state[c, k]


def _act_step_and_next_inputs(exps, uniforms, t, state, data, r0, m, inputs, obs, actions, rewards, terminated,
                              e1, e1b, hidden):
    """:func:`_act_and_step`, then the next step's pre-activations (:func:`_hidden_inputs_per_env`):
    one call a step less for the rollouts with per-environment weights."""
    act_and_step(exps, uniforms, t, state, data, r0, m, inputs, obs, actions, rewards, terminated)  # noqa: F821
    hidden_inputs_per_env(e1, e1b, inputs, hidden)  # noqa: F821 (both bound by _Loops)


def _tanh_of_sigmoid(sig, out):
    """``out = 2·sig − 1`` (``tanh z`` from ``σ(2z)``), elementwise as torch computes it in float32."""
    flat_in, flat_out = sig.reshape(-1), out.reshape(-1)
    for k in range(flat_in.shape[0]):
        flat_out[k] = np.float32(2.0) * flat_in[k] - np.float32(1.0)


def _backprop(exps, sig, hidden, x, actions, weights, w2t, seg, steps, total):
    """Add every sample's ``ψ ∇log π(a|x)`` to its row of ``total`` (float64 ``[R, d]`` in the layout
    ``∇W1 [i, h], ∇b1 [h], ∇W2ᵀ [o, h], ∇b2 [o]``); row ``r``'s samples are the columns
    ``[r·seg, (r + 1)·seg)``, each trajectory's ``steps`` samples summed in float32 in their order,
    the trajectory's sum then added in float64.

    With ``s = σ(2z)`` and ``h = tanh z = 2s − 1`` (``hidden``): ``1 − h² = 4s(1 − s)``,
    ``p = exps / Σ exps``, ``δ = e_a − p``; ``∇b2 = ψδ``, ``∇W2ᵀ = ψδ hᵀ``,
    ``∇b1 = (1 − h²) ⊙ W2 ψδ``, ``∇W1 = x ∇b1ᵀ``. Samples with ``ψ = 0`` contribute nothing and are skipped.
    """
    n_out = exps.shape[0]
    n_in, n_hidden = x.shape[0], sig.shape[0]
    rows, d = total.shape
    b1_at = n_in * n_hidden
    w2_at = b1_at + n_hidden
    b2_at = w2_at + n_hidden * n_out
    part = np.zeros(d, np.float32)
    out = np.empty(n_out, np.float32)
    hid = np.empty(n_hidden, np.float32)
    zsig = np.empty(n_hidden, np.float32)
    for r in range(rows):
        acc = total[r]
        for start in range(r * seg, (r + 1) * seg, steps):
            added = False
            for k in range(start, min(start + steps, (r + 1) * seg)):
                w = weights[k]
                if w == 0.0:
                    continue
                added = True
                norm = np.float32(0.0)
                for q in range(n_out):
                    norm += exps[q, k]
                a = actions[k]
                for q in range(n_out):
                    out[q] = (np.float32(q == a) - exps[q, k] / norm) * w
                for j in range(n_hidden):
                    hid[j] = hidden[j, k]
                    zsig[j] = np.float32(0.0)
                # W2 ψδ, the outputs summed in order, four to a pass over the hidden units
                q = 0
                while q + 4 <= n_out:
                    oa, ob, oc, od = out[q], out[q + 1], out[q + 2], out[q + 3]
                    wa, wb, wc, wd = w2t[r, q], w2t[r, q + 1], w2t[r, q + 2], w2t[r, q + 3]
                    for j in range(n_hidden):
                        zsig[j] = (((zsig[j] + wa[j] * oa) + wb[j] * ob) + wc[j] * oc) + wd[j] * od
                    q += 4
                while q < n_out:
                    oa, wa = out[q], w2t[r, q]
                    for j in range(n_hidden):
                        zsig[j] += wa[j] * oa
                    q += 1
                gb1 = part[b1_at : b1_at + n_hidden]
                for j in range(n_hidden):
                    s = sig[j, k]
                    zsig[j] *= np.float32(4.0) * s * (np.float32(1.0) - s)
                    gb1[j] += zsig[j]
                for q in range(n_in):
                    xq = x[q, k]
                    gw1 = part[q * n_hidden : (q + 1) * n_hidden]
                    for j in range(n_hidden):
                        gw1[j] += xq * zsig[j]
                q = 0
                while q + 4 <= n_out:
                    oa, ob, oc, od = out[q], out[q + 1], out[q + 2], out[q + 3]
                    at = w2_at + q * n_hidden
                    ga, gb = part[at : at + n_hidden], part[at + n_hidden : at + 2 * n_hidden]
                    gc, gd = part[at + 2 * n_hidden : at + 3 * n_hidden], part[at + 3 * n_hidden : at + 4 * n_hidden]
                    for j in range(n_hidden):
                        h = hid[j]
                        ga[j] += h * oa
                        gb[j] += h * ob
                        gc[j] += h * oc
                        gd[j] += h * od
                    q += 4
                while q < n_out:
                    oa = out[q]
                    ga = part[w2_at + q * n_hidden : w2_at + (q + 1) * n_hidden]
                    for j in range(n_hidden):
                        ga[j] += hid[j] * oa
                    q += 1
                for q in range(n_out):
                    part[b2_at + q] += out[q]
            if added:
                for e in range(d):
                    acc[e] += np.float64(part[e])
                    part[e] = np.float32(0.0)


class _Loops:
    """The compiled loops; ``act_and_step`` only with a family's transition bound."""

    def __init__(self, transition: Any) -> None:
        from fedrl_envs.fused import compile_loop, inline

        self.hidden_inputs = _compiled(_hidden_inputs)
        self.centred_logits = _compiled(_centred_logits)
        self.backprop = _compiled(_backprop)
        self.tanh_of_sigmoid = _compiled(_tanh_of_sigmoid)
        self.per_env_weights = _compiled(_per_env_weights)
        self.hidden_inputs_per_env = _compiled(_hidden_inputs_per_env)
        self.centred_logits_per_env = _compiled(_centred_logits_per_env)
        self.uniform_rows = compile_loop(uniform32_rows_numpy, {"uniform32_of_finalizer_input_numpy": inline(
            uniform32_of_finalizer_input_numpy)}, (uniform32_of_finalizer_input_numpy,))
        if transition is not None:
            self.act_and_step = compile_loop(_act_and_step, {"transition": transition}, (transition.py_func,))
            step = inline(_act_and_step, {"transition": transition})
            self.act_step_and_next_inputs = compile_loop(
                _act_step_and_next_inputs, {"act_and_step": step, "hidden_inputs_per_env": inline(_hidden_inputs_per_env)},
                (_act_and_step, transition.py_func, _hidden_inputs_per_env))


@functools.cache
def _compiled(loop: Any) -> Any:
    from fedrl_envs.fused import compile_loop

    return compile_loop(loop, {})


@functools.lru_cache(maxsize=16)
def _loops(transition: Any) -> _Loops:
    return _Loops(transition)
