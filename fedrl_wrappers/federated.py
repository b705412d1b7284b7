"""The federated vectorized environment: every agent's own MDP, all agents stepping together.

:class:`FederatedVecEnv` runs ``n_agents × n_envs`` environments as one
``gymnasium.vector.VectorEnv`` over the flat, agent-major batch (row ``i * n_envs + j`` is agent
``i``'s environment ``j``). Two backends sit behind the one constructor:

* **native** (:class:`NativeFederatedVecEnv`), for every registered fedrl family: the family's
  batched torch kernel steps all agents in one call; observations, rewards and flags are torch
  tensors on ``device``; random numbers come from one counter-based stream per agent
  (:class:`fedrl_envs.RandomStreams`);
* **generic** (:class:`GenericFederatedVecEnv`), for any other Gymnasium id: one Gymnasium
  ``SyncVectorEnv`` (or ``AsyncVectorEnv``) per agent, built with that agent's ``gym.make``
  keyword arguments; results are stacked into torch tensors on ``device``.

See ``docs/federated_env.md`` for shapes, modes and interoperability.
"""

from __future__ import annotations

import importlib
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

import fedrl_envs
from fedrl_envs import FamilyVectorEnv, derive_keys
from fedrl_envs.capture import ChunkRunner, check_capture, resolve_capture
from fedrl_envs.family import alive_mask
from fedrl_envs.params import repeat_params
from fedrl_envs.rng import seed_from_entropy
from fedrl_envs.threads import with_fitted_threads
from fedrl_envs.validation import (
    MAX_ENVS,
    _reset_mask,
    check_array_type,
    check_bool,
    check_device,
    check_int,
    check_seed,
)
from fedrl_envs.vector import fitted_to_envs
from fedrl_wrappers.snapshot import EpisodeRecorder, generator_from_state, tensor_data, tensor_from_data

if TYPE_CHECKING:
    from stable_baselines3.common.vec_env import VecEnv

#: steps per compiled chunk (one CUDA graph) of a captured rollout
_CAPTURE_CHUNK = 32

__all__ = ["FederatedVecEnv", "NativeFederatedVecEnv", "GenericFederatedVecEnv", "EnvRollout"]

_SEED_MASK = (1 << 62) - 1


class EnvRollout(NamedTuple):
    """Steps collected by :meth:`FederatedVecEnv.rollout`; axes ``[agent, env, time, ...]``.

    Not to be confused with ``fedrl_algos.core.Trajectories``, the algorithms' batch (indices and
    masks ready for the estimators); this is what the environment returns (observations as the
    environment gives them, flags, and the last observation).

    The fields are torch tensors, or NumPy arrays for a federation with ``array_type="numpy"``.

    Step ``t`` takes ``actions[..., t]`` in the state observed as ``observations[..., t]`` and
    earns ``rewards[..., t]``. In the fixed-horizon mode an environment whose episode terminated
    early is padded: its later steps repeat the last observation, earn reward 0 and keep
    ``terminated`` set, so ``alive`` masks the steps that really happened.
    """

    #: ``[n_agents, n_envs, T, *obs_shape]``, the observation each action is taken in (the fields are
    #: views of time-major storage: ``x[:, :, t]`` is contiguous; ``.contiguous()`` copies if needed)
    observations: torch.Tensor
    #: ``[n_agents, n_envs, T, *action_shape]``
    actions: torch.Tensor
    #: ``[n_agents, n_envs, T]`` float32
    rewards: torch.Tensor
    #: ``[n_agents, n_envs, T]`` bool
    terminated: torch.Tensor
    #: ``[n_agents, n_envs, T]`` bool
    truncated: torch.Tensor
    #: ``[n_agents, n_envs, *obs_shape]``, the observation after the last step
    last_observations: torch.Tensor

    @property
    def alive(self) -> torch.Tensor:
        """``[n_agents, n_envs, T]`` bool: step ``t`` was taken before any termination (fixed horizon).

        The library's one episode mask, :func:`fedrl_envs.family.alive_mask` (the terminating step
        itself is alive); a NumPy array when the fields are.
        """
        if isinstance(self.terminated, np.ndarray):
            return alive_mask(torch.from_numpy(self.terminated)).numpy()
        return alive_mask(self.terminated)


def resolve_env_id(env_id: str) -> str:
    """The registered id of ``env_id``; ``"module:EnvId"`` (as ``gym.make`` takes it) first imports
    ``module``, whose import registers ``EnvId``, and gives ``EnvId`` (the id a saved model records:
    import the module before loading it).

    :raise ValueError: naming the module when it cannot be imported
    """
    if ":" not in env_id:
        return env_id
    module, _, name = env_id.partition(":")
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"env_id {env_id!r}: its module {module!r} cannot be imported ({err})") from None
    return name


def _check_agent_kwargs(agent_kwargs: Any, n_expected: int | None) -> list[dict[str, Any]] | None:
    if agent_kwargs is None:
        return None
    if isinstance(agent_kwargs, Mapping) or not isinstance(agent_kwargs, Sequence):
        raise TypeError(f"agent_kwargs must be a list with one dict per agent, got {type(agent_kwargs).__name__}")
    if len(agent_kwargs) == 0:
        raise ValueError("agent_kwargs must be a non-empty list with one dict per agent")
    for k, kw in enumerate(agent_kwargs):
        if not isinstance(kw, Mapping):
            raise TypeError(f"agent_kwargs[{k}] must be a dict of gym.make keyword arguments, got {type(kw).__name__}")
    if n_expected is not None and len(agent_kwargs) != n_expected:
        raise ValueError(
            f"agent_kwargs must have one dict per agent: len(agents)={n_expected}, got len(agent_kwargs)={len(agent_kwargs)}"
        )
    return [dict(kw) for kw in agent_kwargs]


def _check_env_kwargs(env_kwargs: Any) -> dict[str, Any]:
    if env_kwargs is None:
        return {}
    if not isinstance(env_kwargs, Mapping) or not all(isinstance(k, str) for k in env_kwargs):
        raise TypeError(f"env_kwargs must be a dict of gym.make keyword arguments (str keys), got {env_kwargs!r}")
    return dict(env_kwargs)


def _check_stream_ids(stream_ids: Any, n_agents: int) -> list[int]:
    if stream_ids is None:
        return list(range(n_agents))
    if isinstance(stream_ids, str | bytes | Mapping) or not isinstance(stream_ids, Sequence | np.ndarray | torch.Tensor):
        raise TypeError(f"stream_ids must be a list with one int per agent, got {type(stream_ids).__name__}")
    ids = [check_int(f"stream_ids[{k}]", s, 0) for k, s in enumerate(stream_ids)]
    if len(ids) != n_agents:
        raise ValueError(f"stream_ids must have one entry per agent ({n_agents}), got {len(ids)}")
    return ids


