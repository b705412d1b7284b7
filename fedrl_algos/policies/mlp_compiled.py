"""Compiled rollouts and policy gradients of the paper's softmax MLP: ``FastMlpPolicy(kernels="numba")``.

On the CPU a rollout of :func:`~fedrl_algos.policies.mlp_kernels.mlp_rollout` costs about 30 torch
operations a time step, and at the batches of the neural experiments (60 rows × 10 trajectories)
each of them is a few microseconds of dispatch plus, for the two batched matrix products, one small
BLAS call per row: about 0.35 ms a time step. Here a time step is four calls, two loops compiled
by `Numba <https://numba.pydata.org>`_ and torch's vectorized ``sigmoid_`` and ``exp_``:

1. the hidden pre-activations ``2W1ᵀx + 2b1`` of every environment (compiled);
2. ``σ`` of them in place (torch);
3. the logits in the σ form of :func:`~fedrl_algos.policies.mlp_kernels.mlp_rollout`,
   ``(2W2)ᵀσ + (b2 − W2ᵀ1)``, less their maximum (compiled);
4. ``exp`` in place (torch); then one compiled pass draws every action by the same inverse-CDF
   rule from the same uniforms, steps every environment through the family's compiled transition
   (:meth:`TaskFamily.compiled_transition <fedrl_envs.core.TaskFamily.compiled_transition>`,
   bitwise its torch step), records the step and computes the next pre-activations.

The policy gradient (:func:`compiled_policy_gradient`) recomputes the probabilities through the same
four stages, so they are bitwise those the actions were drawn from, and back-propagates each
sample in float64, summing the samples of a row in their order: a row's gradient does not depend
on the rest of the batch nor on the tiling.

**Not bitwise the torch kernels.** The random numbers, the reset, the environment step, σ, exp and
the cumulative sums (torch accumulates them in float64 too) are those of ``kernels="torch"``; the
matrix products are summed in a fixed sequential order where torch's BLAS uses its own blocking
(the hidden layer's two-term sums happen to agree; the 32-term output sums differ in the last bit
for some logits), so an action whose uniform falls within rounding error of a CDF boundary may
differ, and the trajectories part from there; the gradient is accumulated in float64 instead of
float32 products. Runs are therefore reproducible (same seed, same bits, on any batch) but not
bitwise comparable with ``kernels="torch"`` (``tests/test_compiled_mlp.py`` bounds the
differences; ``docs/benchmarks.md`` compares the experiments' results).

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
from fedrl_envs.core import repeat_params
from fedrl_envs.fused import numba_available
from fedrl_envs.rng import RandomStreams

__all__ = ["KERNELS", "check_kernels", "resolve_kernels", "compiled_rollout_applies", "compiled_rollout",
           "compiled_gradient_applies", "compiled_policy_gradient", "unpack_weights", "GRADIENT_CHUNK_SAMPLES"]

#: the kernel choices of ``FastMlpPolicy``: ``"torch"`` (:mod:`.mlp_kernels`), ``"numba"`` (this
#: module, where it applies; the torch kernels elsewhere) and ``"auto"`` (``"numba"`` when Numba is installed)
KERNELS = ("torch", "numba", "auto")
#: samples (rows × trajectories × steps) of one tile of the policy gradient: the ``[rows, n, 32]``
#: hidden activations stay around a few megabytes
GRADIENT_CHUNK_SAMPLES = 32768


def check_kernels(kernels: Any) -> str:
    """``kernels`` if it is one of :data:`KERNELS` (``ValueError`` naming the argument otherwise)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {list(KERNELS)}, got {kernels!r}")
    return kernels


def resolve_kernels(kernels: str, device: str | torch.device = "cpu") -> str:
    """``"auto"`` as ``"numba"`` on a CPU with Numba installed, else ``"torch"``; the others as they are."""
    check_kernels(kernels)
    if kernels != "auto":
        return kernels
    return "numba" if torch.device(device).type == "cpu" and numba_available() else "torch"


def _plain_float32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad


