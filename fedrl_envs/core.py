"""The contract every fedrl task family implements, and the two environments built on it.

A *family* is one parameterized MDP written once as pure batched functions (torch, or the small
namespace of :mod:`fedrl_envs.ops`, which also runs them on one NumPy environment); a *task* is one
value of its frozen parameter dataclass; a heterogeneous population is the same dataclass with its
tensor fields stacked along a leading agent axis (:func:`stack_params`). The single-agent
:class:`FamilyEnv` and the native vector env :class:`FamilyVectorEnv` both call the family's
kernels, so there is exactly one copy of the dynamics. Time limits and autoreset live here, in one
place, not in the kernels.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from fedrl_envs.ops import numpy_batch
from fedrl_envs.rng import (
    _GOLDEN,
    OneStream,
    RandomStreams,
    derive_keys,
    seed_from_entropy,
    uniform32_of_finalizer_input,
    uniform32_of_finalizer_input_numpy,
)
from fedrl_envs.threads import with_fitted_threads

__all__ = [
    "TaskFamily",
    "FamilyEnv",
    "FamilyVectorEnv",
    "stack_params",
    "repeat_params",
    "params_to",
    "params_to_numpy",
    "index_params",
    "check_int",
    "check_seed",
    "check_device",
    "check_array_type",
    "check_kernels",
    "alive_mask",
]

P = TypeVar("P")


#: the most environments per agent of a vector env: beyond it a batch's indices and states no
#: longer fit memory (an unbounded n_envs overflowed int64 inside torch, or exhausted memory)
MAX_ENVS = 2**24


def check_int(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]``; ``TypeError``/``ValueError`` naming ``name`` otherwise.

    Accepts Python, NumPy and single-element integer torch integers; rejects bools and floats (an
    argument is never silently truncated or clipped).
    """
    if isinstance(value, bool | np.bool_) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < low or (high is not None and value > high):
        allowed = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return int(value)


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """An optional seed argument: ``None`` (draw one later) or an ``int`` (:func:`check_int`).

    Any integer from ``-2**63`` up is a seed: :func:`fedrl_envs.derive_keys` wraps it to int64.

    :param seed: the argument to check
    :param name: the argument's name, for the error message
    """
    return None if seed is None else check_int(name, seed, -(2**63))


def alive_mask(terminated: torch.Tensor) -> torch.Tensor:
    """Which steps of fixed-horizon episodes really happened: ``[..., T]`` bool.

    Step ``t`` is alive when no step before it terminated (the terminating step itself is alive:
    its action was taken and its reward earned). This is the one definition of the episode mask;
    rollouts that stop stepping an episode, or pad it after termination, all derive it here.

    :param terminated: termination flag of every step ``[..., T]`` (bool or 0/1)
    """
    done = terminated.to(torch.bool)
    alive = torch.ones_like(done)
    # families that never terminate (arc navigation, Pendulum) skip the scan: one reduction instead
    if done.shape[-1] > 1 and bool(done[..., :-1].any()):
        alive[..., 1:] = (~done[..., :-1]).to(torch.int64).cumprod(-1).to(torch.bool)
    return alive


def check_device(device: Any, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``; ``ValueError`` naming ``name`` for an unknown or absent device."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{name} must name a torch device such as 'cpu' or 'cuda:0', got {device!r}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={str(dev)!r} but CUDA is not available on this machine")
    return dev


#: what a vector env may return: torch tensors on its device, or NumPy arrays
ARRAY_TYPES = ("torch", "numpy")


def check_array_type(array_type: Any, name: str = "array_type") -> str:
    """``array_type`` as one of :data:`ARRAY_TYPES`; ``TypeError``/``ValueError`` naming ``name`` otherwise.

    :param array_type: ``"torch"`` or ``"numpy"``
    :param name: the argument's name, for the error message
    """
    if not isinstance(array_type, str):
        raise TypeError(f"{name} must be one of {ARRAY_TYPES} (a str), got {type(array_type).__name__}")
    if array_type not in ARRAY_TYPES:
        raise ValueError(f"{name} must be one of {ARRAY_TYPES}, got {array_type!r}")
    return array_type


#: accepted values of a vector env's ``kernels``
KERNELS = ("auto", "torch", "numpy", "numba")


def check_kernels(kernels: Any, family: Any, device: torch.device, name: str = "kernels") -> str:
    """The kernels that run, from ``kernels`` (one of :data:`KERNELS`), checked against the family and the device.

    ``"auto"`` resolves to the fastest kernels with bitwise the torch kernels' numbers: ``"numba"``
    on the CPU for a family with a fused step (``fused_kernels``) when Numba can be imported,
    ``"torch"`` otherwise (``"numpy"`` is never chosen: its ``sin``/``cos`` may differ by an ulp).
    ``"numpy"`` needs the CPU and a family with NumPy kernels; ``"numba"`` the CPU, a family with a
    fused step and Numba installed.
    """
    if kernels not in KERNELS:
        raise ValueError(f'{name} must be "auto", "torch", "numpy" or "numba", got {kernels!r}')
    if kernels == "auto":
        from fedrl_envs.fused import numba_available

        fused = device.type == "cpu" and getattr(family, "fused_kernels", False)
        return "numba" if fused and numba_available() else "torch"
    if kernels != "torch" and device.type != "cpu":
        raise ValueError(f'{name}="{kernels}" runs the kernels on the CPU; got device {device}')
    if kernels == "numpy" and not getattr(family, "numpy_kernels", False):
        raise ValueError(
            f'{name}="numpy" needs a family whose kernels are written against fedrl_envs.ops '
            f"(numpy_kernels = True); {type(family).__name__} has torch kernels only"
        )
    if kernels == "numba":
        if not getattr(family, "fused_kernels", False):
            raise ValueError(
                f'{name}="numba" needs a family with a fused step (fused_kernels = True: fedrl/CartPole-v0); '
                f"{type(family).__name__} has none"
            )
        from fedrl_envs.fused import _numba

        _numba()  # ImportError with the install command when Numba is missing
    return kernels