def _agent_list(agents: Any, n_tasks: int, owner: str, name: str = "agents") -> list[int]:
    """``agents`` as a non-empty list of ints in ``[0, n_tasks)``; errors name ``name``."""
    if isinstance(agents, int | np.integer) or not isinstance(agents, Sequence | np.ndarray | torch.Tensor | range):
        raise TypeError(f"{name} must be a list of indices, got {type(agents).__name__}")
    values = agents.tolist() if isinstance(agents, np.ndarray | torch.Tensor) else list(agents)
    if len(values) == 0:
        raise ValueError(f"{name} must be a non-empty list of indices")
    out = []
    for pos, k in enumerate(values):
        try:
            out.append(check_int(f"{name}[{pos}]", k, 0, n_tasks - 1))
        except ValueError as err:
            # The range alone does not say which list the index points into.
            raise ValueError(f"{err} ({owner} has {n_tasks})") from None
    return out


@dataclass(frozen=True)
class _Arguments:
    """What :class:`FederatedVecEnv`'s constructor hands its backend (see its ``:param:`` list).

    ``n_envs``, ``device`` and ``seed`` are checked and converted, ``env_kwargs`` is a dict; the
    rest is as given, for the backend to check.
    """

    n_envs: int
    agents: Sequence[int] | None
    agent_kwargs: Sequence[Mapping[str, Any]] | None
    device: torch.device
    seed: int | None
    autoreset: bool
    env_kwargs: dict[str, Any]
    stream_ids: Sequence[int] | None
    vectorization_mode: str | None
    array_type: str
    kernels: str


