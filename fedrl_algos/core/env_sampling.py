"""Sampling from any Gymnasium environment through the federated vector env's rollouts.

:class:`EnvSampler` is the :class:`~fedrl_algos.core.sampling.Sampler` of a federation whose agents
are Gymnasium environments rather than a fedrl family's kernels: a MuJoCo or Atari task, CartPole
with per-agent physics, or a user's own env. Each call rolls out fixed-horizon episodes on the
:class:`~fedrl_wrappers.FederatedVecEnv` (``n_agents × n_envs`` environments, every agent's own vector env
stepped sync or in async processes), with **one batched policy forward per time step** for all
agents and trajectories, and assembles the same :class:`~fedrl_algos.core.trajectories.Trajectories`
batch as the kernel sampler: steps after an episode ended are masked (``alive_mask`` of the
termination *and* truncation flags, so an env that resets itself contributes its first episode
only), and every action is drawn from the agents' counter-based random streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedrl_algos.core.sampling import Sampler
from fedrl_algos.core.trajectories import Trajectories, check_rollout_batch, fitted_to_rollout
from fedrl_envs.rng import RandomStreams
from fedrl_envs.validation import check_int
from fedrl_wrappers.federated import FederatedVecEnv

__all__ = ["EnvSampler", "episode_horizon"]


def episode_horizon(env: FederatedVecEnv, horizon: int | None = None) -> int:
    """The last time index H of a federation's episodes (``H + 1`` steps are collected).

    :param env: the federated env
    :param horizon: an explicit H (overrides the env's); ``None``: the env's ``max_episode_steps − 1``
    :raise ValueError: naming ``horizon`` when neither gives one
    """
    if horizon is not None:
        return check_int("horizon", horizon, 0)
    if env.horizon is None:
        raise ValueError(
            f"horizon must be given: {env.env_id} has no max_episode_steps (register it with one, wrap it in "
            "gymnasium.wrappers.TimeLimit, or pass horizon=H to collect H + 1 steps per episode)"
        )
    return int(env.horizon)


@dataclass
class EnvSampler(Sampler):
    """Samples ``m`` episodes per agent from a :class:`~fedrl_wrappers.FederatedVecEnv`: ``sampler(theta, m)``.

    ``theta`` is ``[*B, d]`` with one batch row per agent of the env (``prod(B) == env.n_agents``):
    ``[n, d]`` for one federation, or ``[R, n, d]`` for ``R`` runs whose ``R·n`` agents the env holds
    run-major. With ``n_envs`` environments per agent a call makes ``ceil(m / n_envs)`` passes of
    ``H + 1`` steps. The first call resets the envs with
    ``env_seed``; later calls continue their Gymnasium random number generators, so a sampler gives
    the same episodes for the same seeds and calls.

    :param env: the federated env (either backend; ``autoreset`` either way)
    :param policy: the flat policy
    :param streams: one random stream per batch row (``batch_shape == B``)
    :param horizon: last time index H of an episode (default: the env's, see :func:`episode_horizon`)
    :param env_seed: seed of the first reset (``None``: the env's own seed)
    :param normalizer: observation normalizer: the policy sees, and the trajectories hold,
        normalized observations (:mod:`fedrl_algos.core.normalization`)
    :param update_normalizer: add the raw observations of the steps that ran to its round moments
    :param stop_when_done: return only the steps up to the last one on which an episode of the
        batch still ran (``T <= H + 1``; the dropped steps all have mask 0), as
        :func:`~fedrl_algos.core.sampling.rollout` does for a family: the estimators then skip the
        padding. Either way, a fixed-horizon pass stops stepping once all its episodes ended and the
        streams advance as if every step had run.
    """

    env: FederatedVecEnv
    policy: Any
    streams: RandomStreams
    horizon: int | None = None
    env_seed: int | None = None
    normalizer: Any = None
    update_normalizer: bool = False
    stop_when_done: bool = False
    _reset_seed_used: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.horizon = episode_horizon(self.env, self.horizon)
        if self.env.max_episode_steps is not None and self.horizon + 1 > self.env.max_episode_steps and not self.env.autoreset:
            raise ValueError(
                f"horizon must be < max_episode_steps = {self.env.max_episode_steps} of {self.env.env_id} in its "
                f"fixed-horizon mode, got {self.horizon}"
            )

    def with_policy(self, policy: Any) -> EnvSampler:
        return replace(self, policy=policy)

    def random_state(self) -> dict[str, Any]:
        """Whether this sampler's first (seeded) reset happened, and its environments' random state
        (:meth:`~fedrl_wrappers.federated.GenericFederatedVecEnv.random_state`): plain data from which
        :meth:`set_random_state` continues the same episodes. A native env's randomness is its
        counter-based streams (``"env": None``: they are the federation's to save)."""
        env_state = self.env.random_state() if hasattr(self.env, "random_state") else None
        return {"seeded": bool(self._reset_seed_used), "env": env_state}

    def set_random_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`random_state` returned.

        :raise ValueError: when it is of environments laid out otherwise (agents, sub-environments)
        """
        if state.get("env") is not None:
            self.env.set_random_state(state["env"])
        self._reset_seed_used = bool(state["seeded"])

    def _check_batch(self, theta: torch.Tensor) -> tuple[int, ...]:
        batch = tuple(theta.shape[:-1])
        if not batch or math.prod(batch) != self.env.n_agents:
            raise ValueError(
                f"theta must have one batch row per agent of the federated env ({self.env.n_agents}, e.g. "
                f"[{self.env.n_agents}, d] or [runs, agents, d]), got shape {tuple(theta.shape)}"
            )
        return batch

    @fitted_to_rollout
    def __call__(self, theta: torch.Tensor, n_trajectories: int) -> Trajectories:
        batch = self._check_batch(theta)
        m = check_rollout_batch(theta, self.streams, n_trajectories)
        n, n_envs, steps = self.env.n_agents, self.env.n_envs, self.horizon + 1
        theta = theta.detach()

        drawn = [torch.zeros_like(self.streams.counters)]  # what one policy call draws from the streams

        def act(obs: torch.Tensor) -> torch.Tensor:  # obs [N, n_envs, *obs_shape], N = prod(B)
            obs = obs.to(theta.device).reshape(*batch, n_envs, *obs.shape[2:])
            if self.normalizer is not None:
                obs = self.normalizer.normalize(obs, theta.dtype)
            before = self.streams.counters
            action = self.policy.sample(theta, obs, self.streams)  # [*B, n_envs, *action_shape]
            drawn[0] = self.streams.counters - before
            return action.reshape(n * n_envs, *action.shape[len(batch) + 1 :])

        parts = []
        for _ in range(-(-m // n_envs)):
            seed = None if self._reset_seed_used else self.env_seed
            self._reset_seed_used = True
            part = self.env.rollout(act, n_steps=steps, seed=seed, stop_when_done=True)
            skipped = steps - part.rewards.shape[2]
            if skipped:
                # Every episode ended: the steps not taken are padding. Leave the streams where the
                # steps would have (each draws what the last one drew), so nothing later changes.
                self.streams.counters = self.streams.counters + drawn[0] * skipped
            parts.append(part)
        # Pad the passes to a common length: the longest pass (stop_when_done), or every step.
        length = max(p.rewards.shape[2] for p in parts) if self.stop_when_done else steps
        parts = [p if p.rewards.shape[2] == length else _pad_rollout(p, length - p.rewards.shape[2]) for p in parts]

        def stack(field_name: str) -> torch.Tensor:  # [N, passes · n_envs, T, ...] → first m, on θ's device
            value = torch.cat([torch.as_tensor(getattr(p, field_name)) for p in parts], dim=1)[:, :m]
            return value.to(theta.device).reshape(*batch, m, *value.shape[2:])

        done = stack("terminated") | stack("truncated")
        traj = Trajectories.from_steps(stack("observations"), stack("actions"), stack("rewards"), done, theta.dtype)
        if self.normalizer is None:
            return traj
        if self.update_normalizer:
            self.normalizer.accumulate(traj.obs, traj.mask)
        return traj._replace(obs=self.normalizer.normalize(traj.obs, theta.dtype))


def _pad_rollout(part: Any, steps: int) -> Any:
    """A fixed-horizon rollout whose environments have all terminated, extended by ``steps`` padded
    steps as the environment pads them: the terminal observation, reward 0, terminated; the last
    action repeated (the estimators mask it)."""
    def repeat(x: Any, last: Any) -> Any:
        x, last = torch.as_tensor(x), torch.as_tensor(last).unsqueeze(2)
        return torch.cat([x, last.expand(*x.shape[:2], steps, *x.shape[3:])], dim=2)

    def extend(x: Any, value: Any) -> Any:
        x = torch.as_tensor(x)
        return torch.cat([x, torch.full((*x.shape[:2], steps), value, dtype=x.dtype, device=x.device)], dim=2)

    return part._replace(
        observations=repeat(part.observations, part.last_observations), actions=repeat(part.actions, part.actions[:, :, -1]),
        rewards=extend(part.rewards, 0),
        terminated=extend(part.terminated, True), truncated=extend(part.truncated, False),
    )
