"""The tabular gridworld family of the Per-FedAvg-PG paper (appendix C.1)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from fedrl_envs.family import TaskFamily
from fedrl_envs.ops import array_ops
from fedrl_envs.params import derived
from fedrl_envs.single import FamilyEnv
from fedrl_envs.validation import check_int

__all__ = ["GridWorldParams", "GridWorldFamily", "GridWorldEnv", "GRIDWORLD", "gridworld_goals"]

# Action k moves by (dx, dy) = _MOVES[k]: up, down, left, right (y grows downwards).
_MOVES = ((0, -1), (0, 1), (-1, 0), (1, 0))
ACTION_NAMES = ("up", "down", "left", "right")


@cache
def _moves_table(device: torch.device) -> torch.Tensor:
    """``_MOVES`` as an int64 tensor on ``device`` (built once per device, not once per step)."""
    return torch.tensor(_MOVES, dtype=torch.int64, device=device)


#: the largest grid side (the step table holds 4·size² int64 entries)
MAX_SIZE = 1024


def _move(state: torch.Tensor, action: torch.Tensor, size: int) -> torch.Tensor:
    """The move rule: cell ``(x, y)`` plus the action's move, clipped to the grid (walls keep the agent)."""
    moves = _moves_table(state.device)[action.long()]
    x = torch.clamp(state % size + moves[..., 0], 0, size - 1)
    y = torch.clamp(state // size + moves[..., 1], 0, size - 1)
    return y * size + x


@cache
def _next_cell_table(size: int, device: torch.device) -> torch.Tensor:
    """:func:`_move` of every (cell, action) pair, flat int64 ``[size * size * 4]`` at ``cell * 4 + action``.

    Built once per grid size and device, so a step is one gather instead of ten elementwise passes.
    """
    cells = torch.arange(size * size, device=device).repeat_interleave(len(_MOVES))
    actions = torch.arange(len(_MOVES), device=device).repeat(size * size)
    return _move(cells, actions, size)


@dataclass(frozen=True)
class GridWorldParams:
    """Parameters of one gridworld task (or of a stack of tasks).

    :param goal: goal cell ``(x, y)`` as an int64 tensor ``[..., 2]``
    :param size: side length of the square grid
    :param horizon: last time index H (an episode has H + 1 steps)
    """

    goal: torch.Tensor
    size: int = 5
    horizon: int = 15

    @property
    def n_states(self) -> int:
        return self.size * self.size

    @derived  # computed once per parameter object, not at every step
    def goal_index(self) -> torch.Tensor:
        """Goal state index ``y * size + x``, shape ``[...]``."""
        gx, gy = array_ops(self.goal).unbind(self.goal)
        return gy * self.size + gx


def gridworld_goals(size: int = 5) -> list[tuple[int, int]]:
    """The paper's 8 goals for a ``size × size`` grid: corners, then edge midpoints."""
    last, mid = size - 1, (size - 1) // 2
    return [(0, 0), (last, 0), (0, last), (last, last), (mid, 0), (0, mid), (last, mid), (mid, last)]


class GridWorldFamily(TaskFamily[GridWorldParams]):
    """Kernels and task catalogue of ``fedrl/GridWorld-v0``."""

    env_id = "fedrl/GridWorld-v0"
    reset_noise_dim = 1
    numpy_kernels = True
    default_size = 5

    # --- kernels -------------------------------------------------------------------------------
    def reset(self, params: GridWorldParams, noise: torch.Tensor) -> torch.Tensor:
        # Uniform over the S - 1 non-goal cells: draw an index among them, then skip the goal.
        xp = array_ops(noise)
        n_choices = params.n_states - 1
        (u,) = xp.unbind(noise)
        idx = xp.clip(xp.astype(xp.astype(u, xp.float64) * n_choices, xp.int64), high=n_choices - 1)
        goal = xp.to_device(params.goal_index, like=idx)
        return idx + xp.astype(idx >= goal, xp.int64)

    def step(
        self, state: torch.Tensor, action: torch.Tensor, params: GridWorldParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # One gather from the cached (cell, action) -> next cell table that _move builds.
        xp = array_ops(state)
        next_state = xp.take(xp.table(_next_cell_table, params.size, like=state), state * len(_MOVES) + action)
        reward = xp.astype(state == params.goal_index, xp.float32)
        return next_state, reward, xp.zeros_like(state, dtype=xp.bool)

    # --- exact model (derived from the kernel, never written twice) ----------------------------
    def next_state_table(self, params: GridWorldParams) -> torch.Tensor:
        """Deterministic transitions: ``table[..., s, a]`` is the next state, int64 ``[..., S, A]``."""
        s, a = params.n_states, len(_MOVES)
        batch = params.goal.shape[:-1]
        device = params.goal.device
        states = torch.arange(s, device=device).repeat_interleave(a).expand(*batch, s * a)
        actions = torch.arange(a, device=device).repeat(s).expand(*batch, s * a)
        every_pair = GridWorldParams(params.goal.unsqueeze(-2).expand(*batch, s * a, 2), params.size, params.horizon)
        return self.step(states, actions, every_pair)[0].reshape(*batch, s, a)

    def transition_tensor(self, params: GridWorldParams, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``P[..., s, a, s']`` as a dense one-hot tensor (deterministic dynamics)."""
        table = self.next_state_table(params)
        return torch.nn.functional.one_hot(table, params.n_states).to(dtype)

    def reward_vector(self, params: GridWorldParams, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``r[..., s]``: the reward of acting in state ``s`` (independent of the action)."""
        states = torch.arange(params.n_states, device=params.goal.device)
        return (states == params.goal_index.unsqueeze(-1)).to(dtype)

    def start_distribution(self, params: GridWorldParams, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``mu[..., s]``: uniform over the non-goal cells."""
        not_goal = 1.0 - self.reward_vector(params, dtype)
        return not_goal / (params.n_states - 1)

    # --- spaces and tasks ----------------------------------------------------------------------
    def observation_space(self, params: GridWorldParams) -> gym.Space:
        return gym.spaces.Discrete(params.n_states)

    def action_space(self, params: GridWorldParams) -> gym.Space:
        return gym.spaces.Discrete(len(_MOVES))

    def validate_state(self, state: torch.Tensor, params: GridWorldParams) -> None:
        if state.numel() and (bool((state < 0).any()) or bool((state >= params.n_states).any())):
            raise ValueError(
                f"state must be a cell index in [0, {params.n_states - 1}], got values in "
                f"[{int(state.min())}, {int(state.max())}]"
            )

    def horizon(self, params: GridWorldParams) -> int:
        return params.horizon

    def make_params(
        self,
        agent: int | None = None,
        goal: tuple[int, int] | None = None,
        size: int = 5,
        horizon: int = 15,
    ) -> GridWorldParams:
        """Validated parameters; ``agent`` picks one of the 8 paper goals, ``goal`` any cell."""
        # Bounded: a step gathers from a table of 4·size² cells (size 1024: 4M entries, 32 MiB); an
        # unbounded size let gym.make(size=10**6) try to allocate terabytes.
        size = check_int("size", size, 2, MAX_SIZE)
        horizon = check_int("horizon", horizon, 1)
        goals = gridworld_goals(size)
        if agent is not None and goal is not None:
            raise ValueError("pass either agent or goal, not both")
        if goal is None:
            agent = 0 if agent is None else check_int("agent", agent, 0, len(goals) - 1)
            goal = goals[agent]
        try:
            gx, gy = goal
        except (TypeError, ValueError):
            raise TypeError(f"goal must be a pair (x, y) of ints, got {goal!r}") from None
        gx = check_int("goal x", gx, 0, size - 1)
        gy = check_int("goal y", gy, 0, size - 1)
        return GridWorldParams(goal=torch.tensor([gx, gy], dtype=torch.int64), size=size, horizon=horizon)

    @property
    def train_tasks(self) -> list[GridWorldParams]:
        return [self.make_params(agent=k, size=self.default_size) for k in range(8)]

    @property
    def heldout_tasks(self) -> list[GridWorldParams]:
        """Every other cell of the grid (the paper reports no held-out gridworld experiment)."""
        train = set(gridworld_goals(self.default_size))
        return [
            self.make_params(goal=(x, y), size=self.default_size)
            for y in range(self.default_size)
            for x in range(self.default_size)
            if (x, y) not in train
        ]

    def task_kwargs(self, task: GridWorldParams) -> dict[str, Any]:
        return {"goal": tuple(int(v) for v in task.goal.tolist()), "size": task.size, "horizon": task.horizon}


GRIDWORLD = GridWorldFamily()


class GridWorldEnv(FamilyEnv[GridWorldParams]):
    """
    ## Description

    The tabular gridworld family of Per-FedAvg-PG (appendix C.1): an agent walks on a
    ``size × size`` grid towards a goal cell. Every task of the family has the same dynamics and
    differs only in its goal; the paper's federation has 8 agents with goals at the four corners
    and the four edge midpoints. The family object ``fedrl_envs.GRIDWORLD`` lists them
    (``train_tasks``; the 17 other cells are ``heldout_tasks``) and gives each task's exact model
    as torch tensors for planning: ``next_state_table`` (``[S, A]``), ``transition_tensor``
    (``[S, A, S]``), ``reward_vector`` and ``start_distribution`` (``[S]``).

    ## Action Space

    ``Discrete(4)``: 0 up (y − 1), 1 down (y + 1), 2 left (x − 1), 3 right (x + 1). A move off the
    grid leaves the agent in place.

    ## Observation Space

    ``Discrete(size * size)``: the cell index ``s = y * size + x``.

    ## Rewards

    1 when the state the action is taken in is the goal cell, else 0: the reward of step h is
    r(s_h), collected at every step including the first. The goal is not absorbing.

    ## Starting State

    Uniform over the ``size * size - 1`` non-goal cells.

    ## Episode End

    Nothing terminates early. After ``horizon + 1`` steps (the paper's h = 0..H; 16 steps by
    default) the episode is truncated (``truncated=True``).

    ## Arguments

    * ``agent``: index 0..7 of the paper's task (goals (0,0), (4,0), (0,4), (4,4), (2,0), (0,2),
      (4,2), (2,4) for size 5: corners, then edge midpoints, the same pattern for other sizes);
      default 0.
    * ``goal``: any goal cell ``(x, y)`` instead of ``agent``.
    * ``size``: grid side length (2 to 1024), default 5. ``horizon``: H (>= 1), default 15.
    * ``render_mode``: ``"ansi"`` (a text grid: ``A`` agent, ``G`` goal) or ``"rgb_array"`` (a
      ``uint8`` image of 16 × 16 pixels per cell: goal green, agent blue).

    ```python
    >>> import gymnasium as gym, fedrl_envs
    >>> env = gym.make("fedrl/GridWorld-v0", agent=3)
    >>> obs, info = env.reset(seed=0)
    >>> env.unwrapped.params.goal.tolist()
    [4, 4]
    >>> env.observation_space, env.action_space
    (Discrete(25), Discrete(4))
    >>> env.unwrapped.set_state(23)   # (x, y) = (3, 4), next to the goal
    23
    >>> env.step(3)[:4]               # right: into the goal; the reward is that of state 23
    (24, 0.0, False, False)
    >>> env.step(3)[:4]               # acting in the goal earns 1 (the wall keeps it there)
    (24, 1.0, False, False)

    ```

    ## Version History

    * v0: initial version, following appendix C.1 of the Per-FedAvg-PG paper.
    """

    family = GRIDWORLD
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    #: pixels per grid cell in ``rgb_array`` frames
    cell_pixels: ClassVar[int] = 16

    def _render_ansi(self) -> str:
        size, s = self.params.size, int(self.state)
        goal = int(self.params.goal_index)
        rows = []
        for y in range(size):
            rows.append("".join("A" if y * size + x == s else "G" if y * size + x == goal else "." for x in range(size)))
        return "\n".join(rows) + "\n"

    def _render_rgb_array(self) -> np.ndarray:
        size, c = self.params.size, self.cell_pixels
        frame = np.full((size * c, size * c, 3), 245, dtype=np.uint8)
        gx, gy = (int(v) for v in self.params.goal.tolist())
        frame[gy * c : (gy + 1) * c, gx * c : (gx + 1) * c] = (60, 180, 75)
        s = int(self.state)
        ax, ay = s % size, s // size
        m = c // 4
        frame[ay * c + m : (ay + 1) * c - m, ax * c + m : (ax + 1) * c - m] = (30, 90, 200)
        frame[::c, :] = frame[:, ::c] = (190, 190, 190)  # grid lines on the top/left edge of each cell
        frame[-1, :] = frame[:, -1] = (190, 190, 190)
        return frame