class FederatedVecEnv(VectorEnv, ABC):
    """``n_agents × n_envs`` environments, each agent with its own task, as one vector env.

    It has the whole Gymnasium 1.x vector API (``num_envs``, ``single_observation_space``,
    ``single_action_space``, ``observation_space``, ``action_space``, ``metadata`` with
    ``autoreset_mode``, ``autoreset_mode``, ``render_mode``, ``np_random``, ``spec``,
    ``unwrapped``, ``close``, ``closed``), so libraries that take Gymnasium vector envs (TorchRL's
    ``GymWrapper``, skrl's ``wrap_env``, Gymnasium's vector wrappers) take it as it is.

    ``FederatedVecEnv(...)`` returns a :class:`NativeFederatedVecEnv` for a fedrl family id and a
    :class:`GenericFederatedVecEnv` for any other Gymnasium id; both are instances of this class.

    :param env_id: a fedrl family id (``"fedrl/GridWorld-v0"``) or any registered Gymnasium id
    :param n_envs: environments per agent (1 to ``MAX_ENVS`` = 2**24)
    :param agents: fedrl families only: task indices into the family's training tasks, one per
        agent (``None``: all training tasks, e.g. the paper's 8 gridworld goals)
    :param agent_kwargs: one dict of ``gym.make`` keyword arguments per agent (any task, e.g. a
        held-out goal, or ``{"g": 5.0}`` for ``Pendulum-v1``); with ``agents`` given, merged into
        each chosen task's arguments
    :param device: torch device of every returned tensor
    :param seed: seed of the agents' random streams (``None``: drawn at random); ``reset(seed=)``
        re-seeds
    :param autoreset: ``True``: ``SAME_STEP`` autoreset; ``False``: the fixed-horizon mode
    :param env_kwargs: ``gym.make`` keyword arguments shared by all agents (agent kwargs win)
    :param stream_ids: index of each agent's random stream (default ``0..n_agents-1``, the agent's
        position); an agent keeps its trajectories in any batch that gives it the same index
    :param vectorization_mode: generic backend only: ``"sync"`` (``None``, the default) or
        ``"async"``; the native backend is one batched program and refuses it
    :param array_type: ``"torch"`` (default): observations, rewards, flags and infos are torch
        tensors on ``device``; ``"numpy"``: NumPy arrays (observations in the observation space's
        dtype, rewards ``float32``, flags ``bool``), for NumPy libraries; actions may be either
    :param kernels: native backend only: ``"auto"`` (default: ``"numba"`` where the family has a fused
        CPU step and Numba is installed, else ``"torch"``), ``"torch"``, ``"numpy"`` or ``"numba"``, what the
        family's step kernel runs on (:class:`fedrl_envs.FamilyVectorEnv`'s ``kernels``: NumPy on
        the CPU is faster, with bitwise the same transitions for the gridworld and arc navigation
        and one float32 ulp apart where NumPy and torch round ``sin``/``cos`` differently for
        CartPole and Pendulum; ``"numba"``, CartPole only: each step one compiled pass, bitwise
        the torch values, the fastest on the CPU)
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
    #: ``"native"`` or ``"generic"``
    backend: str
    env_id: str
    n_agents: int
    n_envs: int
    device: torch.device
    autoreset: bool
    #: ``"torch"`` or ``"numpy"``: the type of every returned array
    array_type: str
    #: last time index H of an episode (``H + 1`` steps), or ``None`` without a fixed limit
    horizon: int | None
    #: per-agent ``gym.make`` keyword arguments that recreate each agent's task
    agent_kwargs: list[dict[str, Any]]
    stream_ids: list[int]

    def __new__(cls, env_id: str | None = None, *args: Any, **kwargs: Any) -> FederatedVecEnv:
        if cls is FederatedVecEnv:
            if not isinstance(env_id, str):
                raise TypeError(f"env_id must be a registered environment id (str), got {type(env_id).__name__}")
            env_id = resolve_env_id(env_id)
            cls = NativeFederatedVecEnv if fedrl_envs.family_of(env_id) is not None else GenericFederatedVecEnv
        return super().__new__(cls)

    def __init__(
        self,
        env_id: str,
        n_envs: int,
        agents: Sequence[int] | None = None,
        agent_kwargs: Sequence[Mapping[str, Any]] | None = None,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        autoreset: bool = True,
        env_kwargs: Mapping[str, Any] | None = None,
        stream_ids: Sequence[int] | None = None,
        vectorization_mode: str | None = None,
        array_type: str = "torch",
        kernels: str = "auto",
    ) -> None:
        # One signature and one set of argument checks for both backends; each builds in _build.
        if not isinstance(autoreset, bool):
            raise TypeError(f"autoreset must be a bool, got {type(autoreset).__name__}")
        self.env_id = env_id = resolve_env_id(env_id)
        self._elapsed = 0
        self._finished: torch.Tensor | None = None
        self._frozen_obs: torch.Tensor | None = None
        self._build(
            _Arguments(
                n_envs=check_int("n_envs", n_envs, 1, MAX_ENVS),
                agents=agents,
                agent_kwargs=agent_kwargs,
                device=check_device(device),
                seed=check_seed(seed),
                autoreset=autoreset,
                env_kwargs=_check_env_kwargs(env_kwargs),
                stream_ids=stream_ids,
                vectorization_mode=vectorization_mode,
                array_type=check_array_type(array_type),
                kernels=kernels,
            )
        )

    @abstractmethod
    def _build(self, args: _Arguments) -> None:
        """Build the backend from the constructor's arguments (``n_envs``, ``device``, ``seed``, ``autoreset`` checked)."""

    # --- shared behaviour ----------------------------------------------------------------------
    @property
    def autoreset_mode(self) -> AutoresetMode:
        """``SAME_STEP`` (``autoreset=True``) or ``DISABLED`` (the fixed-horizon mode), as ``metadata["autoreset_mode"]``."""
        return self.metadata["autoreset_mode"]

    def _fixed_horizon_reset_mask(self, options: dict[str, Any] | None) -> None:
        """The fixed-horizon mode steps all environments in one block: a reset_mask must select every row."""
        mask = _reset_mask(options, self.num_envs)
        if mask is not None and not mask.all() and not self.autoreset:
            raise ValueError(
                "options['reset_mask'] must select every environment in the fixed-horizon mode (autoreset=False): "
                "its episodes run in one block of horizon + 1 steps"
            )

    @property
    def max_episode_steps(self) -> int | None:
        """Steps of a full episode, ``horizon + 1`` (``None`` without a fixed limit)."""
        return None if self.horizon is None else self.horizon + 1

    def structured(self, batch: Any) -> Any:
        """View a flat batch ``[num_envs, ...]`` (tensor or array) as ``[n_agents, n_envs, ...]`` (no copy)."""
        if not isinstance(batch, torch.Tensor | np.ndarray):
            raise TypeError(f"batch must be a torch tensor or NumPy array of num_envs={self.num_envs} rows, got {type(batch).__name__}")
        if batch.ndim == 0 or batch.shape[0] != self.num_envs:
            raise ValueError(f"batch must have num_envs={self.num_envs} rows, got shape {tuple(batch.shape)}")
        return batch.reshape(self.n_agents, self.n_envs, *batch.shape[1:])

    def _start_episode(self) -> None:
        self._elapsed = 0
        self._finished = None
        self._frozen_obs = None

    def _check_steppable(self) -> None:
        if self.closed:
            raise ValueError("this environment is closed; create a new one instead of stepping it")
        limit = self.max_episode_steps
        if not self.autoreset and limit is not None and self._elapsed >= limit:
            raise RuntimeError(
                f"fixed-horizon mode: all {limit} steps of the episode were taken; call reset() to start the next block"
            )

    def _pad_finished(self, obs: Any, reward: Any, terminated: Any) -> tuple[Any, Any, Any]:
        """Fixed-horizon mode: after an early termination an env repeats its last observation, reward 0.

        Torch tensors or NumPy arrays (the generic backend's NumPy mode), with the same operations.
        """
        finished = self._finished
        if finished is None:
            # One check per step until something terminates; nothing to pad before that.
            if not bool(terminated.any()):
                return obs, reward, terminated
        else:
            xp = np if isinstance(obs, np.ndarray) else torch
            mask = finished.reshape(finished.shape + (1,) * (obs.ndim - 1))
            obs = xp.where(mask, self._frozen_obs, obs)
            reward = xp.where(finished, xp.zeros_like(reward), reward)
            terminated = terminated | finished
        self._finished = terminated
        self._frozen_obs = obs
        return obs, reward, terminated

    def subset(
        self, agents: Sequence[int], n_envs: int | None = None, autoreset: bool | None = None
    ) -> FederatedVecEnv:
        """A new, independent federation of the agents at positions ``agents`` of this one.

        Each chosen agent keeps its task and its random stream (same seed and stream index), so
        given the same seed and actions it reproduces the trajectories it has here.
        """
        positions = _agent_list(agents, self.n_agents, "this federation's agent list")
        return FederatedVecEnv(
            self.env_id,
            self.n_envs if n_envs is None else n_envs,
            agent_kwargs=[self.agent_kwargs[p] for p in positions],
            device=self.device,
            seed=self._seed,
            autoreset=self.autoreset if autoreset is None else autoreset,
            stream_ids=[self.stream_ids[p] for p in positions],
            array_type=self.array_type,
            **self._subset_kwargs(),
        )

    def _subset_kwargs(self) -> dict[str, Any]:
        return {}

    def to_sb3(self, agent: int | None, monitor: bool = True) -> VecEnv:
        """Agent ``agent``'s MDP as a Stable-Baselines3 ``VecEnv`` (numpy in/out, SB3 autoreset).

        The view is an independent copy (:meth:`subset`) with this federation's ``n_envs``, device,
        seed and the agent's stream; stepping it does not step this federation. ``agent=None``
        exposes every agent's environments as one ``VecEnv`` of ``num_envs`` rows instead.

        :param agent: position of the agent in this federation, or ``None`` for all agents
        :param monitor: wrap the view in SB3's ``VecMonitor`` (episode returns in SB3's logs)
        """
        from fedrl_wrappers.sb3 import SB3VecEnv

        if agent is None:
            positions = list(range(self.n_agents))
        else:
            positions = [check_int("agent", agent, 0, self.n_agents - 1)]
        monitor = check_bool("monitor", monitor)
        view: VecEnv = SB3VecEnv(self.subset(positions, autoreset=True))
        if monitor:
            from stable_baselines3.common.vec_env import VecMonitor

            view = VecMonitor(view)
        return view

    def _policy_actions(self, actions: Any) -> Any:
        act_shape = tuple(self.single_action_space.shape or ())
        if self.array_type == "numpy":
            actions = actions.detach().cpu().numpy() if isinstance(actions, torch.Tensor) else np.asarray(actions)
        elif not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions), device=self.device)
        if tuple(actions.shape) == (self.n_agents, self.n_envs, *act_shape):
            actions = actions.reshape(self.num_envs, *act_shape)
        return actions

    def rollout(
        self,
        policy_fn: Callable[[torch.Tensor], Any],
        n_steps: int | None = None,
        seed: int | None = None,
        stop_when_done: bool = False,
        capture: Any = "auto",
    ) -> EnvRollout:
        """Reset, then collect ``n_steps`` steps of every environment with ``policy_fn`` in the loop.

        :param policy_fn: maps observations ``[n_agents, n_envs, *obs_shape]`` (the structured
            view) to actions ``[n_agents, n_envs, *action_shape]`` or ``[num_envs, *action_shape]``
        :param n_steps: steps to collect (default ``horizon + 1``: one whole episode per env in the
            fixed-horizon mode)
        :param seed: passed to :meth:`reset`
        :param stop_when_done: fixed-horizon mode only: return as soon as every environment has
            terminated (the steps left would all be padding), so the rollout may hold fewer than
            ``n_steps`` steps; ``policy_fn`` is not called for the steps not taken
        :param capture: run the steps captured (``fedrl_envs.capture``: ``policy_fn`` and the step
            compiled as one program, chunks of steps replayed as CUDA graphs): ``"auto"`` (default) on
            CUDA, ``True``, ``False``. It applies to a native family with ``autoreset=True`` and torch
            arrays; ``policy_fn`` must then be traceable by ``torch.compile`` without a graph break
            (else the eager loop runs, after a warning). Actions are checked once per chunk. The
            compiled program is kept for this ``policy_fn`` object: what it closes over (a Python
            number, a module's mode, a module swapped for another) is read when it is compiled, so
            pass a new function when that changes; tensors updated in place are read at every call
        :return: :class:`EnvRollout` with axes ``[agent, env, time, ...]``
        """
        check_capture(capture)
        if n_steps is None:
            if self.horizon is None:
                raise ValueError(f"n_steps is required: {self.env_id} has no fixed horizon")
            n_steps = self.horizon + 1
        n_steps = check_int("n_steps", n_steps, 1)
        limit = self.max_episode_steps
        if not self.autoreset and limit is not None and n_steps > limit:
            raise ValueError(f"n_steps must be <= horizon + 1 = {limit} in the fixed-horizon mode, got {n_steps}")
        stop_when_done = check_bool("stop_when_done", stop_when_done) and not self.autoreset
        if (resolve_capture(capture, self.device) and self.backend == "native" and self.autoreset
                and self.array_type == "torch"):
            captured = self._captured_rollout(policy_fn, n_steps, seed)
            if captured is not None:
                return captured
        obs, _ = self.reset(seed=seed)
        observations, actions, rewards, terminated, truncated = [], [], [], [], []
        for _ in range(n_steps):
            action = self._policy_actions(policy_fn(self.structured(obs)))
            observations.append(obs)
            actions.append(action)
            obs, reward, term, trunc, _ = self.step(action)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            if stop_when_done and bool(term.all()):  # padded: every env has terminated
                n_steps = len(rewards)
                break

        def stack(items: list[Any]) -> Any:
            # Stored time-major (a contiguous copy, 3x cheaper than stacking on dim 1); returned as
            # a [agent, env, time, ...] view whose time slices stay contiguous.
            if self.array_type == "numpy":
                flat_np = np.stack(items)
                return np.moveaxis(flat_np.reshape(n_steps, self.n_agents, self.n_envs, *flat_np.shape[2:]), 0, 2)
            flat = torch.stack([x.to(self.device) for x in items])  # [time, num_envs, ...]
            return flat.reshape(n_steps, self.n_agents, self.n_envs, *flat.shape[2:]).movedim(0, 2)

        return EnvRollout(
            stack(observations), stack(actions), stack(rewards), stack(terminated), stack(truncated), self.structured(obs)
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.env_id!r}, n_agents={self.n_agents}, n_envs={self.n_envs}, "
            f"device={str(self.device)!r}, autoreset={self.autoreset}"
            + (f", array_type={self.array_type!r})" if self.array_type != "torch" else ")")
        )


