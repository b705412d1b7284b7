"""Batched trajectory collection straight from a family's kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from fedrl_algos.core.tabular import fast_rollout_model, tabular_rollout
from fedrl_envs.core import TaskFamily, repeat_params
from fedrl_envs.rng import RandomStreams

__all__ = ["Trajectories", "rollout", "Sampler"]


class Trajectories(NamedTuple):
    """A batch of whole trajectories; axes ``[*B, traj, time, ...]``.

    :param obs: observations ``s_0..s_H`` — ``[*B, m, T, *obs_shape]``
    :param actions: actions ``a_0..a_H`` — ``[*B, m, T, *action_shape]``
    :param rewards: rewards ``r(s_h, a_h)`` — ``[*B, m, T]``
    :param mask: 1 while the episode is running, 0 after termination — ``[*B, m, T]``
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    mask: torch.Tensor

    @property
    def n_trajectories(self) -> int:
        return self.rewards.shape[-2]

    def returns(self, gamma: float = 1.0) -> torch.Tensor:
        """Discounted return of each trajectory ``[*B, m]``."""
        discount = gamma ** torch.arange(self.rewards.shape[-1], device=self.rewards.device, dtype=self.rewards.dtype)
        return (self.rewards * self.mask * discount).sum(-1)


def check_rollout_batch(theta: torch.Tensor, streams: RandomStreams, n_trajectories: int) -> int:
    """The trajectory count ``m`` of a rollout with parameters ``theta [*B, d]`` and ``streams``,
    after checking that the streams' batch shape is ``B`` and ``m >= 1`` (``ValueError`` otherwise)."""
    batch = tuple(theta.shape[:-1])
    if tuple(streams.batch_shape) != batch:
        raise ValueError(f"streams must have batch shape {batch} (that of theta), got {tuple(streams.batch_shape)}")
    m = int(n_trajectories)
    if m < 1:
        raise ValueError(f"n_trajectories must be >= 1, got {m}")
    return m


def rollout(
    family: TaskFamily,
    params: Any,
    policy: Any,
    theta: torch.Tensor,
    streams: RandomStreams,
    n_trajectories: int,
    horizon: int | None = None,
    stop_when_done: bool = False,
) -> Trajectories:
    """Collect ``n_trajectories`` whole episodes for every row of a batch.

    Row ``b`` runs the task ``params[b]`` with the policy ``theta[b]`` and draws every random number
    (start states and actions) from its own stream ``streams[b]``, so its trajectories depend on
    nothing else in the batch. The loop is over time steps only.

    :param family: task family (its ``reset``/``step`` kernels are used directly)
    :param params: task parameters stacked over the flattened batch ``[prod(B)]``
    :param policy: a :class:`~fedrl_algos.policies.FlatPolicy`
    :param theta: policy parameters ``[*B, d]``
    :param streams: random streams with ``batch_shape == B``
    :param n_trajectories: trajectories per row (m)
    :param horizon: last time index H (default: the family's); T = H + 1 steps are collected
    :param stop_when_done: stop stepping once every episode of the batch has terminated and return
        only the steps up to the last one that ran (``T <= H + 1``; the dropped steps all have mask
        0). The random streams still advance as if all ``H + 1`` steps had run, so the result is
        a prefix of the full rollout and later draws are unchanged.
    :return: :class:`Trajectories` with axes ``[*B, m, T, ...]``
    """
    batch = theta.shape[:-1]
    m = check_rollout_batch(theta, streams, n_trajectories)
    n_rows = 1
    for b in batch:
        n_rows *= b
    if horizon is None:
        horizon = family.horizon(params)
    fast = fast_rollout_model(family, params, policy)
    if fast is not None and fast.n_rows == n_rows and not (stop_when_done and fast.any_terminal):
        return tabular_rollout(family, params, policy, theta, streams, m, horizon, fast)  # same result, bitwise
    rows = repeat_params(params, m)
    noise = streams.uniform((m, family.reset_noise_dim))
    state = family.reset(rows, noise.reshape(n_rows * m, -1))
    obs_list, act_list, rew_list, alive_list = [], [], [], []
    alive = torch.ones(n_rows * m, dtype=torch.bool, device=theta.device)
    per_step = torch.zeros_like(streams.counters)
    for h in range(horizon + 1):
        if stop_when_done and h > 0 and not bool(alive.any()):
            # Draw nothing more, but leave the streams where the full rollout would: each step
            # draws the same amount (that of the last step that ran).
            streams.counters = streams.counters + per_step * (horizon + 1 - h)
            break
        obs = family.observe(state, rows)
        obs_b = obs.reshape(*batch, m, *obs.shape[1:])
        before = streams.counters
        action = policy.sample(theta, obs_b, streams)
        per_step = streams.counters - before
        state, reward, terminated = family.step(state, action.reshape(n_rows * m, *action.shape[len(batch) + 1 :]), rows)
        obs_list.append(obs_b)
        act_list.append(action)
        rew_list.append(reward.reshape(*batch, m))
        alive_list.append(alive.reshape(*batch, m))
        alive = alive & ~terminated
    mask = torch.stack(alive_list, dim=len(batch) + 1).to(theta.dtype)
    return Trajectories(
        obs=torch.stack(obs_list, dim=len(batch) + 1),
        actions=torch.stack(act_list, dim=len(batch) + 1),
        rewards=torch.stack(rew_list, dim=len(batch) + 1).to(theta.dtype) * mask,
        mask=mask,
    )


@dataclass
class Sampler:
    """Binds a family, per-row task parameters, a policy and random streams: ``sampler(theta, m)``.

    :param family: task family
    :param params: task parameters stacked over the flattened batch rows
    :param policy: the flat policy
    :param streams: one random stream per batch row
    :param horizon: episode horizon override
    :param stop_when_done: see :func:`rollout`
    """

    family: TaskFamily
    params: Any
    policy: Any
    streams: RandomStreams
    horizon: int | None = None
    stop_when_done: bool = False

    def __call__(self, theta: torch.Tensor, n_trajectories: int) -> Trajectories:
        return rollout(
            self.family, self.params, self.policy, theta, self.streams, n_trajectories, self.horizon, self.stop_when_done
        )