def compiled_rollout_applies(policy: Any, family: Any, params: Any, theta: torch.Tensor) -> tuple[Any, tuple[Any, ...]] | None:
    """The family's compiled transition and its data when a compiled rollout applies, else ``None``.

    It applies to a ``FastMlpPolicy`` built with ``kernels="numba"`` (or ``"auto"`` with Numba
    installed), float32 CPU parameters without gradients, and a family with a compiled transition
    for these parameters (:meth:`~fedrl_envs.core.TaskFamily.compiled_transition`).
    """
    if resolve_kernels(getattr(policy, "kernels", "torch"), theta.device) != "numba" or not _plain_float32(theta):
        return None
    if not numba_available():
        return None
    hook = getattr(family, "compiled_transition", None)
    return None if hook is None else hook(params, math.prod(theta.shape[:-1]))


def unpack_weights(policy: Any, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``theta [R, d]`` → ``W1 [R, i, h]``, ``b1 [R, h]``, ``W2 [R, h, o]``, ``b2 [R, o]``."""
    i, h, o = policy.sizes
    rows = theta.shape[0]
    w1 = theta[:, : i * h].reshape(rows, i, h)
    b1 = theta[:, i * h : i * h + h]
    w2 = theta[:, i * h + h : i * h + h + h * o].reshape(rows, h, o)
    b2 = theta[:, i * h + h + h * o :]
    return w1, b1, w2, b2


def _weights(policy: Any, theta: torch.Tensor) -> tuple[np.ndarray, ...]:
    """``theta [R, d]`` as the loops' arrays: the σ-form weights ``2W1 [R, i, h]``, ``2b1 [R, h]``,
    ``2W2 [R, h, o]``, ``b2 − W2ᵀ1 [R, o]`` (``tanh z = 2σ(2z) − 1``: the tensors
    :func:`~fedrl_algos.policies.mlp_kernels.mlp_rollout` computes), then ``W2 [R, h, o]``, ``b2 [R, o]``
    and ``W2ᵀ [R, o, h]``."""
    w1, b1, w2, b2 = unpack_weights(policy, theta)
    arrays = (2.0 * w1, 2.0 * b1, 2.0 * w2, b2 - w2.sum(-2), w2, b2, w2.transpose(-1, -2))
    return tuple(t.contiguous().numpy() for t in arrays)


def compiled_rollout(
    family: Any, params: Any, policy: Any, theta: torch.Tensor, streams: RandomStreams, n_trajectories: int,
    transition: tuple[Any, tuple[Any, ...]], horizon: int | None = None,
) -> Trajectories:
    """:func:`~fedrl_algos.policies.mlp_kernels.mlp_rollout` through the compiled loops (module docstring).

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
    noise = streams.uniform((m, family.reset_noise_dim))
    uniforms = streams.uniform((steps, m), dtype=theta.dtype).reshape(rows, steps, m).numpy()
    start = family.reset(repeat_params(params, m), noise.reshape(rows * m, -1))
    state = start.to(torch.float32).reshape(rows * m, -1).numpy().copy()  # an own, writable, contiguous copy
    a1, a1b, a2, a2b = _weights(policy, theta.reshape(rows, -1))[:4]
    n_in, n_hidden, n_out = a1.shape[1], a2.shape[1], a2.shape[2]
    if state.shape[1] != n_in:
        raise ValueError(f"observations must have {n_in} features (the policy's input), got {state.shape[1]}")
    obs = np.empty((rows, m, steps, n_in), np.float32)
    actions = np.empty((rows, m, steps), np.int64)
    rewards = np.empty((rows, m, steps), np.float32)
    terminated = np.empty((rows, m, steps), np.bool_)
    # feature-major ([rows, features, m]) intermediates: the loops vectorize along the m environments of a row
    inputs = np.ascontiguousarray(state.reshape(rows, m, n_in).transpose(0, 2, 1))
    hidden = np.empty((rows, n_hidden, m), np.float32)
    exps = np.empty((rows, n_out, m), np.float32)
    hidden_t, exps_t = torch.from_numpy(hidden), torch.from_numpy(exps)
    step_fn, data = transition
    loops = _loops(step_fn)
    for t in range(steps):
        loops.hidden_inputs(a1, a1b, inputs, hidden)
        hidden_t.sigmoid_()
        loops.centred_logits(a2, a2b, hidden, exps)
        exps_t.exp_()
        loops.act_and_step(exps, uniforms, t, state, data, inputs, obs, actions, rewards, terminated)
    return Trajectories.from_steps(
        torch.from_numpy(obs).reshape(*batch, m, steps, n_in),
        torch.from_numpy(actions).reshape(*batch, m, steps),
        torch.from_numpy(rewards).reshape(*batch, m, steps),
        torch.from_numpy(terminated).reshape(*batch, m, steps),
        theta.dtype,
    )


def compiled_gradient_applies(policy: Any, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor) -> bool:
    """Whether :func:`compiled_policy_gradient` applies: the policy's kernels resolve to ``"numba"``,
    float32 CPU tensors without gradients (parameters, observations, weights), integer actions."""
    return (
        resolve_kernels(getattr(policy, "kernels", "torch"), theta.device) == "numba"
        and _plain_float32(theta) and _plain_float32(weights)
        and traj.obs.device.type == "cpu" and not traj.obs.requires_grad and traj.obs.is_floating_point()
        and traj.actions.device.type == "cpu" and not traj.actions.is_floating_point() and traj.actions.dtype != torch.bool
        and numba_available()
    )


def compiled_policy_gradient(
    policy: Any, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor, chunk_samples: int | None = None
) -> torch.Tensor:
    """:func:`~fedrl_algos.policies.mlp_kernels.mlp_policy_gradient` through the compiled loops: ``[*B, d]``.

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
    a1, a1b, a2, _, w2, b2, w2t = _weights(policy, th)
    n_in, n_hidden, n_out = a1.shape[1], a2.shape[1], a2.shape[2]
    inputs = traj.obs.to(torch.float32).reshape(rows, n, n_in).transpose(1, 2).contiguous().numpy()  # [R, i, n]
    acts = traj.actions.to(torch.int64).reshape(rows, n).contiguous().numpy()
    weight = weights.expand(*batch, m, steps).reshape(rows, n).contiguous().numpy()
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
            x = np.ascontiguousarray(inputs[rs, :, ns])
            sig, hid = np.empty((nr, n_hidden, nn), np.float32), np.empty((nr, n_hidden, nn), np.float32)
            exps = np.empty((nr, n_out, nn), np.float32)
            loops.hidden_inputs(a1[rs], a1b[rs], x, sig)
            torch.from_numpy(sig).sigmoid_()
            # the logits from h = 2σ − 1 and W2, as torch's kernel computes them: without the σ form's
            # offset b2 − W2ᵀ1, whose rounding error scales with |W2|, not with |W2ᵀh|
            loops.tanh_of_sigmoid(sig, hid)
            loops.centred_logits(w2[rs], b2[rs], hid, exps)
            torch.from_numpy(exps).exp_()
            loops.backprop(exps, sig, hid, x, acts[rs, ns], weight[rs, ns], w2t[rs], steps, total[rs])
    grad = torch.from_numpy((total / m).astype(np.float32))
    # back to θ's layout: W1 and b1 as they are, W2 from its transpose, b2
    w2_at = n_in * n_hidden + n_hidden
    gw2 = grad[:, w2_at : w2_at + n_hidden * n_out].reshape(rows, n_out, n_hidden).transpose(1, 2).reshape(rows, -1)
    grad = torch.cat([grad[:, :w2_at], gw2, grad[:, w2_at + n_hidden * n_out :]], dim=1)
    return grad.reshape(*batch, d)


# --------------------------------------------------------------------------------------------
# the compiled loops
# --------------------------------------------------------------------------------------------


def _hidden_inputs(a1, a1b, x, out):
    """``out[r, j, n] = Σ_k a1[r, k, j] x[r, k, n] + a1b[r, j]`` (feature-major), the terms summed in
    order and the bias added last: torch's order for two inputs."""
    rows, n_in, n_hidden = a1.shape
    m = x.shape[2]
    for r in range(rows):
        x0 = x[r, 0]
        for j in range(n_hidden):
            row = out[r, j]
            w0 = a1[r, 0, j]
            b = a1b[r, j]
            if n_in == 2:  # the arc policy's inputs: one pass
                w1 = a1[r, 1, j]
                x1 = x[r, 1]
                for n in range(m):
                    row[n] = (w0 * x0[n] + w1 * x1[n]) + b
                continue
            for n in range(m):
                row[n] = w0 * x0[n]
            for k in range(1, n_in):
                w = a1[r, k, j]
                xk = x[r, k]
                for n in range(m):
                    row[n] += w * xk[n]
            for n in range(m):
                row[n] += b


def _centred_logits(a2, a2b, sig, out):
    """``out[r, :, n] = a2[r]ᵀ sig[r, :, n] + a2b[r]`` less its maximum over the outputs (feature-major).

    Each output sums the hidden units in order and adds the bias last. Two outputs and four hidden
    units share a pass over the samples (the same order of operations for every element; fewer,
    longer loops vectorize better at the few samples of a rollout step).
    """
    rows, n_hidden, n_out = a2.shape
    m = sig.shape[2]
    top = np.empty(m, np.float32)
    for r in range(rows):
        q = 0
        while q < n_out:
            pair = q + 1 < n_out
            qb = q + 1 if pair else q
            ra, rb = out[r, q], out[r, qb]
            s0 = sig[r, 0]
            wa, wb = a2[r, 0, q], a2[r, 0, qb]
            for n in range(m):
                ra[n] = wa * s0[n]
                rb[n] = wb * s0[n]  # the same row again when unpaired: written, never accumulated twice
            j = 1
            while j + 4 <= n_hidden:
                s0, s1, s2, s3 = sig[r, j], sig[r, j + 1], sig[r, j + 2], sig[r, j + 3]
                a0, a1, a2_, a3 = a2[r, j, q], a2[r, j + 1, q], a2[r, j + 2, q], a2[r, j + 3, q]
                b0, b1, b2, b3 = a2[r, j, qb], a2[r, j + 1, qb], a2[r, j + 2, qb], a2[r, j + 3, qb]
                if pair:
                    for n in range(m):
                        ra[n] = (((ra[n] + a0 * s0[n]) + a1 * s1[n]) + a2_ * s2[n]) + a3 * s3[n]
                        rb[n] = (((rb[n] + b0 * s0[n]) + b1 * s1[n]) + b2 * s2[n]) + b3 * s3[n]
                else:
                    for n in range(m):
                        ra[n] = (((ra[n] + a0 * s0[n]) + a1 * s1[n]) + a2_ * s2[n]) + a3 * s3[n]
                j += 4
            while j < n_hidden:
                s0 = sig[r, j]
                a0, b0 = a2[r, j, q], a2[r, j, qb]
                if pair:
                    for n in range(m):
                        ra[n] += a0 * s0[n]
                        rb[n] += b0 * s0[n]
                else:
                    for n in range(m):
                        ra[n] += a0 * s0[n]
                j += 1
            q += 2
        for q in range(n_out):
            row = out[r, q]
            b = a2b[r, q]
            if q == 0:
                for n in range(m):
                    row[n] += b
                    top[n] = row[n]
            else:
                for n in range(m):
                    row[n] += b
                    top[n] = max(top[n], row[n])
        for q in range(n_out):
            row = out[r, q]
            for n in range(m):
                row[n] -= top[n]


def _act_and_step(exps, uniforms, t, state, data, inputs, obs, actions, rewards, terminated):
    """Time step ``t`` of every environment ``i = r·m + s``: draw, step, record, next inputs.

    The action is the number of entries of the unnormalized CDF (cumulative sums of ``exps``,
    accumulated in float64 and rounded to float32 as torch's ``cumsum`` does) below ``u·CDF[-1]``,
    at most the last action: :func:`~fedrl_algos.policies.mlp_kernels.mlp_rollout`'s rule.
    """
    rows, n_out, m = exps.shape
    n_in = inputs.shape[1]
    cdf = np.empty(n_out, np.float32)
    for r in range(rows):
        for s in range(m):
            i = r * m + s
            acc = 0.0
            for q in range(n_out):
                acc += np.float64(exps[r, q, s])
                cdf[q] = np.float32(acc)
            threshold = cdf[n_out - 1] * uniforms[r, t, s]
            action = 0
            for q in range(n_out):
                action += cdf[q] < threshold
            action = min(action, n_out - 1)
            for k in range(n_in):
                obs[r, s, t, k] = state[i, k]
            reward, ended = transition(state, i, action, r, data)  # noqa: F821 (bound by _loops)
            actions[r, s, t] = action
            rewards[r, s, t] = reward
            terminated[r, s, t] = ended
            for k in range(n_in):
                inputs[r, k, s] = state[i, k]


def _tanh_of_sigmoid(sig, out):
    """``out = 2·sig − 1`` (``tanh z`` from ``σ(2z)``), elementwise as torch computes it in float32."""
    flat_in, flat_out = sig.reshape(-1), out.reshape(-1)
    for k in range(flat_in.shape[0]):
        flat_out[k] = np.float32(2.0) * flat_in[k] - np.float32(1.0)


def _backprop(exps, sig, hidden, x, actions, weights, w2t, steps, total):
    """Add every sample's ``ψ ∇log π(a|x)`` to its row of ``total`` (float64 ``[R, d]`` in the layout
    ``∇W1 [i, h], ∇b1 [h], ∇W2ᵀ [o, h], ∇b2 [o]``): each trajectory's ``steps`` samples summed in
    float32 in their order, the trajectory's sum then added in float64.

    With ``s = σ(2z)`` and ``h = tanh z = 2s − 1`` (``hidden``): ``1 − h² = 4s(1 − s)``,
    ``p = exps / Σ exps``, ``δ = e_a − p``; ``∇b2 = ψδ``, ``∇W2ᵀ = ψδ hᵀ``,
    ``∇b1 = (1 − h²) ⊙ W2 ψδ``, ``∇W1 = x ∇b1ᵀ``. Samples with ``ψ = 0`` contribute nothing and are skipped.
    """
    rows, n_out, n = exps.shape
    n_in, n_hidden = x.shape[1], sig.shape[1]
    d = total.shape[1]
    b1_at = n_in * n_hidden
    w2_at = b1_at + n_hidden
    b2_at = w2_at + n_hidden * n_out
    part = np.zeros(d, np.float32)
    out = np.empty(n_out, np.float32)
    hid = np.empty(n_hidden, np.float32)
    zsig = np.empty(n_hidden, np.float32)
    for r in range(rows):
        acc = total[r]
        for start in range(0, n, steps):
            added = False
            for k in range(start, min(start + steps, n)):
                w = weights[r, k]
                if w == 0.0:
                    continue
                added = True
                norm = np.float32(0.0)
                for q in range(n_out):
                    norm += exps[r, q, k]
                a = actions[r, k]
                for q in range(n_out):
                    out[q] = (np.float32(q == a) - exps[r, q, k] / norm) * w
                for j in range(n_hidden):
                    hid[j] = hidden[r, j, k]
                    zsig[j] = np.float32(0.0)
                for q in range(n_out):
                    oq = out[q]
                    wq = w2t[r, q]
                    for j in range(n_hidden):
                        zsig[j] += wq[j] * oq
                for j in range(n_hidden):
                    s = sig[r, j, k]
                    zsig[j] *= np.float32(4.0) * s * (np.float32(1.0) - s)
                gb1 = part[b1_at : b1_at + n_hidden]
                for j in range(n_hidden):
                    gb1[j] += zsig[j]
                for q in range(n_in):
                    xq = x[r, q, k]
                    gw1 = part[q * n_hidden : (q + 1) * n_hidden]
                    for j in range(n_hidden):
                        gw1[j] += xq * zsig[j]
                for q in range(n_out):
                    oq = out[q]
                    gw2 = part[w2_at + q * n_hidden : w2_at + (q + 1) * n_hidden]
                    for j in range(n_hidden):
                        gw2[j] += hid[j] * oq
                    part[b2_at + q] += oq
            if added:
                for e in range(d):
                    acc[e] += np.float64(part[e])
                    part[e] = np.float32(0.0)


class _Loops:
    """The compiled loops; ``act_and_step`` only with a family's transition bound."""

    def __init__(self, transition: Any) -> None:
        from fedrl_envs.fused import compile_loop

        self.hidden_inputs = _compiled(_hidden_inputs)
        self.centred_logits = _compiled(_centred_logits)
        self.backprop = _compiled(_backprop)
        self.tanh_of_sigmoid = _compiled(_tanh_of_sigmoid)
        if transition is not None:
            self.act_and_step = compile_loop(_act_and_step, {"transition": transition},
                                             (transition.py_func,))


@functools.cache
def _compiled(loop: Any) -> Any:
    from fedrl_envs.fused import compile_loop

    return compile_loop(loop, {})


@functools.lru_cache(maxsize=16)
def _loops(transition: Any) -> _Loops:
    return _Loops(transition)