def _reset_mask(options: dict[str, Any] | None, num_envs: int) -> np.ndarray | None:
    """Gymnasium's ``options["reset_mask"]`` (bool NumPy array ``[num_envs]``, or a bool tensor), checked."""
    if not options or "reset_mask" not in options:
        return None
    mask = options["reset_mask"]
    mask = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else mask
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        raise TypeError(f"options['reset_mask'] must be a bool NumPy array, got {type(mask).__name__} of dtype {getattr(mask, 'dtype', None)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"options['reset_mask'] must have shape ({num_envs},), got {mask.shape}")
    if not mask.any():
        raise ValueError("options['reset_mask'] must be true for at least one environment")
    return mask


def _tensor_fields(params: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(params) if isinstance(getattr(params, f.name), torch.Tensor)]


class derived:  # noqa: N801 (used as a decorator, like functools.cached_property)
    """A parameter dataclass's quantity derived from its fields, computed on first use and kept.

    Like :func:`functools.cached_property` without its lock (a lock per lookup costs more than a
    small kernel operation): the value lands in the instance's ``__dict__``, where later lookups find it first.
    Parameter dataclasses are frozen and their tensors never written in place, so the value
    never goes stale; :func:`dataclasses.replace` builds a new object that derives it afresh.
    """

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self.compute(obj)
        obj.__dict__[self.name] = value
        return value


def stack_params(tasks: Sequence[P]) -> P:
    """Stack task parameters along a new leading agent axis.

    Tensor fields are stacked; every other field (grid size, horizon, ...) must be equal across
    tasks because it fixes shapes or episode length for the whole batch.

    :param tasks: non-empty sequence of parameter dataclasses of one family
    :return: one dataclass whose tensor fields have a leading axis of length ``len(tasks)``
    """
    if len(tasks) == 0:
        raise ValueError("tasks must be a non-empty sequence of task parameters")
    first = tasks[0]
    if any(type(t) is not type(first) for t in tasks):
        raise TypeError("tasks must all be parameters of the same family")
    tensor_names = _tensor_fields(first)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        values = [getattr(t, f.name) for t in tasks]
        if f.name in tensor_names:
            changes[f.name] = torch.stack(values)
        elif any(v != values[0] for v in values):
            raise ValueError(
                f"field {f.name!r} must be equal for every task in one batch, got {sorted(set(values))}"
            )
    return dataclasses.replace(first, **changes)


def repeat_params(params: P, repeats: int) -> P:
    """Repeat each row of stacked parameters ``repeats`` times (agent-major flat batch)."""
    changes = {n: getattr(params, n).repeat_interleave(repeats, dim=0) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def index_params(params: P, index: Any) -> P:
    """Select rows of stacked parameters (any torch index along the leading axis)."""
    changes = {n: getattr(params, n)[index] for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def _gather_params(params: P, rows: torch.Tensor) -> P:
    """:func:`index_params` for non-negative int64 rows ``[R]`` (``index_select``: half the cost)."""
    changes = {n: getattr(params, n).index_select(0, rows) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def params_to(params: P, device: torch.device | str) -> P:
    """Move every tensor field to ``device``."""
    changes = {n: getattr(params, n).to(device) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def _signed_actions(action: torch.Tensor, name: str) -> torch.Tensor:
    """Unsigned actions wider than a byte as int64 (torch cannot compare uint16/32/64 tensors on CPU).

    :raise ValueError: for a value above the int64 range, naming ``name``
    """
    if action.dtype not in (torch.uint16, torch.uint32, torch.uint64):
        return action
    if action.dtype == torch.uint64 and action.numel():  # the one that can exceed int64 (compared in NumPy: torch cannot)
        top = int(action.cpu().numpy().max())
        if top > torch.iinfo(torch.int64).max:
            raise ValueError(f"{name} must fit in int64, got {top}")
    return action.to(torch.int64)


def params_to_numpy(params: P) -> P:
    """The same parameters with every tensor field as NumPy: 0-d tensors as NumPy scalars, others as arrays.

    These are the parameters of the NumPy kernels (:mod:`fedrl_envs.ops`); the values and dtypes are
    the tensors' (float32 stays float32).
    """
    changes = {n: _one_numpy(getattr(params, n)) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def _one_numpy(value: torch.Tensor) -> Any:
    """A CPU copy of ``value`` as NumPy: a NumPy scalar when 0-d, else an array."""
    arr = value.detach().cpu().numpy().copy()
    return arr[()] if arr.ndim == 0 else arr


def _as_state_tensor(state: Any, template: torch.Tensor, name: str) -> torch.Tensor:
    """``state`` as a tensor of ``template``'s dtype and shape, refusing lossy casts."""
    state_t = state.detach() if isinstance(state, torch.Tensor) else torch.as_tensor(np.asarray(state))
    if tuple(state_t.shape) != tuple(template.shape):
        raise ValueError(f"{name} must have shape {tuple(template.shape)}, got {tuple(state_t.shape)}")
    if not template.is_floating_point() and (state_t.is_floating_point() or state_t.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers (dtype {template.dtype}), got dtype {state_t.dtype}")
    return state_t.to(device=template.device, dtype=template.dtype).clone()


def components_layout(state: torch.Tensor) -> torch.Tensor:
    """``state`` ``[N, ..., d]`` laid out as its components kernels compute with (a ``[d, N, ...]`` array).

    What :meth:`fedrl_envs.ops.TorchOps.stack` returns: elementwise operations of such states keep
    the layout, and :meth:`~fedrl_envs.ops.TorchOps.unbind` gives contiguous components, on which
    torch's kernels run vectorized. The values are unchanged (a copy unless already so laid out).
    """
    if state.dim() < 2:
        return state
    return state.movedim(-1, 0).contiguous().movedim(0, -1)


def fresh_observation(obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """``obs`` as a C-contiguous tensor of its own (a copy when it shares memory with ``state``).

    Kernels keep a state's components contiguous (``[N, d]`` views of ``[d, N]`` arrays, see
    :meth:`fedrl_envs.ops.TorchOps.stack`); what a caller receives is an ordinary row-major batch.
    """
    if obs.data_ptr() == state.data_ptr():
        return obs.clone(memory_format=torch.contiguous_format)
    return obs.contiguous()


class TaskFamily(ABC, Generic[P]):
    """A parameterized MDP: batched kernels plus its catalogue of tasks.

    Kernels act on a flat batch ``[N, ...]`` with parameters whose tensor fields have leading
    size ``N`` (use :func:`repeat_params` to expand per-agent parameters to per-env rows).
    """

    #: registered Gymnasium id, e.g. ``"fedrl/GridWorld-v0"``
    env_id: ClassVar[str]
    #: number of uniform numbers :meth:`reset` consumes per environment
    reset_noise_dim: ClassVar[int]
    #: whether :meth:`reset`, :meth:`step` and :meth:`observe` are written against :mod:`fedrl_envs.ops`
    #: (``xp = array_ops(state)``), so that they also run one environment on NumPy: :class:`FamilyEnv`
    #: then steps on NumPy scalars (a few microseconds); a family with torch-only kernels leaves it
    #: ``False`` and its single env steps a torch batch of one
    numpy_kernels: ClassVar[bool] = False
    #: whether :meth:`reset` and :meth:`observe` read their ``params`` argument; a family whose
    #: start states and observations are the same for every task sets it ``False``, and the
    #: native vector env's autoreset then passes ``None`` instead of gathering the task
    #: parameters of the rows that reset (one gather per parameter field and step)
    reset_reads_params: ClassVar[bool] = True
    #: whether the kernels compute on the state's components (``xp.unbind(state)``, then
    #: ``xp.stack``): the native vector env then lays every start and ``set_state`` state out as
    #: contiguous components (:func:`components_layout`), on which torch's elementwise kernels run
    #: vectorized; a family that combines whole ``[N, d]`` rows with per-row data (a goal, a move
    #: table) keeps the row layout
    state_as_components: ClassVar[bool] = False
    #: whether the family has a fused CPU step (:mod:`fedrl_envs.fused`, ``kernels="numba"``): then
    #: it defines ``fused_params(params) -> ndarray`` (its rows' parameters packed for the loop) and
    #: ``fused_step(...)``, one compiled call for a whole step of the native vector env (transition,
    #: observations, time limit, resets of the ended rows), bitwise the torch path's values
    #: (:meth:`FamilyVectorEnv._step_fused` passes its arguments)
    fused_kernels: ClassVar[bool] = False

    # --- kernels -------------------------------------------------------------------------------
    @abstractmethod
    def reset(self, params: P, noise: torch.Tensor) -> torch.Tensor:
        """Initial states ``[N, ...]`` from uniform noise ``[N, reset_noise_dim]`` in [0, 1)."""

    @abstractmethod
    def step(
        self, state: torch.Tensor, action: torch.Tensor, params: P
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One transition of a batch: ``(next_state, reward, terminated)``."""

    def observe(self, state: torch.Tensor, params: P) -> torch.Tensor:
        """Observation of a state (the state itself unless a family says otherwise)."""
        return state

    def fast_step(self, state: torch.Tensor, action: torch.Tensor, params: P) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`step`, or a compiled equivalent with bitwise the same values where the family has one
        and it applies (CartPole on the CPU with Numba installed); what the algorithms' rollouts call."""
        return self.step(state, action, params)

    def compiled_transition(self, params: P, rows: int) -> tuple[Any, tuple[Any, ...]] | None:
        """The transition of one environment as a Numba function, for compiled policy rollouts
        (``FastMlpPolicy(kernels="numba")``, :mod:`fedrl_algos.policies.mlp_compiled`), or ``None``.

        A family that has one returns ``(transition, data)``: ``transition(state, i, action, row,
        data) -> (reward, terminated)`` moves ``state[i]`` (a float32 ``[N, d]`` array whose rows
        are also the observations) in place, with the task parameters of batch row ``row`` read
        from ``data`` (NumPy arrays and scalars packed from ``params``, ``rows`` batch rows), with
        bitwise the values of :meth:`step`. ``None`` (the default) keeps the torch rollout.
        """
        return None

    # --- spaces and tasks ----------------------------------------------------------------------
    @abstractmethod
    def observation_space(self, params: P) -> gym.Space:
        """Observation space of one environment."""

    @abstractmethod
    def action_space(self, params: P) -> gym.Space:
        """Action space of one environment."""

    @abstractmethod
    def horizon(self, params: P) -> int | None:
        """Last time index ``H`` of an episode (``H + 1`` steps), or ``None`` for no fixed limit."""

    @abstractmethod
    def make_params(self, **kwargs: Any) -> P:
        """Validated task parameters from ``gym.make`` keyword arguments."""

    @property
    @abstractmethod
    def train_tasks(self) -> list[P]:
        """The training tasks of the paper's experiments, in order (``agent=k`` picks task k)."""

    @property
    def heldout_tasks(self) -> list[P]:
        """Tasks held out of training (for few-shot evaluation); empty unless a family has them."""
        return []

    def validate_action(self, action: torch.Tensor, params: P) -> None:
        """Raise ``ValueError`` unless ``action`` is a valid batch of actions."""
        # The space is built once per parameter object and kept on it (building a Gymnasium space
        # costs more than checking a batch of a thousand actions).
        cache = getattr(params, "__dict__", None)
        space = None if cache is None else cache.get("_validation_action_space")
        if space is None:
            space = self.action_space(params)
            if cache is not None:
                cache["_validation_action_space"] = space
        if isinstance(space, gym.spaces.Discrete):
            if action.is_floating_point() or action.is_complex() or action.dtype == torch.bool:
                raise TypeError(f"action must be an integer tensor, got dtype {action.dtype}")
            low, high = int(space.start), int(space.start + space.n - 1)
            # One reduction (min and max together) for valid batches; the mask only to report.
            lowest, highest = torch.aminmax(action) if action.numel() else (torch.tensor(low), torch.tensor(high))
            if int(lowest) < low or int(highest) > high:
                invalid = (action < low) | (action > high)
                bad = action[invalid]
                more = f" (and {bad.numel() - 1} more invalid actions)" if bad.numel() > 1 else ""
                raise ValueError(f"action must be an int in [{low}, {high}], got {int(bad[0])}{more}")
        elif isinstance(space, gym.spaces.Box):
            # Shape and finiteness only: what happens outside the bounds is the family's dynamics
            # (Pendulum clips the torque, as Gymnasium's does).
            if action.is_complex() or action.dtype == torch.bool:
                raise TypeError(f"action must be a real-valued tensor, got dtype {action.dtype}")
            if tuple(action.shape[1:]) != tuple(space.shape):
                raise ValueError(f"action must have shape (N, *{tuple(space.shape)}), got {tuple(action.shape)}")
            if action.is_floating_point() and not bool(torch.isfinite(action).all()):
                bad = action[~torch.isfinite(action)]
                raise ValueError(f"action must be finite, got {float(bad[0])} ({bad.numel()} non-finite values)")

    def validate_state(self, state: torch.Tensor, params: P) -> None:
        """Raise ``ValueError`` unless ``state`` is a batch of valid kernel states (no check by default)."""

    def make_env(self, task: P | None = None, **kwargs: Any) -> gym.Env:
        """``gym.make`` the family's id for one task (parameters or keyword arguments)."""
        if task is not None:
            kwargs = {**self.task_kwargs(task), **kwargs}
        return gym.make(self.env_id, **kwargs)

    @abstractmethod
    def task_kwargs(self, task: P) -> dict[str, Any]:
        """The ``gym.make`` keyword arguments that recreate ``task``."""

    def describe_task(self, task: P) -> str:
        """Short human-readable description of a task (used by ``fedrl envs``)."""
        return ", ".join(f"{k}={v}" for k, v in self.task_kwargs(task).items())


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


def _vector_env_work(env: Any, *args: Any, **kwargs: Any) -> tuple[int, int, torch.device]:
    """The work of a vector env call: ``num_envs`` rows of elementwise kernels on the env's device.

    A fused step (``kernels="numba"``) is one serial compiled pass around two vectorized torch
    calls (``cos``, ``sin``); a second thread would speed those up by a few percent of the step on a
    quiet machine and stall them on a busy one, so it runs on one thread at any size."""
    return (1 if env.kernels == "numba" else env.num_envs), 1, env.device


#: a vector env method run with the intra-op threads fitted to its batch (:mod:`fedrl_envs.threads`)
fitted_to_envs = with_fitted_threads(_vector_env_work)


class FamilyVectorEnv(VectorEnv):
    """Native batched environment: ``n_agents × n_envs`` copies of a family on a torch device.

    Row ``i * n_envs + j`` is agent ``i``'s environment ``j`` (agent-major). Every agent has its
    own task parameters and its own random stream, so an agent's trajectories depend neither on
    the other agents nor on where the batch runs. Observations, rewards and flags are torch
    tensors on ``device`` (``array_type="torch"``) or NumPy arrays (``array_type="numpy"``:
    observations in the observation space's dtype, rewards ``float32``, flags ``bool``, infos
    NumPy too), and never views of the internal state; the kernels run on ``device`` either way.
    Actions may be torch tensors or NumPy arrays in both. Autoreset is ``SAME_STEP``:
    when an episode ends, the returned observation is already the first of the next episode and
    ``info["final_obs"]`` (a tensor like the observations, meaningful where the mask
    ``info["_final_obs"]`` is true) holds the last observation of the finished one;
    ``info["final_info"]`` is ``{}`` (the kernels return no info) with mask ``info["_final_info"]``.
    An agent's stream advances only when one of its own episodes ends.

    This is also the ``vector_entry_point`` of every registered family, where all environments
    share one task (``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")``).

    :param family: the task family
    :param tasks: per-agent task parameters: a list, stacked parameters, or one task's parameters
    :param n_envs: environments per agent (1 to ``MAX_ENVS`` = 2**24)
    :param device: torch device of the whole batch
    :param seed: seed of the agents' random streams (drawn at random when ``None``); agent ``i``'s
        stream is keyed by ``(seed, i)``, so the single env seeded alike draws agent 0's
    :param autoreset: ``False`` gives the fixed-horizon mode (``AutoresetMode.DISABLED``): no
        reset until :meth:`reset`, and steps after the last one continue from the final states
        with ``truncated`` still true; ``reset(options={"reset_mask": mask})`` resets only the
        rows of ``mask``, as in Gymnasium's vector envs
    :param array_type: ``"torch"`` (tensors on ``device``) or ``"numpy"`` (NumPy arrays, for
        NumPy libraries such as Gymnasium's vector wrappers)
    :param kernels: ``"auto"`` (default): ``"numba"`` where it applies (a family with a fused step on
        the CPU, Numba installed), else ``"torch"``; the attribute ``kernels`` holds the choice.
        ``"torch"``: the family's step kernel runs on torch tensors; ``"numpy"``: on the CPU, for a family with NumPy kernels, it runs on NumPy views of the same
        memory (NumPy operations cost about half of torch's), with bitwise the same transitions for
        the gridworld and arc navigation and, for CartPole and Pendulum, transitions one float32 ulp
        apart wherever NumPy and torch round ``sin``/``cos`` differently (about 5% of arguments);
        starts, resets and the random streams are the same in both; ``"numba"``: on the CPU, for a
        family with a fused step (CartPole), each step is one compiled pass (:mod:`fedrl_envs.fused`,
        Numba needed) with bitwise the torch path's values
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        family: TaskFamily,
        tasks: Sequence[Any] | Any,
        n_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        autoreset: bool = True,
        array_type: str = "torch",
        kernels: str = "auto",
    ) -> None:
        n_envs = check_int("n_envs", n_envs, 1, MAX_ENVS)
        seed = check_seed(seed)
        self.array_type = check_array_type(array_type)
        self.family = family
        self.device = check_device(device)
        self.kernels = check_kernels(kernels, family, self.device)
        if isinstance(tasks, Sequence):
            agent_params = stack_params(list(tasks))
        elif _is_single_task(family, tasks):
            agent_params = stack_params([tasks])  # one task's parameters: one agent
        else:
            agent_params = tasks
        self.agent_params = params_to(agent_params, self.device)
        self.n_agents = int(getattr(self.agent_params, _tensor_fields(self.agent_params)[0]).shape[0])
        self.n_envs = int(n_envs)
        self.num_envs = self.n_agents * self.n_envs
        self.params = repeat_params(self.agent_params, self.n_envs)
        one_task = index_params(self.agent_params, 0)
        self.single_observation_space = family.observation_space(one_task)
        self.single_action_space = family.action_space(one_task)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.horizon = family.horizon(one_task)
        self.autoreset = autoreset
        self.metadata = dict(self.metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP if autoreset else AutoresetMode.DISABLED
        self.render_mode = None
        self.closed = False
        self._seed = seed
        self.streams = self._make_streams(seed)
        self._state: torch.Tensor | None = None
        self._t = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """``SAME_STEP`` (``autoreset=True``) or ``DISABLED`` (the fixed-horizon mode), as ``metadata["autoreset_mode"]``."""
        return self.metadata["autoreset_mode"]

    def _make_streams(self, seed: int | None) -> RandomStreams:
        if seed is None:
            seed = seed_from_entropy()
        return RandomStreams(derive_keys(seed, torch.arange(self.n_agents)), self.device)

    # --- helpers -------------------------------------------------------------------------------
    def structured(self, batch: torch.Tensor) -> torch.Tensor:
        """View a flat batch ``[num_envs, ...]`` as ``[n_agents, n_envs, ...]`` (no copy)."""
        return batch.reshape(self.n_agents, self.n_envs, *batch.shape[1:])

    def _draw_reset_states(self, agents: torch.Tensor | None = None) -> torch.Tensor:
        """Fresh initial states for every row; only the streams of ``agents`` (bool ``[n_agents]``) advance.

        All rows are drawn in one call, but an agent whose episodes all continue keeps its counter,
        so its future numbers never depend on when other agents' episodes end.
        """
        counters = self.streams.counters
        noise = self.streams.uniform((self.n_envs, self.family.reset_noise_dim))
        if agents is not None:
            self.streams.counters = torch.where(agents, self.streams.counters, counters)
        return self._laid_out(self.family.reset(self.params, noise.reshape(self.num_envs, -1)))

    def _laid_out(self, state: torch.Tensor) -> torch.Tensor:
        """``state`` in the layout the family's kernels run fastest on (see ``TaskFamily.state_as_components``)."""
        return components_layout(state) if self.family.state_as_components else state

    def _draw_reset_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Initial states of the flat rows ``rows`` only, with the numbers :meth:`_draw_reset_states` gives them.

        Row ``i * n_envs + j`` takes words ``j * d .. j * d + d - 1`` (``d = reset_noise_dim``) of
        agent ``i``'s stream, as in the full draw, and every agent with a row in ``rows`` then
        advances by the full draw's ``n_envs * d`` words; so the streams, and every later number,
        are those of drawing the whole batch. Returns the states and the rows' task parameters.
        """
        row_agent, bases = self._reset_word_bases()
        # (index_select: half the cost of advanced indexing for these gathers, the same values)
        agent = row_agent.index_select(0, rows)
        # Word k of row r hashes key + (counter + offset) * golden; modulo 2**64 that is
        # (key + offset * golden) + counter * golden, and the first term is fixed per row.
        words = bases.index_select(0, rows) + (self.streams.counters * _GOLDEN).index_select(0, agent).unsqueeze(1)
        noise = uniform32_of_finalizer_input(words)
        step = torch.zeros_like(self.streams.counters).index_fill_(0, agent, self.n_envs * self.family.reset_noise_dim)
        self.streams.counters = self.streams.counters + step
        params = _gather_params(self.params, rows) if self.family.reset_reads_params else None
        return self.family.reset(params, noise), params

    def _reset_word_bases(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's agent ``[num_envs]`` and its reset words' fixed part ``[num_envs, d]``.

        The fixed part is the finalizer's input less the counter's share: ``key + offset * golden``
        plus the finalizer's own first addend (see :func:`fedrl_envs.rng.uniform32_of_finalizer_input`).

        Rebuilt whenever the streams' keys change (a new seed, loaded stream state).
        """
        keys = self.streams.keys
        cached = getattr(self, "_word_bases", None)
        if cached is None or cached[0] is not keys or cached[1] != keys._version:
            dim = self.family.reset_noise_dim
            row_agent = torch.arange(self.n_agents, device=self.device).repeat_interleave(self.n_envs)
            offsets = torch.arange(self.n_envs * dim, device=self.device).reshape(self.n_envs, dim).repeat(self.n_agents, 1)
            cached = (keys, keys._version, row_agent, keys.reshape(-1)[row_agent].unsqueeze(1) + (offsets + 1) * _GOLDEN)
            self._word_bases = cached
        return cached[2], cached[3]

    def _kernel_step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The family's step kernel on torch tensors, or on NumPy views of them (``kernels="numpy"``)."""
        if self.kernels != "numpy":  # the fused step has the torch kernel's values
            return self.family.step(state, action, self.params)
        params = self._numpy_kernel_params()
        with numpy_batch():
            out = self.family.step(state.numpy(), action.numpy(), params)
        return tuple(torch.from_numpy(np.asarray(x)) for x in out)  # type: ignore[return-value]

    def _numpy_kernel_params(self) -> Any:
        """The batch's task parameters as NumPy views (the tensors are never written in place)."""
        params = getattr(self, "_numpy_params", None)
        if params is None:
            params = dataclasses.replace(self.params, **{n: getattr(self.params, n).numpy() for n in _tensor_fields(self.params)})
            self._numpy_params = params
        return params

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        """Observations that never alias the internal state (callers may write into them), C-contiguous."""
        obs = self.family.observe(state, self.params)
        if obs.dim() == 2 and obs.shape[1] > 1 and obs.stride() == (1, obs.shape[0]):
            # Components laid out as [d, N] (see TaskFamily.state_as_components): a gather through
            # a cached permutation writes the row-major copy three times faster than torch's
            # transposing copy (which costs more than the rest of a CartPole step at 10^5 envs).
            n, d = obs.shape
            perm = getattr(self, "_row_major_perm", None)
            if perm is None or perm.numel() != n * d or perm.device != obs.device:
                perm = torch.arange(n * d, device=obs.device).reshape(d, n).T.reshape(-1)
                self._row_major_perm = perm
            return obs.movedim(-1, 0).reshape(-1).index_select(0, perm).view(n, d)
        return fresh_observation(obs, state)

    def _export(self, x: torch.Tensor, dtype: Any = None) -> Any:
        """A returned tensor in the caller's array type (NumPy: on the CPU, in ``dtype`` if given)."""
        if self.array_type == "torch":
            return x
        out = x.detach().cpu().numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def _export_obs(self, obs: torch.Tensor) -> Any:
        return self._export(obs, self.single_observation_space.dtype)

    def _export_info(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.array_type == "torch":
            return info
        out: dict[str, Any] = {}
        for key, value in info.items():
            if isinstance(value, dict):
                out[key] = self._export_info(value)
            elif key == "final_obs" and isinstance(value, torch.Tensor):
                out[key] = self._export_obs(value)
            else:
                out[key] = self._export(value) if isinstance(value, torch.Tensor) else value
        return out

    def _export_step(
        self, obs: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, info: dict[str, Any]
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self.array_type == "torch":
            return obs, reward, terminated, truncated, info
        return (
            self._export_obs(obs),
            self._export(reward, np.float32),
            self._export(terminated, np.bool_),
            self._export(truncated, np.bool_),
            self._export_info(info),
        )

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("this environment is closed; create a new one instead of stepping it")

    def _as_action_tensor(self, actions: Any) -> torch.Tensor:
        if isinstance(actions, torch.Tensor):
            if actions.device.type == "meta":  # no data to copy (torch would raise NotImplementedError)
                raise ValueError("actions must hold data: got a tensor on the meta device")
            action_t = actions.to(self.device)
        else:
            arr = np.asarray(actions)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"actions must be a numeric array or tensor, got {type(actions).__name__} of dtype {arr.dtype}")
            action_t = torch.as_tensor(arr, device=self.device)
        action_t = _signed_actions(action_t, "actions")
        expected = (self.num_envs, *self.single_action_space.shape)
        if tuple(action_t.shape) != expected:
            raise ValueError(f"actions must have shape {expected} (num_envs, *action_shape), got {tuple(action_t.shape)}")
        self.family.validate_action(action_t, self.params)
        return action_t

    @property
    def state(self) -> torch.Tensor:
        """Current flat kernel state ``[num_envs, ...]``."""
        if self._state is None:
            raise RuntimeError("call reset() before reading the state")
        return self._state

    @fitted_to_envs
    def set_state(self, state: Any, t: torch.Tensor | int = 0) -> Any:
        """Put every environment into ``state`` (flat batch) at time index ``t``; returns observations.

        :param state: kernel states ``[num_envs, ...]`` (validated, copied, never clipped)
        :param t: time index of every environment, an int or an int tensor ``[num_envs]``
        """
        self._check_open()
        template = self.family.reset(self.params, torch.zeros(self.num_envs, self.family.reset_noise_dim, device=self.device))
        state_t = _as_state_tensor(state, template, "state")
        t_t = t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t))
        if t_t.is_floating_point() or t_t.dtype == torch.bool:
            raise TypeError(f"t must be an int or an integer tensor, got dtype {t_t.dtype}")
        if t_t.dim() > 1 or (t_t.dim() == 1 and t_t.shape[0] != self.num_envs):
            raise ValueError(f"t must be an int or have shape ({self.num_envs},), got shape {tuple(t_t.shape)}")
        if bool((t_t < 0).any()):
            raise ValueError(f"t must be >= 0, got minimum {int(t_t.min())}")
        self.family.validate_state(state_t, self.params)
        self._state = self._laid_out(state_t)
        self._t = t_t.to(self.device, torch.int64).expand(self.num_envs).clone()
        return self._export_obs(self._observe(self._state))

    # --- VectorEnv API -------------------------------------------------------------------------
    @fitted_to_envs
    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every environment; ``seed`` (an int) re-keys the agents' streams.

        ``options={"reset_mask": mask}`` (bool ``[num_envs]``) resets only the rows of ``mask``;
        only the streams of agents with a reset row advance.
        """
        obs, info = self._reset_tensors(seed, options)
        return self._export_obs(obs), info

    def _reset_tensors(
        self, seed: int | list[int] | None, options: dict[str, Any] | None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        self._check_open()
        if isinstance(seed, list | tuple):
            if len(set(seed)) != 1:
                raise ValueError("seed must be one int for the whole batch (each agent derives its own stream)")
            seed = seed[0]
        seed = check_seed(seed)
        mask = _reset_mask(options, self.num_envs)
        if mask is not None and mask.all():
            mask = None  # every row: a plain reset
        if mask is not None and self._state is None:
            raise RuntimeError("call reset() without a reset_mask before resetting some environments only")
        if seed is not None:
            self.streams = self._make_streams(seed)
            self._seed = seed
            # VectorEnv.np_random, as Gymnasium's reset(seed=) seeds it (the dynamics never draw from it)
            self._np_random, self._np_random_seed = seeding.np_random(seed % 2**64)
        if mask is None:
            self._state = self._draw_reset_states()
            self._t.zero_()
        else:
            rows = torch.from_numpy(mask).to(self.device)
            fresh = self._draw_reset_states(agents=self.structured(rows).any(1))
            self._state = torch.where(rows.reshape(rows.shape + (1,) * (fresh.dim() - 1)), fresh, self._state)
            self._t = torch.where(rows, 0, self._t)
        return self._observe(self._state), {}

    @fitted_to_envs
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step all environments; see the class docstring for autoreset and info keys."""
        return self._export_step(*self._step_tensors(actions))

    def _step_tensors(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._check_open()
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if self.kernels == "numba":
            return self._step_fused(actions)
        action_t = self._as_action_tensor(actions)
        next_state, reward, terminated = self._kernel_step(self._state, action_t)
        t = self._t + 1
        if self.horizon is None:
            truncated = torch.zeros_like(terminated)
        else:
            truncated = t >= self.horizon + 1
        obs = self._observe(next_state)
        info: dict[str, Any] = {}
        if self.autoreset:
            done = terminated | truncated
            # One synchronizing call per step; resets are drawn only when some episode ended.
            rows = done.nonzero().squeeze(1)
            if rows.numel():
                info["final_obs"] = obs
                info["_final_obs"] = done
                info["final_info"] = {}
                info["_final_info"] = done
                t.masked_fill_(done, 0)
                if rows.numel() == self.num_envs:
                    # Every episode ended (a time limit reached by all at once): the full draw
                    # gives these very numbers without gathering anything.
                    next_state = self._draw_reset_states()
                    obs = self._observe(next_state)
                else:
                    # Only the rows that reset are drawn, reset and observed (a few per step), not
                    # the batch; the kernel's output is written in place unless it is the old state.
                    fresh, fresh_obs = self._fresh_rows(rows)
                    if next_state.data_ptr() == self._state.data_ptr():
                        next_state = next_state.clone()
                    next_state.index_copy_(0, rows, fresh.to(next_state.dtype))
                    obs = obs.index_copy(0, rows, fresh_obs.to(obs.dtype))
        self._state = next_state
        self._t = t
        return obs, reward, terminated, truncated, info

    def _step_fused(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """:meth:`_step_tensors` through the family's fused step (``kernels="numba"``): the same values.

        One compiled call (:mod:`fedrl_envs.fused`) runs the transition, the observations, the time
        limit, the list of ended rows and their resets; it writes only new arrays and a copy of the
        stream counters, so a rejected action leaves the environment as it was.
        """
        action = self._fused_actions(actions)
        state = self._state.T.numpy()  # the components [d, N] (state_as_components layout)
        n, d = self.num_envs, state.shape[0]
        packed = self.family.fused_params(self.params)  # packed once, kept on the parameters
        row_agent, bases = self._reset_word_bases()
        counters = self.streams.counters.numpy().view(np.uint64).copy()
        space = self.single_action_space
        next_state = np.empty_like(state)
        obs, final_obs = np.empty((n, d), np.float32), np.empty((n, d), np.float32)
        reward, terminated = np.empty(n, np.float32), np.empty(n, np.bool_)
        truncated, done = np.empty(n, np.bool_), np.empty(n, np.bool_)
        next_t, rows = np.empty(n, np.int64), np.empty(n, np.int64)
        noise = np.empty((n, self.family.reset_noise_dim), np.float32)
        n_done, n_bad = self.family.fused_step(
            state, action, packed, self._t.numpy(), -1 if self.horizon is None else self.horizon, self.autoreset,
            int(space.start), int(space.start + space.n - 1), row_agent.numpy(), bases.numpy().view(np.uint64),
            counters, np.uint64(_GOLDEN % 2**64), np.uint64(self.n_envs * self.family.reset_noise_dim),
            next_state, obs, final_obs, reward, terminated, truncated, done, next_t, rows, noise)
        if n_bad:
            self.family.validate_action(torch.from_numpy(action), self.params)  # raises, naming the action
        info: dict[str, Any] = {}
        if self.autoreset and n_done:
            done_t = torch.from_numpy(done)
            info = {"final_obs": torch.from_numpy(final_obs), "_final_obs": done_t, "final_info": {}, "_final_info": done_t}
            self.streams.counters = torch.from_numpy(counters.view(np.int64))
        self._state = torch.from_numpy(next_state).T
        self._t = torch.from_numpy(next_t)
        return torch.from_numpy(obs), torch.from_numpy(reward), torch.from_numpy(terminated), torch.from_numpy(truncated), info

    def _fused_actions(self, actions: Any) -> np.ndarray:
        """The actions as int64 NumPy ``[num_envs]`` for a fused step: plain integer arrays and CPU
        tensors directly, everything else through :meth:`_as_action_tensor`'s checks and errors."""
        if isinstance(actions, torch.Tensor) and actions.device.type == "cpu" and not actions.requires_grad:
            array = actions.numpy()
        elif isinstance(actions, np.ndarray):
            array = actions
        else:
            array = None
        if array is None or array.shape != (self.num_envs,) or array.dtype.kind not in "iu" or (
                array.dtype.kind == "u" and array.dtype.itemsize > 1):
            return self._as_action_tensor(actions).numpy().astype(np.int64, copy=False)
        return array.astype(np.int64, copy=False)

    def _fresh_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Initial states and observations of the rows ``rows`` (advancing the streams), drawn by the
        torch code or, with ``kernels="numpy"``, by its NumPy twin (the same bits)."""
        if self.kernels == "numpy":
            fresh, fresh_obs = self._draw_reset_rows_numpy(rows.numpy())
            return torch.from_numpy(np.asarray(fresh)), torch.from_numpy(np.asarray(fresh_obs))
        fresh, params = self._draw_reset_rows(rows)
        return fresh, self.family.observe(fresh, params)

    def _draw_reset_rows_numpy(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_draw_reset_rows` on NumPy: the rows' initial states and observations; advances the streams."""
        row_agent, bases = self._reset_word_bases()
        agent = row_agent.numpy()[rows]
        counters = self.streams.counters.numpy()
        golden = np.uint64(_GOLDEN % 2**64)
        words = bases.numpy().view(np.uint64)[rows] + (counters.view(np.uint64) * golden)[agent][:, None]
        noise = uniform32_of_finalizer_input_numpy(words)
        step = np.zeros_like(counters)
        step[agent] = self.n_envs * self.family.reset_noise_dim
        self.streams.counters = torch.from_numpy(counters + step)
        params = self._numpy_kernel_params()
        row_params = (
            dataclasses.replace(params, **{n: np.take(getattr(params, n), rows, axis=0) for n in _tensor_fields(self.params)})
            if self.family.reset_reads_params
            else None
        )
        with numpy_batch():
            fresh = self.family.reset(row_params, noise)
            return fresh, self.family.observe(fresh, row_params)

    def close_extras(self, **kwargs: Any) -> None:
        self._state = None

    @classmethod
    def from_gym_kwargs(
        cls,
        family: TaskFamily,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        autoreset: bool = True,
        render_mode: str | None = None,
        array_type: str = "torch",
        kernels: str = "auto",
        **task_kwargs: Any,
    ) -> FamilyVectorEnv:
        """The ``vector_entry_point``: ``num_envs`` copies of one task given by ``gym.make`` kwargs.

        :param family: the task family
        :param num_envs: number of environments (all on the same task)
        :param device: torch device of the batch
        :param seed: seed of the random stream
        :param autoreset: ``False`` for the fixed-horizon mode
        :param render_mode: must be ``None`` (the native vector env does not render)
        :param array_type: ``"torch"`` or ``"numpy"``: what the env returns
        :param kernels: ``"auto"`` (default), ``"torch"``, ``"numpy"`` or ``"numba"``: what the step
            kernel runs on (see the class)
        :param task_kwargs: the task's ``gym.make`` keyword arguments
        """
        num_envs = check_int("num_envs", num_envs, 1)
        if render_mode is not None:
            raise ValueError(
                f"render_mode must be None for the native vector env (it does not render), got {render_mode!r}; "
                'use vectorization_mode="sync" to render single environments'
            )
        return cls(
            family,
            [family.make_params(**task_kwargs)],
            n_envs=num_envs,
            device=device,
            seed=seed,
            autoreset=autoreset,
            array_type=array_type,
            kernels=kernels,
        )


def _is_single_task(family: TaskFamily, params: Any) -> bool:
    """Whether ``params`` are one task's (unstacked) parameters, judged against the family's first task."""
    reference = family.train_tasks[0]
    if type(params) is not type(reference):
        raise TypeError(f"tasks must be parameters of {type(reference).__name__} or a sequence of them, got {type(params).__name__}")
    name = _tensor_fields(reference)[0]
    return getattr(params, name).dim() == getattr(reference, name).dim()
