"""Fast paths for the tabular softmax policy: tabulated rollouts and per-state probability tables.

The generic :func:`~fedrl_algos.core.rollout.rollout` calls the policy and the family's ``step``
kernel at every time step (about twenty small tensor operations, among them a softmax over every
trajectory). For a :class:`~fedrl_algos.policies.TabularPolicy` on a family whose observation is its
integer state (``Discrete`` observations, the default ``observe``) everything a time step needs is
a lookup:

* the family's transitions are **tabulated from its own kernel**: ``family.step`` is called once on
  every ``(state, action)`` pair of every task row (:func:`tabulate`; a kernel takes no noise, so it
  is deterministic and the table *is* the kernel — tests hold table == kernel);
* the policy's inverse CDF is computed once per rollout on the ``[rows, S, A]`` table instead of at
  every step on ``[rows, m, A]`` rows (:func:`probs_table`);
* all random numbers of the rollout are drawn in one call with exactly the counter layout of the
  step-by-step draws (reset noise, then ``m`` uniforms per step).

A time step is then four operations on ``[rows·m]`` tensors (gather the CDF row of each state,
compare with the uniform, form the flat ``(state, action)`` key, look up the next state), and the
observations, actions, rewards and masks are recovered from the keys after the loop. The result is
**bitwise identical** to the generic path (same random numbers, same softmax per state row, same
inverse-CDF rule), which ``tests/test_reproduce_tabular.py`` checks.

:func:`probs_table` also serves the closed-form estimators of :mod:`fedrl_algos.core.estimators`:
``softmax(θ[s, :])`` depends only on the state, so it is computed once on the ``[*B, S, A]`` table
(PyTorch's CPU softmax costs ~0.05–0.1 µs per row at A = 4, so a softmax over every sample was the
most expensive operation of a local step). A small identity-keyed cache lets the rollout and the
estimates that share one θ within a local step (policy gradient, Hessian-vector product) compute
that table once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces

from fedrl_envs.core import TaskFamily, repeat_params
from fedrl_envs.rng import RandomStreams

__all__ = ["TabulatedModel", "tabulate", "probs_table", "fast_rollout_model", "tabular_rollout"]


@dataclass
class TabulatedModel:
    """A family's kernel on every ``(row, state, action)``, flat at ``(row * S + s) * A + a``.

    :param next_pos: next state as a global position ``row * S + s'`` (int64)
    :param reward: reward of the transition (the kernel's dtype)
    :param terminated: termination flag of the transition (bool)
    :param any_terminal: whether any transition terminates (if not, masks are all ones)
    :param state_of: the state ``s`` of each flat key; :param action_of: its action ``a``
    :param n_rows: task rows; :param n_states: S; :param n_actions: A
    """

    next_pos: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    any_terminal: bool
    state_of: torch.Tensor
    action_of: torch.Tensor
    n_rows: int
    n_states: int
    n_actions: int


def _is_tabular_policy(policy: Any) -> bool:
    from fedrl_algos.policies import TabularPolicy

    return isinstance(policy, TabularPolicy)


def tabulate(family: TaskFamily, params: Any, n_states: int, n_actions: int) -> TabulatedModel | None:
    """Run ``family.step`` once on every ``(state, action)`` pair of every row of ``params``.

    :return: the tabulated model, or ``None`` when the kernel's states are not the integer cells
        ``0..S-1`` (then the generic rollout must be used)
    """
    first = next(v for v in vars(params).values() if isinstance(v, torch.Tensor))
    n_rows, device = int(first.shape[0]), first.device
    pairs = n_states * n_actions
    states = torch.arange(n_states, device=device).repeat_interleave(n_actions).repeat(n_rows)
    actions = torch.arange(n_actions, device=device).repeat(n_states * n_rows)
    next_state, reward, terminated = family.step(states, actions, repeat_params(params, pairs))
    if next_state.shape != states.shape or next_state.is_floating_point() or next_state.dtype == torch.bool:
        return None
    if bool((next_state < 0).any()) or bool((next_state >= n_states).any()):
        return None
    base = torch.arange(n_rows, device=device).repeat_interleave(pairs) * n_states
    terminated = terminated.reshape(-1).to(torch.bool)
    return TabulatedModel(
        next_pos=(next_state.to(torch.int64) + base).contiguous(),
        reward=reward.reshape(-1).contiguous(),
        terminated=terminated.contiguous(),
        any_terminal=bool(terminated.any()),
        state_of=states,
        action_of=actions,
        n_rows=n_rows,
        n_states=n_states,
        n_actions=n_actions,
    )


# One-entry-per-params cache of tabulated models: a Sampler passes the same params object to every
# rollout, so the kernel is tabulated once per federation.
_MODEL_CACHE: dict[int, tuple[weakref.ref, TabulatedModel | None]] = {}
_MODEL_CACHE_SIZE = 16


def fast_rollout_model(family: TaskFamily, params: Any, policy: Any) -> TabulatedModel | None:
    """The tabulated model when the fast rollout applies to ``(family, params, policy)``, else ``None``.

    It applies to a :class:`~fedrl_algos.policies.TabularPolicy` on a family with ``Discrete``
    observations and actions matching the policy, whose observation is its state (the default
    ``observe``) and whose kernel maps cells ``0..S-1`` to cells.
    """
    if not _is_tabular_policy(policy) or type(family).observe is not TaskFamily.observe:
        return None
    key = id(params)
    hit = _MODEL_CACHE.get(key)
    if hit is not None and hit[0]() is params:
        return hit[1]
    try:
        obs_space, act_space = family.observation_space(params), family.action_space(params)
    except (TypeError, ValueError, AttributeError, IndexError, RuntimeError):
        return None  # a family whose spaces need one task's parameters: the generic path handles it
    model = None
    if (
        isinstance(obs_space, spaces.Discrete)
        and isinstance(act_space, spaces.Discrete)
        and int(obs_space.start) == 0
        and int(act_space.start) == 0
        and int(obs_space.n) == policy.n_states
        and int(act_space.n) == policy.n_actions
    ):
        model = tabulate(family, params, policy.n_states, policy.n_actions)
    if len(_MODEL_CACHE) >= _MODEL_CACHE_SIZE:
        _MODEL_CACHE.pop(next(iter(_MODEL_CACHE)))
    try:
        _MODEL_CACHE[key] = (weakref.ref(params), model)
    except TypeError:  # params that cannot be weakly referenced: do not cache
        pass
    return model


# Probability tables of the last few θ tensors seen (identity + in-place version checked).
_PROBS_CACHE: list[tuple[weakref.ref, int, torch.Tensor]] = []
_PROBS_CACHE_SIZE = 4


def probs_table(policy: Any, theta: torch.Tensor) -> torch.Tensor:
    """``softmax(θ[s, :])`` for every state: ``[*B, S, A]`` (bitwise equal to the per-sample softmax).

    Cached by tensor identity and in-place version (never for a θ that requires grad), so the
    rollout and the estimates that share one θ compute it once.
    """
    shape = (*theta.shape[:-1], policy.n_states, policy.n_actions)
    if theta.requires_grad:
        return torch.softmax(theta.reshape(shape), dim=-1)
    version = theta._version
    for ref, ver, probs in _PROBS_CACHE:
        if ref() is theta and ver == version:
            return probs
    probs = torch.softmax(theta.reshape(shape), dim=-1)
    if len(_PROBS_CACHE) >= _PROBS_CACHE_SIZE:
        _PROBS_CACHE.pop(0)
    _PROBS_CACHE.append((weakref.ref(theta), version, probs))
    return probs


def _draw_uniforms(streams: RandomStreams, n_first: int, n_second: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``streams.uniform((n_first,))`` (float32) then ``streams.uniform((n_second,), dtype)`` in one draw.

    Same 64-bit words and the same word → float rules as :meth:`RandomStreams.uniform` (53 high bits
    for float64, 24 for float32); other dtypes fall back to two calls.
    """
    if dtype not in (torch.float32, torch.float64):
        return streams.uniform((n_first,)), streams.uniform((n_second,), dtype=dtype)
    words = streams.bits((n_first + n_second,))
    first, second = words[..., :n_first], words[..., n_first:]
    return _words_to_uniform(first, torch.float32), _words_to_uniform(second, dtype)


def _words_to_uniform(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float64:
        return ((words >> 11) & ((1 << 53) - 1)).to(torch.float64) * (2.0**-53)
    return ((words >> 40) & ((1 << 24) - 1)).to(torch.float32) * (2.0**-24)


def tabular_rollout(
    family: TaskFamily,
    params: Any,
    policy: Any,
    theta: torch.Tensor,
    streams: RandomStreams,
    n_trajectories: int,
    horizon: int,
    model: TabulatedModel,
):
    """:func:`~fedrl_algos.core.rollout.rollout` through the tabulated model (same result, bitwise).

    Arguments as for ``rollout`` (already validated there); ``model`` from :func:`fast_rollout_model`.
    """
    from fedrl_algos.core.rollout import Trajectories

    m, steps = int(n_trajectories), int(horizon) + 1
    s, a, n_rows = model.n_states, model.n_actions, model.n_rows
    n, dtype, device = n_rows * m, theta.dtype, theta.device
    # Random numbers in the generic order: reset noise (float32, RandomStreams.uniform's default),
    # then m uniforms of θ's dtype per step (drawn as one [T, m] block: the same counters).
    noise, u = _draw_uniforms(streams, m * family.reset_noise_dim, steps * m, dtype)
    state = family.reset(repeat_params(params, m), noise.reshape(n, -1))
    u = u.reshape(n_rows, steps, m).transpose(0, 1).reshape(steps, n, 1)
    # Inverse CDF per state; the last column is dropped: (cdf < u).sum() clamped to A - 1 equals
    # the count over the first A - 1 columns because a cumulative sum never decreases.
    cdf = probs_table(policy, theta).reshape(n_rows * s, a).cumsum(-1)[:, : a - 1].contiguous()
    pos = state.to(torch.int64) + torch.arange(n_rows, device=device).repeat_interleave(m) * s
    keys = []
    for t in range(steps):
        action = (cdf.index_select(0, pos) < u[t]).sum(-1)
        key = torch.add(action, pos, alpha=a)  # (row · S + s) · A + a
        keys.append(key)
        pos = model.next_pos.index_select(0, key)
    key = torch.stack(keys, dim=1)  # [n, T]
    flat = key.reshape(-1)
    actions = model.action_of.index_select(0, flat).view(key.shape)
    obs = model.state_of.index_select(0, flat).view(key.shape).to(state.dtype)
    if model.any_terminal:
        done = model.terminated.index_select(0, flat).view(key.shape)
        alive = torch.ones_like(done)
        alive[:, 1:] = (~done[:, :-1]).to(torch.int64).cumprod(1).to(torch.bool)
        mask = alive.to(dtype)
        rewards = model.reward.index_select(0, flat).view(key.shape).to(dtype) * mask
    else:
        mask = torch.ones(key.shape, dtype=dtype, device=device)
        rewards = model.reward.index_select(0, flat).view(key.shape).to(dtype)  # × a mask of ones: unchanged
    shape = (*theta.shape[:-1], m, steps)
    return Trajectories(obs=obs.reshape(shape), actions=actions.reshape(shape), rewards=rewards.reshape(shape), mask=mask.reshape(shape))
