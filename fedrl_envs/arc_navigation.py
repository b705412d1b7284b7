"""The 2-D arc-navigation family of the Per-FedAvg-PG paper (appendix C.1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from fedrl_envs.family import TaskFamily
from fedrl_envs.ops import array_ops
from fedrl_envs.single import FamilyEnv
from fedrl_envs.validation import check_int, check_real, is_real

__all__ = ["ArcNavigationParams", "ArcNavigationFamily", "ArcNavigationEnv", "ARC_NAVIGATION", "row_transition"]

N_ACTIONS = 8
ARC_RADIUS = 0.8
ARC_HALF_ANGLE = 0.5
N_TRAIN_GOALS = 6


@lru_cache(maxsize=64)
def _compass(step_size: float, device: torch.device | None = None) -> torch.Tensor:
    """Move of each action, float32 ``[8, 2]`` on ``device`` (cached: built once, not once per step)."""
    # Built from Python floats so that every device gets bitwise the same float32 table.
    return torch.tensor(
        [[step_size * math.cos(2 * math.pi * k / N_ACTIONS), step_size * math.sin(2 * math.pi * k / N_ACTIONS)] for k in range(N_ACTIONS)],
        dtype=torch.float32,
        device=device,
    )


@dataclass(frozen=True)
class ArcNavigationParams:
    """Parameters of one arc-navigation task (or of a stack of tasks).

    :param goal: goal position ``(gx, gy)``, float32 tensor ``[..., 2]`` inside [-1, 1]²
    :param goal_radius: reward radius around the goal
    :param step_size: length of one compass move
    :param horizon: last time index H (an episode has H + 1 steps)
    """

    goal: torch.Tensor
    goal_radius: float = 0.2
    step_size: float = 0.15
    horizon: int = 20


def arc_angles() -> tuple[list[float], list[float]]:
    """Angles (rad) of the 6 training goals and of the 3 held-out goals."""
    train = np.linspace(-ARC_HALF_ANGLE, ARC_HALF_ANGLE, N_TRAIN_GOALS).tolist()
    # Midpoints of training goals (i, i + 1), written so that the middle one is exactly angle 0.
    heldout = [ARC_HALF_ANGLE * ((2 * i + 1) / (N_TRAIN_GOALS - 1) - 1) for i in (0, 2, 4)]
    return train, heldout


def _goal_at(angle: float) -> tuple[float, float]:
    return (ARC_RADIUS * math.cos(angle), ARC_RADIUS * math.sin(angle))


class ArcNavigationFamily(TaskFamily[ArcNavigationParams]):
    """Kernels and task catalogue of ``fedrl/ArcNavigation-v0``."""

    env_id = "fedrl/ArcNavigation-v0"
    reset_noise_dim = 2
    numpy_kernels = True
    reset_reads_params = False  # starts uniform in the square for every goal; observations are positions

    def reset(self, params: ArcNavigationParams, noise: torch.Tensor) -> torch.Tensor:
        xp = array_ops(noise)
        return 2.0 * xp.astype(noise, xp.float32) - 1.0

    def in_goal(self, position: torch.Tensor, params: ArcNavigationParams) -> torch.Tensor:
        """Whether each position lies within ``goal_radius`` of its goal (bool ``[N]``)."""
        xp = array_ops(position)
        diff = position - xp.astype(params.goal, position.dtype)
        sq_x, sq_y = xp.unbind(diff * diff)
        return sq_x + sq_y <= params.goal_radius**2  # 5x faster than .sum(-1), same values

    def step(
        self, state: torch.Tensor, action: torch.Tensor, params: ArcNavigationParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xp = array_ops(state)
        reward = xp.astype(self.in_goal(state, params), xp.float32)
        moves = xp.rows(xp.table(_compass, params.step_size, like=state), action)
        next_state = xp.clip(state + moves, -1.0, 1.0)
        return next_state, reward, xp.zeros_like(reward, dtype=xp.bool)

    def compiled_transition(self, params: ArcNavigationParams, rows: int) -> tuple[Any, tuple[Any, ...]] | None:
        """:meth:`TaskFamily.compiled_transition`: :func:`row_transition` and ``(goal [rows, 2], r², moves [8, 2])``.

        ``None`` for a subclass that overrides a kernel, float64 goals or goals that are not one per
        row (or one for all).
        """
        cls = type(self)
        if any(getattr(cls, name) is not getattr(ArcNavigationFamily, name) for name in ("reset", "step", "observe", "in_goal")):
            return None
        goal = params.goal
        if not isinstance(goal, torch.Tensor) or goal.dtype != torch.float32 or goal.device.type != "cpu" or goal.requires_grad:
            return None
        goal = goal.reshape(-1, 2)
        if goal.shape[0] not in (1, rows):
            return None
        goal = goal.expand(rows, 2).contiguous().numpy()
        # torch compares the float32 sum with the Python float r² in float32, hence the rounding here
        radius_sq = np.float32(params.goal_radius**2)
        return _compiled_row_transition(), (goal, radius_sq, _compass(params.step_size).numpy())

    def observation_space(self, params: ArcNavigationParams) -> gym.Space:
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, params: ArcNavigationParams) -> gym.Space:
        return gym.spaces.Discrete(N_ACTIONS)

    def horizon(self, params: ArcNavigationParams) -> int:
        return params.horizon

    def validate_state(self, state: torch.Tensor, params: ArcNavigationParams) -> None:
        if not bool(torch.isfinite(state).all()) or bool((state.abs() > 1.0).any()):
            raise ValueError(f"state must be a position in the box [-1, 1]², got {state.tolist()}")

    def make_params(
        self,
        agent: int | None = None,
        goal: tuple[float, float] | None = None,
        horizon: int = 20,
        goal_radius: float = 0.2,
        step_size: float = 0.15,
    ) -> ArcNavigationParams:
        """Validated parameters; ``agent`` picks training goal k (0..5), ``goal`` any point of the box."""
        if agent is not None and goal is not None:
            raise ValueError("pass either agent or goal, not both")
        horizon = check_int("horizon", horizon, 1)
        for name, value in (("goal_radius", goal_radius), ("step_size", step_size)):
            if not is_real(value):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        train, _ = arc_angles()
        if goal is None:
            agent = 0 if agent is None else check_int("agent", agent, 0, len(train) - 1)
            goal = _goal_at(train[agent])
        pair = goal.tolist() if isinstance(goal, torch.Tensor | np.ndarray) else goal
        if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2 or not all(is_real(v) for v in pair):
            raise TypeError(f"goal must be a pair (gx, gy) of real numbers (not str or bool), got {goal!r}")
        try:
            gx, gy = (check_real("goal", v) for v in pair)
        except ValueError:
            raise ValueError(f"goal must lie in the box [-1, 1]² (finite coordinates), got {goal!r}") from None
        if not (-1.0 <= gx <= 1.0 and -1.0 <= gy <= 1.0):
            raise ValueError(f"goal must lie in the box [-1, 1]², got ({gx}, {gy})")
        return ArcNavigationParams(
            goal=torch.tensor([gx, gy], dtype=torch.float32),
            goal_radius=float(goal_radius),
            step_size=float(step_size),
            horizon=int(horizon),
        )

    @property
    def train_tasks(self) -> list[ArcNavigationParams]:
        return [self.make_params(goal=_goal_at(a)) for a in arc_angles()[0]]

    @property
    def heldout_tasks(self) -> list[ArcNavigationParams]:
        """The 3 held-out goals at the interior midpoints between training goals (0,1), (2,3), (4,5)."""
        return [self.make_params(goal=_goal_at(a)) for a in arc_angles()[1]]

    def task_kwargs(self, task: ArcNavigationParams) -> dict[str, Any]:
        return {
            "goal": tuple(float(v) for v in task.goal.tolist()),
            "horizon": task.horizon,
            "goal_radius": task.goal_radius,
            "step_size": task.step_size,
        }

    def describe_task(self, task: ArcNavigationParams) -> str:
        gx, gy = task.goal.tolist()
        return f"goal=({gx:+.3f}, {gy:+.3f}) angle={math.atan2(gy, gx):+.2f} rad"


ARC_NAVIGATION = ArcNavigationFamily()


@lru_cache(maxsize=1)
def _compiled_row_transition() -> Any:
    from fedrl_envs.fused import inline

    return inline(row_transition)


def row_transition(state, i, action, row, data):
    """:meth:`ArcNavigationFamily.step` of one environment, compiled into policy rollouts
    (:meth:`ArcNavigationFamily.compiled_transition`): ``state[i]`` moves in place; ``(reward, terminated)``;
    ``data = (goal [rows, 2], r², moves [8, 2])``.

    The same float32 operations in the same order as the torch kernel (the squared distance to
    the goal ``row`` compared with r², the move of ``action`` added, the sum clipped to the box),
    so the values are bitwise the torch kernel's (``tests/test_compiled_mlp.py``).
    """
    goal, radius_sq, moves = data
    x, y = state[i, 0], state[i, 1]
    dx, dy = x - goal[row, 0], y - goal[row, 1]
    reward = np.float32(dx * dx + dy * dy <= radius_sq)
    state[i, 0] = min(max(x + moves[action, 0], np.float32(-1.0)), np.float32(1.0))
    state[i, 1] = min(max(y + moves[action, 1], np.float32(-1.0)), np.float32(1.0))
    return reward, False


class ArcNavigationEnv(FamilyEnv[ArcNavigationParams]):
    """
    ## Description

    The neural-navigation family of Per-FedAvg-PG (appendix C.1): a point moves in the box
    [-1, 1]² towards a goal on an arc of radius 0.8 spanning ±0.5 rad. Six training goals are
    evenly spaced on the arc; three held-out goals lie at the interior midpoints between training
    goals (0,1), (2,3) and (4,5). "Head toward the arc" is shared by all tasks, the exact goal is not.
    The family object ``fedrl_envs.ARC_NAVIGATION`` lists ``train_tasks`` and ``heldout_tasks``
    and makes the env of any task with ``make_env(task)``.

    ## Action Space

    ``Discrete(8)``: action k moves by 0.15·(cos 2πk/8, sin 2πk/8), then the position is clipped
    to the box.

    ## Observation Space

    ``Box(-1, 1, (2,), float32)``: the position.

    ## Rewards

    1 when the position the action is taken from lies within distance ``goal_radius`` (0.2) of the
    goal, else 0: the reward of step h is r(s_h), collected at every step spent in the goal region,
    including the first. The goal region is not absorbing.

    ## Starting State

    Uniform in the box [-1, 1]².

    ## Episode End

    Nothing terminates early; after ``horizon + 1`` steps (21 by default) ``truncated=True``.

    ## Arguments

    * ``agent``: index 0..5 of the training goal (angles ``linspace(-0.5, 0.5, 6)``); default 0.
    * ``goal``: any goal ``(gx, gy)`` in the box instead of ``agent`` (e.g. a held-out goal from
      ``fedrl_envs.ARC_NAVIGATION.heldout_tasks``).
    * ``horizon`` (default 20), ``goal_radius`` (0.2), ``step_size`` (0.15).
    * ``render_mode``: ``"ansi"`` (the position as text) or ``"rgb_array"`` (a 128 × 128 ``uint8``
      image of the box with +y up: goal region green, agent blue).

    ```python
    >>> import gymnasium as gym, fedrl_envs
    >>> env = gym.make("fedrl/ArcNavigation-v0", agent=0)
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, env.action_space
    ((2,), Discrete(8))
    >>> env.unwrapped.set_state([0.95, 0.0]).tolist()
    [0.949999988079071, 0.0]
    >>> env.step(0)[0].tolist()       # east by 0.15, clipped to the box
    [1.0, 0.0]

    ```

    ## Version History

    * v0: initial version, following appendix C.1 of the Per-FedAvg-PG paper.
    """

    family = ARC_NAVIGATION
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 8}
    #: side length in pixels of ``rgb_array`` frames
    frame_pixels: ClassVar[int] = 128

    def _render_rgb_array(self) -> np.ndarray:
        n = self.frame_pixels
        centers = (np.arange(n) + 0.5) / n * 2.0 - 1.0
        px, py = np.meshgrid(centers, centers[::-1])  # row 0 is the top of the box (y = +1)
        frame = np.full((n, n, 3), 245, dtype=np.uint8)
        gx, gy = self.params.goal.tolist()
        frame[(px - gx) ** 2 + (py - gy) ** 2 <= self.params.goal_radius**2] = (170, 225, 170)
        frame[(px - gx) ** 2 + (py - gy) ** 2 <= (2.0 / n) ** 2 * 2] = (60, 180, 75)
        ax, ay = self.state.tolist()
        frame[(px - ax) ** 2 + (py - ay) ** 2 <= 0.05**2] = (30, 90, 200)
        return frame
