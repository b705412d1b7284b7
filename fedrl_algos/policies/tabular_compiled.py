"""The tabulated rollout's time loop and the probability tables compiled by Numba: torch's numbers, bit for bit.

:func:`~fedrl_algos.policies.tabular.tabular_rollout` samples a tabular policy on a tabulated model
one time step at a time, about five torch operations a step on arrays of a few thousand samples,
and first hashes every uniform of the episode (a dozen int64 passes over ``steps × m`` words a
row). Both are overhead-bound at the batches of the Per-FedAvg-PG gridworld experiments. With
``TabularPolicy(kernels="numba")`` (or ``"auto"`` with Numba installed) one compiled loop walks
every trajectory through its whole episode instead: it hashes each uniform where it is used
(:func:`fedrl_envs.rng.uniform32_of_finalizer_input_numpy`, the streams' own finalizer), counts the
inverse-CDF entries below it, and follows the tabulated next cell.

**The same numbers by construction.** The loop computes no float arithmetic of its own: the CDF
table is torch's (``softmax`` then ``cumsum``, as the torch loop computes it), a float32 uniform
is a 24-bit integer times 2⁻²⁴ (exact), and an action is a count of exact comparisons. The
random words are integer hashes of the same counters. So the keys, and everything derived from
them, are those of the torch loop (``tests/test_tabular_compiled.py``).

**The probability tables** ``softmax(θ[s, :])`` (:func:`compiled_softmax`): the operations of
torch's own CPU softmax over a short row, one IEEE float32 operation at a time (section below).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from fedrl_algos.policies.kernel_choice import resolve_kernels
from fedrl_envs.rng import _U64_GOLDEN, RandomStreams, uniform32_of_finalizer_input_numpy

__all__ = ["compiled_softmax", "compiled_softmax_applies", "compiled_walk_applies", "compiled_walk"]

_U64_ONE = np.uint64(1)


def _walk(cdf, next_pos, reward, start, stream_keys, counters, m, n_states, n_actions, keys, obs, actions, rewards):
    """Row ``r``'s ``m`` trajectories from the cells ``start[r·m:(r+1)·m]``, stepped side by side.

    Sample ``(n = r·m + i, t)`` gets its cell within the row, its action, ``reward[key]`` and,
    where ``keys`` has rows, ``keys[n, t]`` = key = cell·A + action (cells offset by row·S). Its
    uniform is word ``t·m + i`` of stream ``r`` from ``counters[r]`` (the torch loop's
    ``[steps, m]`` block of one draw); the action counts the entries of the cell's CDF row below it
    (``cdf[cell, :A-1]``). The ``m`` trajectories of a row advance one step at a time, so their
    independent lookups overlap in the pipeline.
    """
    n_cut = cdf.shape[1]
    steps = obs.shape[1]
    keep_keys = keys.shape[0] > 0
    cells = start.copy()
    for r in range(stream_keys.shape[0]):
        word = stream_keys[r] + (counters[r] + _U64_ONE) * _U64_GOLDEN
        offset = r * n_states
        for t in range(steps):
            for n in range(r * m, (r + 1) * m):
                u = uniform32_of_finalizer_input(word)  # noqa: F821 (compiled in: _loop())
                word += _U64_GOLDEN
                cell = cells[n]
                action = 0
                for j in range(n_cut):
                    action += cdf[cell, j] < u
                key = cell * n_actions + action
                if keep_keys:
                    keys[n, t] = key
                obs[n, t] = cell - offset
                actions[n, t] = action
                rewards[n, t] = reward[key]
                cells[n] = next_pos[key]


@functools.cache
def _loop() -> Any:
    from fedrl_envs.fused import compile_loop, inline

    return compile_loop(_walk, {"uniform32_of_finalizer_input": inline(uniform32_of_finalizer_input_numpy)},
                        (uniform32_of_finalizer_input_numpy,))


def compiled_walk_applies(policy: Any, theta: torch.Tensor, streams: RandomStreams) -> bool:
    """Whether :func:`compiled_walk` applies: the policy's kernels resolve to ``"numba"``,
    float32 CPU parameters without gradients and CPU streams."""
    return (
        resolve_kernels(getattr(policy, "kernels", "torch"), theta.device) == "numba"
        and theta.dtype == torch.float32 and theta.device.type == "cpu" and not theta.requires_grad
        and streams.keys.device.type == "cpu"
    )


def compiled_walk(cdf: torch.Tensor, next_pos: torch.Tensor, reward: torch.Tensor, start: torch.Tensor,
                 streams: RandomStreams, m: int, steps: int, n_states: int, n_actions: int, with_keys: bool = False
                 ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the torch loop gathers from its sampled keys (cell·A + action, cells offset by row·S),
    by the compiled loop: each sample's cell within its row, its action and its reward, and the
    keys themselves when asked for (a model with terminal transitions needs them for the mask).

    Draws the ``steps × m`` uniforms of each stream as the torch loop's one draw does (the counters
    advance by the same count).

    :param cdf: ``[rows·S, A - 1]`` float32, the policy's cumulative probabilities without the last column
    :param next_pos: int64 ``[rows·S·A]``, the tabulated model's next cell (offset by row·S) of each key
    :param reward: float32 ``[rows·S·A]``, the tabulated model's reward of each key
    :param start: int64 ``[rows·m]``, the first cells (offset by row·S)
    :param streams: the rows' random streams, positioned after the reset draw
    :param with_keys: also return the keys (else ``None``: one output array less to write)
    :return: ``keys``, ``obs`` (int64), ``actions`` (int64) and ``rewards`` (float32), each ``[rows·m, steps]``
    """
    shape = (start.shape[0], steps)
    keys = np.empty(shape if with_keys else (0, steps), np.int64)
    obs, actions = np.empty(shape, np.int64), np.empty(shape, np.int64)
    rewards = np.empty(shape, np.float32)
    stream_keys = streams.keys.reshape(-1).contiguous().numpy().view(np.uint64)
    counters = streams.counters.reshape(-1).contiguous().numpy().view(np.uint64)
    _loop()(cdf.contiguous().numpy(), next_pos.contiguous().numpy(), reward.contiguous().numpy(), start.contiguous().numpy(),
            stream_keys, counters, m, n_states, n_actions, keys, obs, actions, rewards)
    streams.advance(steps * m)
    return torch.from_numpy(keys) if with_keys else None, torch.from_numpy(obs), torch.from_numpy(actions), torch.from_numpy(rewards)