# VectorEnv is named among the bases although both parents derive from it: libraries that detect
# Gymnasium envs by their class's direct bases (skrl's wrap_env) then recognise the federation.
class NativeFederatedVecEnv(FederatedVecEnv, FamilyVectorEnv, VectorEnv):
    """The native backend: a fedrl family's kernel steps every agent's environments in one call.

    Built by ``FederatedVecEnv(family_id, ...)``; the stepping, autoreset and action checks are
    :class:`fedrl_envs.FamilyVectorEnv`'s. Adds ``final_info`` to the autoreset info, the
    fixed-horizon guard and padding, and stream indices per agent. ``family``, ``agent_params``
    (stacked per-agent task parameters on ``device``), ``params`` (repeated per env row),
    ``streams``, ``state`` and ``set_state`` come from the base class.
    """

    backend = "native"

    def _build(self, args: _Arguments) -> None:
        env_id, agents, agent_kwargs, env_kwargs = self.env_id, args.agents, args.agent_kwargs, args.env_kwargs
        family = fedrl_envs.get_family(env_id)
        if args.vectorization_mode is not None:
            raise ValueError(
                f"vectorization_mode is for the generic backend; {env_id} runs natively (all agents in one "
                f"batched program), got vectorization_mode={args.vectorization_mode!r}"
            )
        if agents is not None:
            picks = _agent_list(agents, len(family.train_tasks), f"{env_id}'s list of training tasks")
            extra = _check_agent_kwargs(agent_kwargs, len(picks)) or [{} for _ in picks]
            make = [{**env_kwargs, "agent": k, **kw} for k, kw in zip(picks, extra, strict=True)]
        elif agent_kwargs is not None:
            make = [{**env_kwargs, **kw} for kw in _check_agent_kwargs(agent_kwargs, None)]  # type: ignore[union-attr]
        else:
            make = [{**env_kwargs, **family.task_kwargs(task)} for task in family.train_tasks]
        tasks = []
        for k, kw in enumerate(make):
            try:
                tasks.append(family.make_params(**kw))
            except TypeError as err:
                raise TypeError(f"agent_kwargs[{k}]: {err}") from err
            except ValueError as err:
                raise ValueError(f"agent_kwargs[{k}]: {err}") from err
        self.agent_kwargs = [family.task_kwargs(task) for task in tasks]
        self.stream_ids = _check_stream_ids(args.stream_ids, len(tasks))
        FamilyVectorEnv.__init__(
            self,
            family,
            tasks,
            n_envs=args.n_envs,
            device=args.device,
            seed=args.seed,
            autoreset=args.autoreset,
            array_type=args.array_type,
            kernels=args.kernels,
        )

    def _subset_kwargs(self) -> dict[str, Any]:
        return {"kernels": self.kernels}

    def _make_streams(self, seed: int | None) -> fedrl_envs.RandomStreams:
        self._seed = seed_from_entropy() if seed is None else seed
        return fedrl_envs.RandomStreams(derive_keys(self._seed, torch.tensor(self.stream_ids)), self.device)

    @fitted_to_envs
    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._fixed_horizon_reset_mask(options)
        self._start_episode()
        return FamilyVectorEnv.reset(self, seed=seed, options=options)

    @fitted_to_envs
    def set_state(self, state: Any, t: torch.Tensor | int = 0) -> Any:
        obs = FamilyVectorEnv.set_state(self, state, t)
        self._start_episode()
        self._elapsed = int(self._t.min())
        return obs

    def snapshot(self) -> dict[str, Any]:
        """Everything these environments continue from, as plain data: the kernel state, every
        env's time index, the streams' positions and the seed (a family's envs are pure functions
        of them). An env of the same family, agents and ``n_envs`` given it by
        :meth:`restore_snapshot` steps on as this one would."""
        return {"backend": "native", "seed": self._seed, "counters": tensor_data(self.streams.counters),
                "state": None if self._state is None else tensor_data(self.state), "t": tensor_data(self._t),
                "elapsed": int(self._elapsed)}

    def restore_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Continue from what :meth:`snapshot` returned.

        :raise ValueError: for a snapshot of another backend or layout
        """
        if not isinstance(snapshot, dict) or snapshot.get("backend") != "native":
            raise ValueError("snapshot must be what a native-backend FederatedVecEnv's snapshot() returned")
        counters = tensor_from_data(snapshot["counters"], self.device)
        if counters.shape != self.streams.counters.shape:
            raise ValueError(f"the snapshot's streams are {tuple(counters.shape)}, this env's {tuple(self.streams.counters.shape)}")
        self.streams = self._make_streams(snapshot["seed"])
        self.streams.counters = counters
        if snapshot["state"] is not None:
            self.set_state(tensor_from_data(snapshot["state"], self.device), tensor_from_data(snapshot["t"], self.device))
        self._elapsed = int(snapshot["elapsed"])

    def _capture_runner(self, policy_fn: Callable[[torch.Tensor], Any]) -> ChunkRunner:
        """The compiled (policy, step) of ``policy_fn``, kept for it (and these task parameters)."""
        cache = self.__dict__.setdefault("_capture_runners", {})
        key = id(policy_fn)
        cached = cache.get(key)
        if cached is not None and cached[0] is policy_fn and cached[1] is self.params:
            return cached[2]
        n_agents, n_envs, act_shape = self.n_agents, self.n_envs, tuple(self.single_action_space.shape or ())
        space = self.single_action_space
        bounds = (int(space.start), int(space.start + space.n - 1)) if isinstance(space, gym.spaces.Discrete) else None

        def step(state: torch.Tensor, t: torch.Tensor, counters: torch.Tensor, obs: torch.Tensor, row_agent: torch.Tensor,
                 bases: torch.Tensor) -> tuple[torch.Tensor, ...]:
            action = policy_fn(obs.reshape(n_agents, n_envs, *obs.shape[1:]))
            action = action.reshape(n_agents * n_envs, *act_shape)
            # The actions are checked after their chunk: until then an out-of-range index must not
            # reach a kernel's table (on CUDA a device-side assert would end the process's context).
            safe = action if bounds is None else action.clamp(*bounds)
            next_state, t, counters, next_obs, reward, terminated, truncated = self.functional_autoreset_step(
                state, t, counters, safe, row_agent, bases)
            return next_state, t, counters, next_obs, obs, action, reward, terminated, truncated

        # ``_capture_backend``: "inductor"; the tests set "aot_eager" (eager's operations, bitwise)
        runner = ChunkRunner(step, n_carry=4, backend=self.__dict__.get("_capture_backend", "inductor"))
        cache.clear()  # one policy function at a time: its graphs hold device buffers
        cache[key] = (policy_fn, self.params, runner)
        return runner

    def _captured_rollout(self, policy_fn: Callable[[torch.Tensor], Any], n_steps: int, seed: int | None) -> EnvRollout | None:
        """:meth:`rollout` captured (``None`` after a warning when ``policy_fn`` cannot be compiled;
        the environments are then as they were)."""
        before = self.snapshot()
        obs, _ = self.reset(seed=seed)
        carry: tuple[torch.Tensor, ...] = (self.state, self._t, self.streams.counters, obs)
        row_agent, bases = self._reset_word_bases()
        records: list[tuple[torch.Tensor, ...]] = []
        invalid: ValueError | None = None
        try:
            with warnings.catch_warnings():
                # The families' constant tables come from lru_cache'd builders of their device alone.
                warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
                runner = self._capture_runner(policy_fn)
                for start in range(0, n_steps, _CAPTURE_CHUNK):
                    carry, chunk = runner.run(carry, (row_agent, bases), min(_CAPTURE_CHUNK, n_steps - start))
                    # One check per chunk (eager checks every step): the chunk's actions, before they are returned.
                    try:
                        self.family.validate_action(torch.cat([r[1] for r in chunk]), repeat_params(self.params, len(chunk)))
                    except ValueError as err:
                        invalid = err
                        break
                    records.extend(chunk)
        except Exception as err:  # noqa: BLE001  (any compiler failure: the eager loop runs instead)
            self.restore_snapshot(before)
            warnings.warn(f"rollout(capture=...): policy_fn could not be captured ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); the eager loop runs instead", stacklevel=3)
            return None
        if invalid is not None:
            self.restore_snapshot(before)  # a refused rollout leaves the environments as they were
            raise invalid
        state, t, counters, last_obs = carry
        self.set_state(state, t)
        self.streams.counters = counters
        self._elapsed = n_steps

        def stack(i: int) -> torch.Tensor:
            flat = torch.stack([r[i] for r in records])  # [time, num_envs, ...], as the eager loop stores it
            return flat.reshape(n_steps, self.n_agents, self.n_envs, *flat.shape[2:]).movedim(0, 2)

        return EnvRollout(stack(0), stack(1), stack(2), stack(3), stack(4), self.structured(last_obs))

    @fitted_to_envs
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step all ``num_envs`` environments with actions ``[num_envs, *action_shape]`` (torch or numpy)."""
        self._check_steppable()
        if not isinstance(actions, torch.Tensor):
            actions = np.asarray(actions)
            if actions.dtype.kind not in "biuf":
                raise TypeError(f"actions must be a numeric array or tensor, got dtype {actions.dtype}")
        obs, reward, terminated, truncated, info = FamilyVectorEnv._step_tensors(self, actions)
        self._elapsed += 1
        if info:
            info["final_info"] = {}
            info["_final_info"] = info["_final_obs"]
        elif not self.autoreset:
            obs, reward, terminated = self._pad_finished(obs, reward, terminated)
        return self._export_step(obs, reward, terminated, truncated, info)


