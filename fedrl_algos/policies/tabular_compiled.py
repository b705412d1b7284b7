"""The tabulated rollout's time loop compiled by Numba: the same trajectories as the torch loop, bit for bit.

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
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from fedrl_algos.policies.mlp_compiled import resolve_kernels
from fedrl_envs.rng import _U64_GOLDEN, RandomStreams, uniform32_of_finalizer_input_numpy

__all__ = ["compiled_walk_applies", "compiled_walk"]

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
