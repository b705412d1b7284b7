"""Hand-vectorized NumPy versions of the gridworld and arc navigation: ``fedrl bench envs``' strongest baseline.

Gymnasium, gymnax and EnvPool have no version of either family, so the fastest thing a user would
write instead of fedrl's federated env is what Gymnasium's own ``CartPoleVectorEnv`` is for
CartPole: one NumPy array per state component for all environments, stepped with whole-array
operations. :class:`NumpyGridWorldVector` and :class:`NumpyArcNavigationVector` are that, written
for speed (a precomputed next-cell table, in-place updates, no Python loop over environments),
with fedrl's heterogeneous layout: ``n_agents × n_envs`` rows, agent-major (row
``i * n_envs + j`` is agent ``i``'s environment ``j``), each agent with its own goal.

Their dynamics are fedrl's (``tests/test_bench_numpy_vector.py`` steps them against
:class:`fedrl_envs.FamilyVectorEnv` from the same states): same transition, reward, truncation
after ``horizon + 1`` steps and ``SAME_STEP`` autoreset with ``info["final_obs"]`` and its mask
``info["_final_obs"]``. The start states have fedrl's distribution but are drawn from the vector
env's ``np_random`` (NumPy's generator), only for the rows whose episodes ended, so the draws
differ from fedrl's counter-based streams.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrl_envs.validation import check_int, is_real

__all__ = ["NumpyGridWorldVector", "NumpyArcNavigationVector", "numpy_vector_env"]

# Action k moves by (dx, dy): up, down, left, right (y grows downwards), as fedrl's gridworld.
_GRID_MOVES = ((0, -1), (0, 1), (-1, 0), (1, 0))
_ARC_ACTIONS = 8


def _goals_array(goals: Any, dtype: Any, name: str = "goals") -> np.ndarray:
    """Per-agent goals as a ``[n_agents, 2]`` array; ``ValueError`` naming ``goals`` otherwise."""
    arr = np.asarray(goals)
    if arr.dtype.kind not in "iuf" or arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] < 1:
        raise ValueError(f"{name} must be numbers of shape (n_agents, 2) with n_agents >= 1, got shape {arr.shape} of dtype {arr.dtype}")
    return arr.astype(dtype)


def _check_actions(actions: Any, num_envs: int, n_actions: int) -> np.ndarray:
    """Integer actions ``[num_envs]`` in ``[0, n_actions)`` (the check Gymnasium's ``CartPoleVectorEnv`` asserts)."""
    if not isinstance(actions, np.ndarray) or actions.dtype.kind not in "iu":
        raise TypeError(f"actions must be an integer NumPy array, got {type(actions).__name__}")
    if actions.shape != (num_envs,):
        raise ValueError(f"actions must have shape ({num_envs},), got {actions.shape}")
    if num_envs and (actions.min() < 0 or actions.max() >= n_actions):
        raise ValueError(f"actions must lie in [0, {n_actions - 1}], got values in [{actions.min()}, {actions.max()}]")
    return actions


class _NumpyVectorBase(VectorEnv):
    """Time limit, ``SAME_STEP`` autoreset and state setting shared by the two NumPy vector envs."""

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, n_agents: int, n_envs: int, horizon: int) -> None:
        self.n_agents = n_agents
        self.n_envs = check_int("n_envs", n_envs)
        self.num_envs = n_agents * self.n_envs
        self.horizon = check_int("horizon", horizon)
        self.render_mode = None
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._t = np.zeros(self.num_envs, dtype=np.int32)
        self._ready = False

    # --- to be provided by each family ---------------------------------------------------------
    def _draw_starts(self, rows: np.ndarray | None) -> None:
        """Put fresh start states into ``rows`` (all rows when ``None``), drawn with ``self.np_random``."""
        raise NotImplementedError

    def _move(self, actions: np.ndarray) -> np.ndarray:
        """Advance the state in place by ``actions``; return the rewards of the states acted in."""
        raise NotImplementedError

    def _observe(self) -> np.ndarray:
        """A fresh observation array of the current state (never a view of it)."""
        raise NotImplementedError

    def _load_state(self, state: np.ndarray) -> None:
        raise NotImplementedError

    # --- VectorEnv API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw a start state for every environment (``seed`` seeds ``np_random``)."""
        super().reset(seed=seed)
        self._draw_starts(None)
        self._t.fill(0)
        self._ready = True
        return self._observe(), {}

    def set_state(self, state: Any, t: int | np.ndarray = 0) -> np.ndarray:
        """Put every environment into ``state`` (flat batch, in the observation format) at time index ``t``.

        :param state: states ``[num_envs, ...]`` as fedrl's ``FamilyVectorEnv.set_state`` takes them
        :param t: time index of every environment, an int or an int array ``[num_envs]``
        """
        t_arr = np.broadcast_to(np.asarray(t), (self.num_envs,))
        if t_arr.dtype.kind not in "iu" or (t_arr < 0).any():
            raise ValueError("t must be an int >= 0 or such an array of shape (num_envs,)")
        state_arr = np.asarray(state)
        expected = (self.num_envs, *self.single_observation_space.shape)
        if state_arr.shape != expected:
            raise ValueError(f"state must have shape {expected}, got {state_arr.shape}")
        if not self.observation_space.contains(state_arr.astype(self.single_observation_space.dtype)):
            raise ValueError("state must lie in the observation space")
        self._load_state(state_arr)
        self._t[:] = t_arr
        self._ready = True
        return self._observe()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every environment; environments past their last step start over in the same step."""
        if not self._ready:
            raise RuntimeError("call reset() before step()")
        reward = self._move(_check_actions(actions, self.num_envs, int(self.single_action_space.n)))
        self._t += 1
        truncated = self._t > self.horizon
        terminated = np.zeros(self.num_envs, dtype=np.bool_)  # neither family ends an episode early
        info: dict[str, Any] = {}
        # One scan for the common case of no episode end; when episodes end, the whole batch does
        # at once after a full reset, which avoids gathering rows.
        if truncated.any():
            info = {"final_obs": self._observe(), "_final_obs": truncated, "final_info": {}, "_final_info": truncated}
            if truncated.all():
                self._draw_starts(None)
                self._t.fill(0)
            else:
                rows = np.flatnonzero(truncated)
                self._draw_starts(rows)
                self._t[rows] = 0
        return self._observe(), reward, terminated, truncated, info


class NumpyGridWorldVector(_NumpyVectorBase):
    """``fedrl/GridWorld-v0`` for ``n_agents × n_envs`` environments in plain NumPy.

    The state is kept as ``cell * 4`` (int64), so that a step is one add and one gather from a
    table of ``next_cell * 4`` indexed by ``cell * 4 + action``; observations are the cells.

    :param goals: goal cell ``(x, y)`` of each agent, ``[n_agents, 2]``
    :param n_envs: environments per agent
    :param size: side of the grid
    :param horizon: last time index (``horizon + 1`` steps per episode)
    """

    def __init__(self, goals: Sequence[tuple[int, int]] | np.ndarray, n_envs: int = 1, size: int = 5, horizon: int = 15) -> None:
        size = check_int("size", size, 2)
        goal_xy = _goals_array(goals, np.int64)
        if (goal_xy < 0).any() or (goal_xy >= size).any():
            raise ValueError(f"goals must be cells (x, y) with 0 <= x, y < {size}, got {goal_xy.tolist()}")
        self.size = size
        self.single_observation_space = gym.spaces.Discrete(size * size)
        self.single_action_space = gym.spaces.Discrete(len(_GRID_MOVES))
        super().__init__(goal_xy.shape[0], n_envs, horizon)
        self.goals = goal_xy
        x, y = np.meshgrid(np.arange(size), np.arange(size))  # cell y * size + x
        moves = np.array(_GRID_MOVES)
        nx = np.clip(x.reshape(-1, 1) + moves[:, 0], 0, size - 1)
        ny = np.clip(y.reshape(-1, 1) + moves[:, 1], 0, size - 1)
        self._next4 = ((ny * size + nx) * len(_GRID_MOVES)).reshape(-1)  # [cell * 4 + action] -> next * 4
        goal_cell = goal_xy[:, 1] * size + goal_xy[:, 0]
        self._goal = np.repeat(goal_cell, self.n_envs)  # [num_envs]
        self._goal4 = self._goal * len(_GRID_MOVES)
        self._s4 = np.zeros(self.num_envs, dtype=np.int64)
        self._idx = np.empty(self.num_envs, dtype=np.int64)

    def _draw_starts(self, rows: np.ndarray | None) -> None:
        # Uniform over the size² - 1 non-goal cells: an index among them, then skip the goal.
        goal = self._goal if rows is None else self._goal[rows]
        cell = self.np_random.integers(0, self.size * self.size - 1, size=goal.shape[0])
        cell += cell >= goal
        cell *= len(_GRID_MOVES)
        if rows is None:
            self._s4[:] = cell
        else:
            self._s4[rows] = cell

    def _move(self, actions: np.ndarray) -> np.ndarray:
        reward = (self._s4 == self._goal4).astype(np.float32)
        np.add(self._s4, actions, out=self._idx)
        # mode="clip" (indices are checked): with mode="raise" NumPy buffers ``out``, twice the cost.
        np.take(self._next4, self._idx, out=self._s4, mode="clip")
        return reward

    def _observe(self) -> np.ndarray:
        return self._s4 >> 2  # cell * 4 -> cell, a fresh int64 array

    def _load_state(self, state: np.ndarray) -> None:
        self._s4[:] = state.astype(np.int64) * len(_GRID_MOVES)


class NumpyArcNavigationVector(_NumpyVectorBase):
    """``fedrl/ArcNavigation-v0`` for ``n_agents × n_envs`` environments in plain NumPy.

    Positions are one float32 array ``[num_envs, 2]`` updated in place (row-major: the observation
    is one copy, and the move one row gather from the 8 × 2 compass table).

    :param goals: goal position ``(gx, gy)`` of each agent, ``[n_agents, 2]``
    :param n_envs: environments per agent
    :param goal_radius: reward radius
    :param step_size: length of a move
    :param horizon: last time index (``horizon + 1`` steps per episode)
    """

    def __init__(
        self,
        goals: Sequence[tuple[float, float]] | np.ndarray,
        n_envs: int = 1,
        goal_radius: float = 0.2,
        step_size: float = 0.15,
        horizon: int = 20,
    ) -> None:
        for name, value in (("goal_radius", goal_radius), ("step_size", step_size)):
            if not is_real(value):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        goal_xy = _goals_array(goals, np.float32)
        if (np.abs(goal_xy) > 1.0).any():
            raise ValueError(f"goals must lie in the box [-1, 1]², got {goal_xy.tolist()}")
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(_ARC_ACTIONS)
        super().__init__(goal_xy.shape[0], n_envs, horizon)
        self.goals = goal_xy
        # From Python floats, as fedrl builds its compass table, so both round to the same float32.
        angle = [2 * math.pi * k / _ARC_ACTIONS for k in range(_ARC_ACTIONS)]
        self._moves = np.array([[step_size * math.cos(a), step_size * math.sin(a)] for a in angle], dtype=np.float32)
        # The radius is compared in float32 on both sides (torch and NumPy 2 keep a tensor's dtype).
        self._r2 = np.float32(float(goal_radius) ** 2)
        self._goal = np.repeat(goal_xy, self.n_envs, axis=0)  # [num_envs, 2]
        self._pos = np.zeros((self.num_envs, 2), dtype=np.float32)
        self._diff = np.empty((self.num_envs, 2), dtype=np.float32)

    def _draw_starts(self, rows: np.ndarray | None) -> None:
        # Uniform in the box: 2u - 1 in float32, u uniform on [0, 1), as fedrl's reset.
        n = self.num_envs if rows is None else rows.shape[0]
        start = self.np_random.random((n, 2), dtype=np.float32)
        start *= 2.0
        start -= 1.0
        if rows is None:
            self._pos[:] = start
        else:
            self._pos[rows] = start

    def _move(self, actions: np.ndarray) -> np.ndarray:
        diff = self._diff
        np.subtract(self._pos, self._goal, out=diff)
        np.multiply(diff, diff, out=diff)
        reward = (diff[:, 0] + diff[:, 1] <= self._r2).astype(np.float32)
        self._pos += np.take(self._moves, actions, axis=0)
        np.clip(self._pos, -1.0, 1.0, out=self._pos)
        return reward

    def _observe(self) -> np.ndarray:
        return self._pos.copy()

    def _load_state(self, state: np.ndarray) -> None:
        self._pos[:] = state.astype(np.float32)


def numpy_vector_env(env_id: str, tasks: Sequence[Any], n_envs: int) -> NumpyGridWorldVector | NumpyArcNavigationVector:
    """The NumPy vector env of fedrl family ``env_id`` with one agent per task of ``tasks`` (fedrl parameter objects).

    :param env_id: ``"fedrl/GridWorld-v0"`` or ``"fedrl/ArcNavigation-v0"``
    :param tasks: each agent's task parameters (``GridWorldParams`` / ``ArcNavigationParams``); all
        share every field but the goal
    :param n_envs: environments per agent
    """
    if not tasks:
        raise ValueError("tasks must hold at least one task")
    goals = np.stack([np.asarray(task.goal.tolist()) for task in tasks])
    first = tasks[0]
    if env_id == "fedrl/GridWorld-v0":
        if any(t.size != first.size or t.horizon != first.horizon for t in tasks):
            raise ValueError("tasks must share size and horizon (only the goal varies between agents)")
        return NumpyGridWorldVector(goals, n_envs, size=first.size, horizon=first.horizon)
    if env_id == "fedrl/ArcNavigation-v0":
        shared = ("goal_radius", "step_size", "horizon")
        if any(getattr(t, f) != getattr(first, f) for t in tasks for f in shared):
            raise ValueError("tasks must share goal_radius, step_size and horizon (only the goal varies between agents)")
        return NumpyArcNavigationVector(goals, n_envs, first.goal_radius, first.step_size, first.horizon)
    raise ValueError(f"env_id must be 'fedrl/GridWorld-v0' or 'fedrl/ArcNavigation-v0', got {env_id!r}")
