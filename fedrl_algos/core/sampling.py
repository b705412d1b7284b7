"""Samplers: parameters ``theta [*B, d]`` in, a :class:`~fedrl_algos.core.trajectories.Trajectories` batch out.

A :class:`Sampler` is what every algorithm draws trajectories from. :class:`KernelSampler` steps a
fedrl family's batched torch kernels directly (:func:`rollout`); a policy may offer a faster plan
for the same rollout (:meth:`~fedrl_algos.core.protocols.FlatPolicyProtocol.kernel_rollout_plan`,
e.g. the tabular softmax's tabulated transitions), which the sampler asks for once and keeps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedrl_algos.core.capture import captured_rollout, check_capture, resolve_capture
from fedrl_algos.core.trajectories import Trajectories, check_rollout_batch, fitted_to_rollout
from fedrl_envs.family import TaskFamily
from fedrl_envs.params import repeat_params
from fedrl_envs.rng import RandomStreams

__all__ = ["Sampler", "KernelSampler", "rollout", "generic_rollout"]


class Sampler(ABC):
    """Draws ``m`` fresh trajectories for every row of ``theta [*B, d]``: ``sampler(theta, m)``.

    :attr policy: the policy the trajectories are sampled with
    :attr streams: one random stream per batch row (``batch_shape == B``)
    """

    policy: Any
    streams: RandomStreams

    @abstractmethod
    def __call__(self, theta: torch.Tensor, n_trajectories: int) -> Trajectories:
        """Trajectories ``[*B, m, T, ...]`` of the policy with parameters ``theta [*B, d]``."""

    @abstractmethod
    def with_policy(self, policy: Any) -> Sampler:
        """The same sampler acting with another policy (same tasks, same streams object)."""


@fitted_to_rollout
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
    :param policy: a flat policy (:class:`~fedrl_algos.core.protocols.FlatPolicyProtocol`)
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
    m = check_rollout_batch(theta, streams, n_trajectories)
    if horizon is None:
        horizon = family.horizon(params)
    plan = policy.kernel_rollout_plan(family, params)
    fast = plan(theta, streams, m, horizon, stop_when_done) if plan is not None else None
    if fast is not None:
        return fast  # the policy's faster rollout: the same result, bitwise
    return generic_rollout(family, params, policy, theta, streams, m, horizon, stop_when_done)


@fitted_to_rollout
def generic_rollout(
    family: TaskFamily,
    params: Any,
    policy: Any,
    theta: torch.Tensor,
    streams: RandomStreams,
    n_trajectories: int,
    horizon: int,
    stop_when_done: bool = False,
    normalizer: Any = None,
    update_normalizer: bool = False,
) -> Trajectories:
    """:func:`rollout` without asking the policy for a faster plan: one policy call and one kernel
    call per time step (arguments as for :func:`rollout`, ``horizon`` required).

    With ``normalizer`` (an :class:`~fedrl_algos.core.normalization.ObservationNormalizer`) the
    policy sees, and the trajectories hold, normalized observations; with ``update_normalizer`` the
    raw observations of the steps that ran are added to its pending moments.
    """
    batch = theta.shape[:-1]
    m = check_rollout_batch(theta, streams, n_trajectories)
    n_rows = 1
    for b in batch:
        n_rows *= b
    rows = repeat_params(params, m)
    noise = streams.uniform((m, family.reset_noise_dim))
    state = family.reset(rows, noise.reshape(n_rows * m, -1))
    obs_list, act_list, rew_list, done_list = [], [], [], []
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
        if normalizer is not None:
            if update_normalizer:
                normalizer.accumulate(obs_b, alive.reshape(*batch, m))
            obs_b = normalizer.normalize(obs_b, theta.dtype)
        before = streams.counters
        action = policy.sample(theta, obs_b, streams)
        per_step = streams.counters - before
        state, reward, terminated = family.fast_step(state, action.reshape(n_rows * m, *action.shape[len(batch) + 1 :]), rows)
        obs_list.append(obs_b)
        act_list.append(action)
        rew_list.append(reward.reshape(*batch, m))
        done_list.append(terminated.reshape(*batch, m))
        alive = alive & ~terminated
    time_axis = len(batch) + 1
    return Trajectories.from_steps(
        torch.stack(obs_list, dim=time_axis),
        torch.stack(act_list, dim=time_axis),
        torch.stack(rew_list, dim=time_axis),
        torch.stack(done_list, dim=time_axis),
        theta.dtype,
    )


@dataclass
class KernelSampler(Sampler):
    """Samples through a family's kernels: binds the family, per-row task parameters, a policy and
    random streams, so that ``sampler(theta, m)`` is :func:`rollout`.

    The policy's :meth:`kernel_rollout_plan` for ``(family, params)`` is asked for once and kept on
    the sampler (for the family, params and policy objects it was made for).

    :param family: task family
    :param params: task parameters stacked over the flattened batch rows
    :param policy: the flat policy
    :param streams: one random stream per batch row
    :param horizon: episode horizon override
    :param stop_when_done: see :func:`rollout`
    :param normalizer: observation normalizer (see :func:`generic_rollout`)
    :param update_normalizer: add the sampled observations to the normalizer's round moments
    :param capture: run the rollout captured (:mod:`fedrl_algos.core.capture`: one compiled step,
        CUDA graphs on CUDA): ``"auto"`` (default) on CUDA only, ``True``, ``False``. Without a
        normalizer; where it cannot be compiled the eager rollout runs (after a warning)
    """

    family: TaskFamily
    params: Any
    policy: Any
    streams: RandomStreams
    horizon: int | None = None
    stop_when_done: bool = False
    normalizer: Any = None
    update_normalizer: bool = False
    capture: Any = "auto"
    #: where the captured rollouts' compiled programs are kept (a federation shares one between its
    #: samplers, those of partial participation included); ``None``: this sampler's own
    capture_cache: dict[Any, Any] | None = field(default=None, repr=False, compare=False)
    _plan: tuple[Any, Any, Any, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _captured: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_capture(self.capture)

    def _kernel_plan(self) -> Any:
        # Identity of objects this sampler holds references to (so they cannot be collected and
        # their ids reused): a sampler whose family, params or policy was reassigned plans anew.
        cached = self._plan
        if cached is None or cached[0] is not self.family or cached[1] is not self.params or cached[2] is not self.policy:
            cached = (self.family, self.params, self.policy, self.policy.kernel_rollout_plan(self.family, self.params))
            self._plan = cached
        return cached[3]

    @fitted_to_rollout
    def __call__(self, theta: torch.Tensor, n_trajectories: int) -> Trajectories:
        m = check_rollout_batch(theta, self.streams, n_trajectories)
        horizon = self.family.horizon(self.params) if self.horizon is None else self.horizon
        if self.normalizer is None and resolve_capture(self.capture, theta.device):
            captured = captured_rollout(self.family, self.params, self.policy, theta, self.streams, m, horizon, self.stop_when_done,
                                        cache=self._captured if self.capture_cache is None else self.capture_cache)
            if captured is not None:
                return captured
        if self.normalizer is None:  # a policy's fast plan reads the raw observations
            plan = self._kernel_plan()
            fast = plan(theta, self.streams, m, horizon, self.stop_when_done) if plan is not None else None
            if fast is not None:
                return fast
        return generic_rollout(
            self.family, self.params, self.policy, theta, self.streams, m, horizon, self.stop_when_done, self.normalizer, self.update_normalizer
        )

    def with_policy(self, policy: Any) -> KernelSampler:
        return replace(self, policy=policy)