def _blank(example: np.ndarray, n: int) -> np.ndarray:
    if example.dtype == object:
        return np.full((n, *example.shape[1:]), None, dtype=object)
    return np.zeros((n, *example.shape[1:]), dtype=example.dtype)


def _concat_infos(infos: list[dict[str, Any]], n_envs: int) -> dict[str, Any]:
    """Concatenate per-agent Gymnasium vector infos (``key`` plus mask ``_key``) along the batch."""
    keys: list[str] = []
    for info in infos:
        keys.extend(k for k in info if k not in keys)
    out: dict[str, Any] = {}
    for key in keys:
        if key.startswith("_") and key[1:] in keys:
            continue
        parts = [info.get(key) for info in infos]
        example = next(p for p in parts if p is not None)
        if isinstance(example, dict):
            out[key] = _concat_infos([p if p is not None else {} for p in parts], n_envs)
        else:
            example = np.asarray(example)
            out[key] = np.concatenate([np.asarray(p) if p is not None else _blank(example, n_envs) for p in parts])
        masks = [
            np.asarray(info.get(f"_{key}", np.full(n_envs, key in info)), dtype=bool) for info in infos
        ]
        out[f"_{key}"] = np.concatenate(masks)
    return out


def _observation_work(env: Any, *args: Any, **kwargs: Any) -> tuple[int, int, torch.device]:
    """The work of a generic-backend call: ``num_envs`` observations converted and moved to the device."""
    return env.num_envs, math.prod(env.single_observation_space.shape or (1,)), env.device


#: a generic-backend method run with the intra-op threads fitted to its observations (:mod:`fedrl_envs.threads`)
_fitted_to_observations = with_fitted_threads(_observation_work)


