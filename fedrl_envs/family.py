"""The contract every fedrl task family implements, and the two environments built on it.

A *family* is one parameterized MDP written once as pure batched functions (torch, or the small
namespace of :mod:`fedrl_envs.ops`, which also runs them on one NumPy environment); a *task* is one
value of its frozen parameter dataclass; a heterogeneous population is the same dataclass with its
tensor fields stacked along a leading agent axis (:func:`~fedrl_envs.params.stack_params`). The single-agent
:class:`~fedrl_envs.single.FamilyEnv` and the native vector env
:class:`~fedrl_envs.vector.FamilyVectorEnv` both call the family's kernels, so there is exactly one
copy of the dynamics; time limits and autoreset live in those two environments, not in the kernels.

A family implements, in this order on :class:`TaskFamily`: the kernels (``reset``, ``step``,
``observe``), the spaces and the catalogue of tasks; then, optionally, the fast paths (``fast_step``,
``compiled_transition``, and the flags ``numpy_kernels``, ``state_as_components``, ``fused_kernels``).
Task parameters: :mod:`fedrl_envs.params`; argument checks: :mod:`fedrl_envs.validation`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

import gymnasium as gym
import torch

P = TypeVar("P")


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

    # --- optional fast paths: the environments and samplers use them where a family has them ------
    def fast_step(self, state: torch.Tensor, action: torch.Tensor, params: P) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`step`, or a compiled equivalent with bitwise the same values where the family has one
        and it applies (CartPole on the CPU with Numba installed); what the algorithms' rollouts call."""
        return self.step(state, action, params)

    def compiled_transition(self, params: P, rows: int) -> tuple[Any, tuple[Any, ...]] | None:
        """The transition of one environment as a Numba function, for compiled policy rollouts
        (``FastMlpPolicy(kernels="numba")``, :mod:`fedrl_algos.policies.mlp.compiled`), or ``None``.

        A family that has one returns ``(transition, data)``: ``transition(state, i, action, row,
        data) -> (reward, terminated)`` moves ``state[i]`` (a float32 ``[N, d]`` array whose rows
        are also the observations) in place, with the task parameters of batch row ``row`` read
        from ``data`` (NumPy arrays and scalars packed from ``params``, ``rows`` batch rows), with
        bitwise the values of :meth:`step`. ``None`` (the default) keeps the torch rollout.
        """
        return None
