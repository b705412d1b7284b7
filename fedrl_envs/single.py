"""The single-agent Gymnasium environment of a family: its kernels at batch 1 (or on NumPy scalars)."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Generic

import gymnasium as gym
import numpy as np
import torch

from fedrl_envs.family import P, TaskFamily
from fedrl_envs.params import _one_numpy, params_to_numpy, stack_params
from fedrl_envs.rng import (
    OneStream,
    RandomStreams,
    derive_keys,
)
from fedrl_envs.validation import _as_state_tensor, _signed_actions, check_int


class FamilyEnv(gym.Env, Generic[P]):
    """A single-agent ``gymnasium.Env`` over a :class:`TaskFamily` kernel.

    When the family has ``numpy_kernels``, its kernels run on this environment's NumPy state (no
    batch axis) and NumPy-scalar parameters (:func:`params_to_numpy`): a step costs microseconds.
    Otherwise they run on a torch batch of one. Either way :attr:`state` is a torch tensor, the
    observations are NumPy (an ``int`` for ``Discrete``), the starts are those of agent 0 of a
    vector env seeded alike, and actions are checked by :meth:`TaskFamily.validate_action`'s rules
    and messages.

    Subclasses set ``family`` and document the task arguments in their docstring. The constructor
    takes ``family.make_params``'s arguments, then ``render_mode``: each subclass gets that
    signature (``inspect.signature(GridWorldEnv)``, ``help``) from the family, so the task
    arguments and their defaults are written once, in ``make_params``.
    """

    family: ClassVar[TaskFamily]
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        family = cls.__dict__.get("family")
        if family is not None:
            task = inspect.signature(family.make_params)
            render_mode = inspect.Parameter(
                "render_mode", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation="str | None"
            )
            cls.__signature__ = task.replace(
                parameters=[*task.parameters.values(), render_mode], return_annotation=inspect.Signature.empty
            )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            task_kwargs = inspect.signature(type(self)).bind(*args, **kwargs).arguments
        except TypeError as err:
            raise TypeError(f"{type(self).__name__}: {err}") from None
        render_mode = task_kwargs.pop("render_mode", None)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.params = self.family.make_params(**task_kwargs)
        self._batch_params = stack_params([self.params])
        self.observation_space = self.family.observation_space(self.params)
        self.action_space = self.family.action_space(self.params)
        self._horizon = self.family.horizon(self.params)
        # The NumPy fast path (TaskFamily.numpy_kernels): the same kernels on one environment's
        # NumPy state, parameters as NumPy scalars/arrays; None: a torch batch of one.
        self._numpy_params = params_to_numpy(self.params) if self.family.numpy_kernels else None
        space = self.action_space
        self._discrete_actions = (
            (int(space.start), int(space.start + space.n - 1)) if isinstance(space, gym.spaces.Discrete) else None
        )
        self._discrete_obs = isinstance(self.observation_space, gym.spaces.Discrete)
        self._streams: RandomStreams | OneStream | None = None
        # NumPy path: one state without a batch axis (array or NumPy scalar); torch path: [1, ...]
        self._state: Any = None
        self._t = 0

    # The state is exposed so tests and planners can put the env into any state.
    @property
    def state(self) -> torch.Tensor:
        """Current kernel state as a tensor (batch of one, first axis dropped; a copy on the NumPy path)."""
        if self._state is None:
            raise RuntimeError("call reset() before reading the state")
        if self._numpy_params is not None:
            return torch.from_numpy(np.array(self._state))
        return self._state[0]

    def set_state(self, state: Any, t: int = 0) -> Any:
        """Put the environment into ``state`` at time index ``t``; returns the observation.

        ``state`` is one kernel state (a cell index for the gridworld, a position for arc
        navigation); it is validated, never clipped or cast with loss.
        """
        template = self.family.reset(self._batch_params, torch.zeros(1, self.family.reset_noise_dim))
        state_t = _as_state_tensor(state, template[0], "state")
        t = check_int("t", t, 0)
        state_t = state_t.reshape(template.shape)
        self.family.validate_state(state_t, self._batch_params)
        self._state = state_t if self._numpy_params is None else _one_numpy(state_t[0])
        self._t = t
        return self._obs()

    def _obs(self) -> Any:
        if self._numpy_params is None:
            obs = self.family.observe(self._state, self._batch_params)[0]
            if isinstance(self.observation_space, gym.spaces.Discrete):
                return int(obs)
            return obs.cpu().numpy().astype(self.observation_space.dtype)
        obs = self.family.observe(self._state, self._numpy_params)
        if self._discrete_obs:
            return int(obs)
        return np.array(obs, dtype=self.observation_space.dtype)  # a copy: never a view of the state

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None or self._streams is None:
            key_seed = seed if seed is not None else int(self.np_random.integers(2**62))
            # Same keys as agent 0 of a vector env seeded alike, so the two produce the same starts.
            keys = derive_keys(key_seed, torch.arange(1))
            self._streams = RandomStreams(keys) if self._numpy_params is None else OneStream(keys[0])
        if self._numpy_params is None:
            noise = self._streams.uniform((1, self.family.reset_noise_dim)).reshape(1, -1)
            self._state = self.family.reset(self._batch_params, noise)
        else:
            noise = self._streams.uniform_float32(self.family.reset_noise_dim)
            self._state = self.family.reset(self._numpy_params, noise)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if self._numpy_params is None:
            action_t = self._action_tensor(action)
            self._state, reward, terminated = self.family.step(self._state, action_t, self._batch_params)
            reward, terminated = reward[0], terminated[0]
        else:
            self._state, reward, terminated = self.family.step(self._state, self._numpy_action(action), self._numpy_params)
        self._t += 1
        truncated = self._horizon is not None and self._t >= self._horizon + 1
        return self._obs(), float(reward), bool(terminated), bool(truncated), {}

    def _numpy_action(self, action: Any) -> Any:
        """One action for the NumPy kernels: a Python int (discrete) or a NumPy array (boxes).

        The common valid actions (ints in range, finite float arrays of the right shape) are
        accepted here in well under a microsecond; everything else goes through
        :meth:`_action_tensor`, whose checks and error messages are the torch path's.
        """
        bounds = self._discrete_actions
        if bounds is not None:
            if type(action) is int or isinstance(action, np.integer):  # not bool: type(True) is bool
                if bounds[0] <= action <= bounds[1]:
                    return int(action)
            return int(self._action_tensor(action)[0])
        if (
            type(action) is np.ndarray
            and action.dtype.kind == "f"
            and action.shape == self.action_space.shape
            and np.isfinite(action).all()
        ):
            return action
        return self._action_tensor(action)[0].numpy()

    def _action_tensor(self, action: Any) -> torch.Tensor:
        """One action as a batch-of-one tensor, validated by the family (never clipped or wrapped)."""
        if isinstance(action, torch.Tensor):
            if action.device.type == "meta":  # no data to copy (torch would raise NotImplementedError)
                raise ValueError("action must hold data: got a tensor on the meta device")
            action_t = action.detach().cpu()
        else:
            arr = np.asarray(action)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"action must be a number or numeric array, got {type(action).__name__}")
            action_t = torch.as_tensor(arr)
        action_t = _signed_actions(action_t, "action")
        if tuple(action_t.shape) != tuple(self.action_space.shape):
            raise ValueError(
                f"action must have shape {tuple(self.action_space.shape)} (one action of {self.action_space}), "
                f"got shape {tuple(action_t.shape)}"
            )
        action_t = action_t.reshape((1, *self.action_space.shape))
        self.family.validate_action(action_t, self._batch_params)
        return action_t

    def render(self) -> Any:
        """The current frame: a text grid/summary (``"ansi"``) or an ``uint8`` image (``"rgb_array"``)."""
        if self.render_mode == "ansi":
            return self._render_ansi()
        if self.render_mode == "rgb_array":
            return self._render_rgb_array()
        return None

    def _render_rgb_array(self) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} has no rgb_array rendering")

    def _render_ansi(self) -> str:
        return f"{type(self).__name__}(state={self.state.tolist()}, t={self._t})"