class GenericFederatedVecEnv(FederatedVecEnv, VectorEnv):  # VectorEnv named: see NativeFederatedVecEnv
    """The generic backend: one Gymnasium vector env per agent, results stacked on ``device``.

    Each agent ``i`` runs ``gym.make_vec(env_id, n_envs, vectorization_mode, **kwargs_i)`` with
    ``SAME_STEP`` autoreset; agent ``i``'s sub-environments are seeded from ``(seed, stream_ids[i])``.
    Observations, rewards (float32) and flags come back as torch tensors on ``device``, and
    ``info["final_obs"]`` as a tensor ``[num_envs, *obs_shape]`` that equals the returned
    observation where ``info["_final_obs"]`` is false; every other info entry is the agents'
    Gymnasium infos concatenated along the batch (NumPy arrays with ``_key`` masks). With
    ``array_type="numpy"`` the same values are NumPy arrays and never pass through torch.
    """

    backend = "generic"
    family = None

    def _build(self, args: _Arguments) -> None:
        env_id, n_envs, autoreset, vectorization_mode = self.env_id, args.n_envs, args.autoreset, args.vectorization_mode
        if args.agents is not None:
            raise ValueError(
                f"agents selects training tasks of a fedrl family; {env_id} is not one "
                f"(families: {sorted(fedrl_envs.FAMILIES)}): give each agent its gym.make kwargs with agent_kwargs"
            )
        if env_id not in gym.registry:
            raise ValueError(f"env_id {env_id!r} is not a registered Gymnasium environment")
        if args.kernels not in ("auto", "torch"):
            raise ValueError(
                f"kernels is for fedrl's native families (their step kernel runs on torch, NumPy or Numba); {env_id} steps "
                f'its own Gymnasium envs, got kernels={args.kernels!r}'
            )
        if vectorization_mode is None:
            vectorization_mode = "sync"
        if vectorization_mode not in ("sync", "async"):
            raise ValueError(f"vectorization_mode must be 'sync' or 'async', got {vectorization_mode!r}")
        self.device = args.device
        self._seed = args.seed
        per_agent = _check_agent_kwargs(args.agent_kwargs, None) or [{}]
        self.agent_kwargs = [{**args.env_kwargs, **kw} for kw in per_agent]
        self.n_agents = len(self.agent_kwargs)
        self.n_envs = n_envs
        self.num_envs = self.n_agents * n_envs
        self.stream_ids = _check_stream_ids(args.stream_ids, self.n_agents)
        self.autoreset = autoreset
        self.array_type = args.array_type
        self._vectorization_mode = vectorization_mode
        self._venvs: list[VectorEnv] = []
        try:
            for k, kw in enumerate(self.agent_kwargs):
                try:
                    # Autoresetting envs are stepped across rounds mid-episode: their episodes are
                    # recorded (the outermost wrapper, after the agent's own), so that a snapshot can
                    # rebuild them (fedrl_wrappers.snapshot).
                    own = {k: v for k, v in kw.items() if k != "wrappers"}
                    wrappers = [*(kw.get("wrappers") or []), *([EpisodeRecorder] if autoreset else [])]
                    venv = gym.make_vec(
                        env_id,
                        num_envs=n_envs,
                        vectorization_mode=vectorization_mode,
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                        wrappers=wrappers or None,
                        **own,
                    )
                except TypeError as err:
                    raise TypeError(f"agent_kwargs[{k}]: {err}") from err
                self._venvs.append(venv)
            spaces = {(repr(v.single_observation_space), repr(v.single_action_space)) for v in self._venvs}
            if len(spaces) != 1:
                raise ValueError(f"agent_kwargs must give every agent the same spaces, got {sorted(spaces)}")
        except BaseException:
            for venv in self._venvs:
                venv.close()
            raise
        first = self._venvs[0]
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        if isinstance(self.single_observation_space, gym.spaces.Dict | gym.spaces.Tuple):
            self.close()
            raise TypeError(f"{env_id}: Dict and Tuple observation spaces are not supported by FederatedVecEnv; flatten them "
                            "with gymnasium.wrappers.FlattenObservation, e.g. agent_kwargs=[{'wrappers': [FlattenObservation]}, ...]")
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        limits = {self._max_steps(v) for v in self._venvs}
        if len(limits) > 1 and not autoreset:
            self.close()
            raise ValueError("the fixed-horizon mode needs one episode limit (max_episode_steps) shared by all agents")
        limit = next(iter(limits)) if len(limits) == 1 else None
        self.horizon = None if limit is None else limit - 1
        self.metadata = dict(self.metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP if autoreset else AutoresetMode.DISABLED
        self.render_mode = None
        self._reset_done = False
        # The actions of the episodes in progress (autoreset: fedrl_wrappers.snapshot), by absolute step
        self._action_log: list[np.ndarray] = []
        self._log_base = 0
        self._episode_start = np.zeros(self.num_envs, dtype=np.int64)

    @staticmethod
    def _max_steps(venv: VectorEnv) -> int | None:
        spec = venv.get_attr("spec")[0]  # the sub-environments' spec (make_vec's own may differ)
        if spec is not None and spec.max_episode_steps is not None:
            return int(spec.max_episode_steps)
        return None

    @property
    def vectorization_mode(self) -> str:
        """``"sync"`` or ``"async"``: how every agent's Gymnasium vector env steps."""
        return self._vectorization_mode

    def _subset_kwargs(self) -> dict[str, Any]:
        return {"vectorization_mode": self._vectorization_mode}

    def _agent_seeds(self, seed: int) -> list[int]:
        keys = derive_keys(seed, torch.tensor(self.stream_ids))
        return [int(k) & _SEED_MASK for k in keys.tolist()]

    def _to_tensor(self, parts: list[np.ndarray], dtype: torch.dtype | None = None) -> Any:
        """The agents' parts as one batch: a tensor on ``device``, or (NumPy mode) an array."""
        if self.array_type == "numpy":
            out_np = np.concatenate(parts)
            return out_np if dtype is None else out_np.astype(torch.empty((), dtype=dtype).numpy().dtype, copy=False)
        out = torch.from_numpy(np.ascontiguousarray(np.concatenate(parts)))
        if dtype is not None:
            out = out.to(dtype)
        return out.to(self.device)

    @_fitted_to_observations
    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every agent's vector env; an int ``seed`` re-seeds agent ``i`` from ``(seed, stream_ids[i])``."""
        if self.closed:
            raise ValueError("this environment is closed; create a new one instead of resetting it")
        mask = _reset_mask(options, self.num_envs)
        if mask is not None and not mask.all():
            raise ValueError(
                "options['reset_mask'] must select every environment for the generic backend (it resets all agents' "
                "vector envs together); use autoreset=True for environments that reset on their own"
            )
        if mask is not None:
            options = {k: v for k, v in options.items() if k != "reset_mask"}  # type: ignore[union-attr]
        if isinstance(seed, list | tuple):
            if len(set(seed)) != 1:
                raise ValueError("seed must be one int for the whole batch (each agent derives its own stream)")
            seed = seed[0]
        seed = check_seed(seed)
        if seed is None and not self._reset_done:
            seed = self._seed if self._seed is not None else seed_from_entropy()
        if seed is not None:
            self._seed = seed
            # VectorEnv.np_random, as Gymnasium's reset(seed=) seeds it (the environments have their own)
            self._np_random, self._np_random_seed = seeding.np_random(seed % 2**64)
        seeds = self._agent_seeds(seed) if seed is not None else [None] * self.n_agents
        results = [venv.reset(seed=s, options=options) for venv, s in zip(self._venvs, seeds, strict=True)]
        self._reset_done = True
        self._start_logged_episodes(None)
        self._start_episode()
        obs = self._to_tensor([r[0] for r in results])
        return obs, _concat_infos([r[1] for r in results], self.n_envs)

    def _as_action_array(self, actions: Any) -> np.ndarray:
        space = self.single_action_space
        if isinstance(actions, torch.Tensor):
            if actions.device.type == "meta":  # no data to copy (torch would raise NotImplementedError)
                raise ValueError("actions must hold data: got a tensor on the meta device")
            if actions.dtype == torch.bfloat16:  # NumPy has no bfloat16
                actions = actions.float()
            arr = actions.detach().cpu().numpy()
        else:
            arr = np.asarray(actions)
        expected = (self.num_envs, *(space.shape or ()))
        # Complex numbers are numbers to NumPy, but casting them to a Box's dtype drops the imaginary part.
        if arr.dtype == object or arr.dtype.kind == "c" or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise TypeError(f"actions must be a real numeric array or tensor, got dtype {arr.dtype}")
        if arr.shape != expected:
            raise ValueError(f"actions must have shape {expected} (num_envs, *action_shape), got {arr.shape}")
        if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
            if not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"actions must be integers for {space}, got dtype {arr.dtype}")
            low = space.start if not isinstance(space, gym.spaces.MultiBinary) else 0
            high = low + space.n - 1 if isinstance(space, gym.spaces.Discrete) else None
            if isinstance(space, gym.spaces.MultiDiscrete):
                high = space.start + space.nvec - 1
            elif isinstance(space, gym.spaces.MultiBinary):
                high = 1
            if arr.size and (np.any(arr < low) or np.any(arr > high)):
                raise ValueError(f"actions must lie in {space}, got values in [{arr.min()}, {arr.max()}]")
            return arr.astype(space.dtype, copy=False)
        if isinstance(space, gym.spaces.Box):
            if arr.dtype == np.bool_:
                raise TypeError(f"actions must be real numbers for {space}, got dtype bool")
            # Finite values only; outside the bounds is the environment's business (Pendulum clips
            # the torque), as for the native families (TaskFamily.validate_action).
            arr = arr.astype(space.dtype, copy=False)
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"actions must be finite in {space.dtype} for {space}, got {int(np.sum(~np.isfinite(arr)))} non-finite values")
            return arr
        for row, a in enumerate(arr):
            if not space.contains(a):
                raise ValueError(f"actions[{row}] must be an element of {space}, got {a!r}")
        return arr

    @_fitted_to_observations
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step every agent's vector env with its rows of ``actions`` ``[num_envs, *action_shape]``."""
        self._check_steppable()
        if not self._reset_done:
            raise RuntimeError("call reset() before step()")
        arr = self._as_action_array(actions)  # all checks pass before any agent steps
        if self.autoreset:
            self._log_actions(arr)
        per_agent = arr.reshape(self.n_agents, self.n_envs, *arr.shape[1:])
        idle = self._idle_agents()
        results = [
            self._idle_step(i) if idle[i] else venv.step(per_agent[i]) for i, venv in enumerate(self._venvs)
        ]
        self._elapsed += 1
        if self.autoreset:
            self._start_logged_episodes(np.concatenate([np.asarray(r[2], bool) | np.asarray(r[3], bool) for r in results]))
        obs = self._to_tensor([r[0] for r in results])
        reward = self._to_tensor([np.asarray(r[1]) for r in results], torch.float32)
        terminated = self._to_tensor([np.asarray(r[2], dtype=bool) for r in results])
        truncated = self._to_tensor([np.asarray(r[3], dtype=bool) for r in results])
        info = _concat_infos([r[4] for r in results], self.n_envs)
        if "final_obs" in info:
            done_np = info["_final_obs"]
            rows = np.flatnonzero(done_np)
            if self.array_type == "numpy":
                final = obs.copy()
                final[rows] = np.stack(list(info["final_obs"][rows])).astype(obs.dtype, copy=False)
            else:
                final = obs.clone()
                final[torch.from_numpy(rows).to(self.device)] = torch.as_tensor(
                    np.stack(list(info["final_obs"][rows])), dtype=obs.dtype
                ).to(self.device)
            if self.autoreset:
                info["final_obs"] = final
                info["_final_obs"] = done_np if self.array_type == "numpy" else torch.from_numpy(done_np).to(self.device)
            else:
                # Fixed horizon: no reset is visible; the episode's last observation is returned.
                obs = final
                for key in ("final_obs", "_final_obs", "final_info", "_final_info"):
                    info.pop(key, None)
        if not self.autoreset:
            obs, reward, terminated = self._pad_finished(obs, reward, terminated)
        return obs, reward, terminated, truncated, info

    def _idle_agents(self) -> list[bool]:
        """Fixed-horizon mode: the agents all of whose episodes of this block have terminated.

        Their steps until the next reset are padding (the last observation, reward 0, terminated),
        so their vector envs are not stepped: a MuJoCo agent whose hoppers have all fallen costs
        nothing more. Whether an agent idles depends on its own episodes only.
        """
        finished = self._finished
        if self.autoreset or finished is None:
            return [False] * self.n_agents
        flags = finished if isinstance(finished, np.ndarray) else finished.cpu().numpy()
        return flags.reshape(self.n_agents, self.n_envs).all(-1).tolist()

    def _idle_step(self, agent: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """What stands in for an idle agent's step: its frozen observations (the padding replaces
        them, the reward and the flags anyway), no info."""
        rows = slice(agent * self.n_envs, (agent + 1) * self.n_envs)
        frozen = self._frozen_obs[rows]
        obs = frozen if isinstance(frozen, np.ndarray) else frozen.cpu().numpy()
        n = self.n_envs
        return obs, np.zeros(n, dtype=np.float32), np.ones(n, dtype=bool), np.zeros(n, dtype=bool), {}

    def agent_random_state(self, agent: int) -> list[dict[str, Any]]:
        """Agent ``agent``'s sub-environments' generator states (``np_random.bit_generator.state``,
        plain JSON data): what their next resets and steps draw from.

        :param agent: the agent's index
        """
        return [generator.bit_generator.state for generator in self._venvs[agent].get_attr("np_random")]

    def set_agent_random_state(self, agent: int, states: Sequence[dict[str, Any]]) -> None:
        """Give agent ``agent``'s sub-environments the generator states :meth:`agent_random_state` returned.

        :param agent: the agent's index
        :param states: one state per sub-environment
        :raise ValueError: for another number of states, or a state that is not a NumPy bit generator's
        """
        venv = self._venvs[agent]
        if len(states) != venv.num_envs:
            raise ValueError(f"agent {agent}: {len(states)} generator states for {venv.num_envs} sub-environments")
        try:
            generators = [generator_from_state(saved) for saved in states]
        except ValueError as err:
            raise ValueError(f"agent {agent}: {err}") from None
        venv.set_attr("np_random", generators)

    def random_state(self) -> dict[str, Any]:
        """Everything the agents' environments draw from next, as plain data: whether the first
        (seeded) reset happened, the seed, and every sub-environment's generator state
        (:meth:`agent_random_state`). With :meth:`set_random_state` on an env of the same id, agents
        and ``n_envs``, the next resets and steps are those this env would make — what a saved model
        needs to resume bitwise. Environments with randomness of their own besides ``np_random``
        (Atari's emulator: :attr:`exact_random_state` is false) continue differently.
        """
        return {
            "reset_done": bool(self._reset_done),
            "seed": self._seed,
            "np_random": [self.agent_random_state(i) for i in range(self.n_agents)] if self._reset_done else [],
        }

    def set_random_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`random_state` returned (an env not yet reset is left to its first, seeded reset).

        :raise ValueError: when the state is of another number of agents or sub-environments
        """
        if not isinstance(state, dict) or not {"reset_done", "seed", "np_random"} <= set(state):
            raise ValueError("state must be what random_state() returned (keys reset_done, seed, np_random)")
        if state["reset_done"] and len(state["np_random"]) != self.n_agents:
            raise ValueError(f"state holds {len(state['np_random'])} agents' generators, this env has {self.n_agents} agents")
        self._seed = state["seed"]
        self._reset_done = bool(state["reset_done"])
        if self._reset_done:
            for agent, states in enumerate(state["np_random"]):
                self.set_agent_random_state(agent, states)

    def snapshot(self) -> dict[str, Any]:
        """Everything these environments continue from, as plain data (see :mod:`fedrl_wrappers.snapshot`):
        with ``autoreset=True`` each sub-environment's current episode (the generator before its
        reset, the reset's arguments, the actions since), else only their generators
        (:meth:`random_state`: a fixed-horizon env starts every block with a reset). An env of the
        same id, agents and ``n_envs`` given it by :meth:`restore_snapshot` steps on as this one
        would, for environments whose randomness is ``np_random`` (not Atari's emulator)."""
        out = {"backend": "generic", "random_state": self.random_state(), "elapsed": int(self._elapsed)}
        if self.autoreset and self._reset_done:
            log, end = self._action_log, self._log_base + len(self._action_log)
            dtype = str(log[0].dtype) if log else str(np.dtype(self.single_action_space.dtype or np.float64))
            episodes = []
            for agent, venv in enumerate(self._venvs):
                records = []
                for j, record in enumerate(venv.get_attr("reset_record")):
                    row = agent * self.n_envs + j
                    actions = [log[t - self._log_base][row].tolist() for t in range(int(self._episode_start[row]), end)]
                    records.append({**record, "actions": actions, "action_dtype": dtype})
                episodes.append(records)
            out["episodes"] = episodes
        return out

    def _relog(self, episodes: list[list[dict[str, Any]]]) -> None:
        """The action log of restored episodes: each row's actions end at the current step."""
        rows = [record for records in episodes for record in records]
        length = max((len(r["actions"]) for r in rows), default=0)
        dtype = np.dtype(rows[0]["action_dtype"]) if rows else np.float64
        shape = tuple(self.single_action_space.shape or ())
        log = [np.zeros((self.num_envs, *shape), dtype=dtype) for _ in range(length)]
        self._episode_start = np.empty(self.num_envs, dtype=np.int64)
        for row, record in enumerate(rows):
            k = len(record["actions"])
            self._episode_start[row] = length - k
            for t, action in enumerate(record["actions"], length - k):
                log[t][row] = np.asarray(action, dtype=dtype)
        self._action_log, self._log_base = log, 0

    def _log_actions(self, actions: np.ndarray) -> None:
        """Keep a vector step's actions (one copy of the batch) for the snapshots of the episodes in
        progress, and forget those of episodes that ended."""
        log = self._action_log
        log.append(np.array(actions, copy=True))
        starts = self._episode_start
        oldest = int(starts.min())
        if oldest - self._log_base > 64:  # drop what no episode in progress needs, now and then
            del log[: oldest - self._log_base]
            self._log_base = oldest

    def _start_logged_episodes(self, done: np.ndarray | None) -> None:
        """The rows whose episodes ended in the last step (all, after a reset) begin at the next step."""
        if not self.autoreset:
            return
        now = self._log_base + len(self._action_log)
        if done is None:
            self._action_log, self._log_base = [], now
            self._episode_start = np.full(self.num_envs, now, dtype=np.int64)
        else:
            self._episode_start[done] = now

    def restore_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Continue from what :meth:`snapshot` returned (replaying each sub-environment's episode).

        :raise ValueError: for a snapshot of another backend or layout
        """
        if not isinstance(snapshot, dict) or snapshot.get("backend") != "generic":
            raise ValueError("snapshot must be what a generic-backend FederatedVecEnv's snapshot() returned")
        self.set_random_state(snapshot["random_state"])
        episodes = snapshot.get("episodes")
        if episodes is not None:
            if not self.autoreset:
                raise ValueError("the snapshot holds episodes in progress; restore it into an env with autoreset=True")
            if len(episodes) != self.n_agents or any(len(e) != venv.num_envs for e, venv in zip(episodes, self._venvs, strict=True)):
                raise ValueError(f"the snapshot's episodes are laid out otherwise than {self.n_agents} agents x {self.n_envs} envs")
            for venv, records in zip(self._venvs, episodes, strict=True):
                venv.set_attr("pending_replay", list(records))
                venv.call("apply_replay")
            self._relog(episodes)
        self._start_episode()
        self._elapsed = int(snapshot["elapsed"])

    @property
    def exact_random_state(self) -> bool:
        """Whether :meth:`random_state` holds all of the environments' randomness: false for Atari
        (ALE's emulator keeps a generator of its own, which Gymnasium does not expose as ``np_random``)."""
        spec = self._venvs[0].get_attr("spec")[0]
        entry_point = getattr(spec, "entry_point", "")
        return not (isinstance(entry_point, str) and entry_point.startswith("ale_py"))

    def close_extras(self, **kwargs: Any) -> None:
        for venv in self._venvs:
            venv.close()

    @property
    def agent_envs(self) -> list[VectorEnv]:
        """The Gymnasium vector env of each agent (row block ``i`` of the flat batch)."""
        return self._venvs