# --- the probability table: torch's CPU softmax over a few actions, bit for bit -----------------
#
# For a last dimension shorter than a SIMD register (A < 8 floats on AVX2, < 16 on AVX-512) torch's
# CPU softmax takes, row by row: the maximum, e_j = exp(x_j − max) by SLEEF's single-precision exp
# (``xexpf``, 1 ULP, fused multiply-adds), the sum ((e_0 + e_1) + e_2) + … in order, and e_j × (1/sum).
# It spends ~140 ns a row doing so on partial vectors; the same steps one row at a time take a few.
# Every operation below is one IEEE operation on float32 (the multiply-adds fused, as SLEEF's), so
# the table has torch's bits; :func:`compiled_softmax_applies` still checks them against
# ``torch.softmax`` once per process and keeps torch's softmax where any differs.

#: A < this: the short-row path of torch's softmax on both AVX2 (8 floats) and AVX-512
_SHORT_ROW = 8
_EXP_LN2_INV = np.float32(1.442695040888963407359924681001892137426645954152985934135449406931)
_EXP_LN2_HI = np.float32(-0.693145751953125)  # −ln 2 in two parts (Cody–Waite): q·hi is exact
_EXP_LN2_LO = np.float32(-1.428606765330187045e-06)
_EXP_C5 = np.float32(0.000198527617612853646278381)
_EXP_C4 = np.float32(0.00139304355252534151077271)
_EXP_C3 = np.float32(0.00833336077630519866943359)
_EXP_C2 = np.float32(0.0416664853692054748535156)
_EXP_C1 = np.float32(0.166666671633720397949219)
_EXP_C0 = np.float32(0.5)
_EXP_LOW = np.float32(-104.0)  # below: 0
_EXP_HIGH = np.float32(100.0)  # above: inf
_F32_ZERO, _F32_ONE, _F32_INF = np.float32(0.0), np.float32(1.0), np.float32(np.inf)
_I32_BIAS = np.int32(127)
_I32_ONE = np.int32(1)
_I32_MANTISSA = np.int32(23)


def _expf(d):
    """SLEEF's ``xexpf`` on one float32 (what torch's vectorized ``exp`` computes in its softmax).

    Branch-free (selects), so that the loop calling it runs on SIMD lanes."""
    low, high = d < _EXP_LOW, d > _EXP_HIGH
    c = _EXP_LOW if low else d  # inside SLEEF's range (a NaN: low and high both false, kept)
    c = _EXP_HIGH if high else c
    c = _F32_ZERO if c != c else c
    q = np.int32(np.rint(c * _EXP_LN2_INV))
    qf = np.float32(q)
    s = fma32(qf, _EXP_LN2_HI, c)  # noqa: F821 (compiled in: _softmax_loop())
    s = fma32(qf, _EXP_LN2_LO, s)  # noqa: F821
    u = fma32(_EXP_C5, s, _EXP_C4)  # noqa: F821
    u = fma32(u, s, _EXP_C3)  # noqa: F821
    u = fma32(u, s, _EXP_C2)  # noqa: F821
    u = fma32(u, s, _EXP_C1)  # noqa: F821
    u = fma32(u, s, _EXP_C0)  # noqa: F821
    u = _F32_ONE + fma32(s * s, u, s)  # noqa: F821
    half = q >> _I32_ONE  # 2^q in two normal factors, as SLEEF's ldexp does
    u = u * float32_from_bits((half + _I32_BIAS) << _I32_MANTISSA)  # noqa: F821
    u = u * float32_from_bits((q - half + _I32_BIAS) << _I32_MANTISSA)  # noqa: F821
    u = _F32_ZERO if low else u
    u = _F32_INF if high else u
    return d if d != d else u


