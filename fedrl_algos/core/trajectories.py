"""The trajectory batch every estimator consumes, with its episode-mask semantics written once."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch

from fedrl_envs.family import alive_mask
from fedrl_envs.rng import RandomStreams
from fedrl_envs.threads import with_fitted_threads

__all__ = ["Trajectories", "check_rollout_batch", "fitted_to_batch", "fitted_to_rollout"]

_F = TypeVar("_F", bound=Callable[..., Any])


class Trajectories(NamedTuple):
    """A batch of whole trajectories; axes ``[*B, traj, time, ...]``.

    Every sampler returns this type (from a family's kernels or from any Gymnasium env), and every
    estimator reads it. Step ``h`` takes ``actions[..., h]`` in the state observed as ``obs[..., h]``
    and earns ``rewards[..., h]``. Episodes of fixed horizon ``T`` that end early are padded: ``mask``
    is :func:`fedrl_envs.family.alive_mask` of the termination flags (1 up to and including the
    terminating step, 0 after it), and the padded steps' rewards are 0.

    :param obs: observations ``s_0..s_H`` — ``[*B, m, T, *obs_shape]``
    :param actions: actions ``a_0..a_H`` — ``[*B, m, T, *action_shape]``
    :param rewards: rewards ``r(s_h, a_h)``, 0 where ``mask`` is 0 — ``[*B, m, T]``
    :param mask: 1 while the episode is running, 0 after termination — ``[*B, m, T]``
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def from_steps(
        cls, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor, dtype: torch.dtype
    ) -> Trajectories:
        """Assemble a batch from per-step records whose last axis is time: rewards are masked here.

        :param obs: ``[*B, m, T, *obs_shape]``
        :param actions: ``[*B, m, T, *action_shape]``
        :param rewards: ``[*B, m, T]`` as the environment returned them (also after termination)
        :param terminated: ``[*B, m, T]`` termination flag of every step
        :param dtype: floating dtype of ``rewards`` and ``mask`` (the policy parameters')
        """
        mask = alive_mask(terminated).to(dtype)
        return cls(obs=obs, actions=actions, rewards=rewards.to(dtype) * mask, mask=mask)

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


def _batch_work(policy: Any, theta: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[int, int, torch.device]:
    """The work of ``f(policy, theta, ..., traj, ...)``: the batch's steps, each costing about the
    policy's parameter count, on θ's device."""
    traj = kwargs.get("traj") or next(a for a in args if isinstance(a, Trajectories))
    return traj.rewards.numel(), theta.shape[-1], theta.device


def fitted_to_batch(func: _F) -> _F:
    """Run ``func(policy, theta, ..., traj, ...)`` with the intra-op threads fitted to the batch
    (:func:`fedrl_envs.threads.fitted_threads`: one thread below the measured crossover of steps ×
    parameters, the caller's setting above it)."""
    return with_fitted_threads(_batch_work)(func)  # type: ignore[return-value]


def fitted_to_rollout(func: _F) -> _F:
    """Run a sampler ``func(..., theta, ..., n_trajectories, ...)`` with the intra-op threads fitted
    to its rollout: ``prod(B) × m`` environments stepped side by side, each step costing about a
    policy forward (θ's parameter count). Arguments are found by name, so this decorates methods
    (``Sampler.__call__``) and functions (:func:`~fedrl_algos.core.sampling.rollout`) alike."""
    signature = inspect.signature(func)

    def work(*args: Any, **kwargs: Any) -> tuple[int, int, Any]:
        bound = signature.bind_partial(*args, **kwargs).arguments
        theta, m = bound.get("theta"), bound.get("n_trajectories")
        if not isinstance(theta, torch.Tensor) or theta.dim() == 0 or isinstance(m, bool) or not isinstance(m, int):
            return 1, 1, None  # the sampler's own checks report the bad argument
        return math.prod(theta.shape[:-1]) * max(m, 1), theta.shape[-1], theta.device

    return with_fitted_threads(work)(func)  # type: ignore[return-value]