def _softmax_rows(x, shifted, out):
    """``out[r] = softmax(x[r])`` for every row of the float32 ``[rows, A]`` array ``x``, as torch's
    short-row path (``shifted``: scratch of ``x``'s shape)."""
    n_rows, n_actions = x.shape
    for r in range(n_rows):
        peak = x[r, 0]
        for j in range(1, n_actions):
            v = x[r, j]
            peak = v if (v > peak or v != v) else peak  # a NaN propagates, as torch's vectorized maximum
        for j in range(n_actions):
            shifted[r, j] = x[r, j] - peak
    flat_in, flat_out = shifted.reshape(-1), out.reshape(-1)
    for i in range(flat_in.shape[0]):  # the exponentials over SIMD lanes
        flat_out[i] = expf(flat_in[i])  # noqa: F821 (compiled in: _softmax_loop())
    for r in range(n_rows):
        total = out[r, 0]
        for j in range(1, n_actions):
            total = total + out[r, j]
        scale = _F32_ONE / total
        for j in range(n_actions):
            out[r, j] = out[r, j] * scale


@functools.cache
def _float32_intrinsics() -> tuple[Any, Any]:
    """Numba intrinsics for a fused float32 multiply-add (LLVM's ``fma``: one rounding, as SLEEF's
    ``vfmadd``) and for reading int32 bits as a float32."""
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def fma32(typingctx, a, b, c):
        return types.float32(types.float32, types.float32, types.float32), lambda ctx, builder, sig, args: builder.fma(*args)

    @intrinsic
    def float32_from_bits(typingctx, bits):
        def codegen(ctx, builder, sig, args):
            return builder.bitcast(args[0], ctx.get_value_type(types.float32))

        return types.float32(types.int32), codegen

    return fma32, float32_from_bits


@functools.cache
def _softmax_loop() -> Any:
    from fedrl_envs.fused import compile_loop, inline

    fma32, float32_from_bits = _float32_intrinsics()
    expf = inline(_expf, {"fma32": fma32, "float32_from_bits": float32_from_bits})
    return compile_loop(_softmax_rows, {"expf": expf}, (_expf,))


def compiled_softmax(table: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(table, -1)`` of a float32 CPU ``[..., A]`` table by the compiled loop (where
    :func:`compiled_softmax_applies`: the same bits)."""
    rows = table.detach().reshape(-1, table.shape[-1]).contiguous().numpy()
    out = np.empty(rows.shape, np.float32)
    _softmax_loop()(rows, np.empty(rows.shape, np.float32), out)
    return torch.from_numpy(out).reshape(table.shape)


@functools.cache
def _matches_torch_softmax() -> bool:
    """Whether the compiled softmax gives ``torch.softmax``'s bits here, on every short row length:
    checked once per process on random rows over many scales and on edge cases (−inf, ±huge, ties)."""
    generator = torch.Generator().manual_seed(0)
    for n_actions in range(2, _SHORT_ROW):
        scale = torch.logspace(-3, 2, 64).repeat_interleave(64).unsqueeze(-1)
        x = torch.randn(scale.shape[0], n_actions, generator=generator) * scale
        edges = torch.tensor([[0.0] * n_actions, [-float("inf")] + [0.0] * (n_actions - 1), [1e30] + [-1e30] * (n_actions - 1),
                              [80.0] + [-80.0] * (n_actions - 1), [-150.0] * (n_actions - 1) + [0.0]])
        x = torch.cat([x, edges]).float()
        if not torch.equal(compiled_softmax(x).view(torch.int32), torch.softmax(x, -1).view(torch.int32)):
            return False
    return True


def compiled_softmax_applies(policy: Any, theta: torch.Tensor, n_actions: int) -> bool:
    """Whether :func:`compiled_softmax` gives ``torch.softmax(θ[s, :])``'s bits for this policy and θ:
    the policy's kernels resolve to ``"numba"``, float32 CPU parameters without gradients, fewer than
    8 actions (torch's short-row path on AVX2 and AVX-512), and the once-per-process check passes."""
    return (
        n_actions < _SHORT_ROW and theta.dtype == torch.float32 and theta.device.type == "cpu" and not theta.requires_grad
        and resolve_kernels(getattr(policy, "kernels", "torch"), theta.device) == "numba"
        and _matches_torch_softmax()
    )
