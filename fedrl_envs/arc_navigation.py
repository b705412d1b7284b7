"""The 2-D arc-navigation family of the Per-FedAvg-PG paper (appendix C.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fedrl_envs.core import FamilyEnv, TaskFamily

__all__ = ["ArcNavigationParams", "ArcNavigationFamily", "ArcNavigationEnv", "ARC_NAVIGATION"]

N_ACTIONS = 8
ARC_RADIUS = 0.8
ARC_HALF_ANGLE = 0.5
N_TRAIN_GOALS = 6


def _compass(step_size: float) -> torch.Tensor:
    # Built from Python floats so that every device gets bitwise the same float32 table.
    return torch.tensor(
        [[step_size * math.cos(2 * math.pi * k / N_ACTIONS), step_size * math.sin(2 * math.pi * k / N_ACTIONS)] for k in range(N_ACTIONS)],
        dtype=torch.float32,
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
    heldout = [(train[i] + train[i + 1]) / 2 for i in (0, 2, 4)]
    return train, heldout


def _goal_at(angle: float) -> tuple[float, float]:
    return (ARC_RADIUS * math.cos(angle), ARC_RADIUS * math.sin(angle))


class ArcNavigationFamily(TaskFamily[ArcNavigationParams]):
    """Kernels and task catalogue of ``fedrl/ArcNavigation-v0``."""

    env_id = "fedrl/ArcNavigation-v0"
    reset_noise_dim = 2

    def reset(self, params: ArcNavigationParams, noise: torch.Tensor) -> torch.Tensor:
        return (2.0 * noise.to(torch.float32) - 1.0)

    def in_goal(self, position: torch.Tensor, params: ArcNavigationParams) -> torch.Tensor:
        """Whether each position lies within ``goal_radius`` of its goal (bool ``[N]``)."""
        diff = position - params.goal.to(position.dtype)
        return (diff * diff).sum(-1) <= params.goal_radius**2

    def step(
        self, state: torch.Tensor, action: torch.Tensor, params: ArcNavigationParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        reward = self.in_goal(state, params).to(torch.float32)
        moves = _compass(params.step_size).to(state.device)[action.long()]
        next_state = torch.clamp(state + moves, -1.0, 1.0)
        return next_state, reward, torch.zeros(state.shape[:-1], dtype=torch.bool, device=state.device)

    def observation_space(self, params: ArcNavigationParams) -> gym.Space:
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, params: ArcNavigationParams) -> gym.Space:
        return gym.spaces.Discrete(N_ACTIONS)

    def horizon(self, params: ArcNavigationParams) -> int:
        return params.horizon

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
        if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer):
            raise TypeError(f"horizon must be an int, got {type(horizon).__name__}")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        for name, value in (("goal_radius", goal_radius), ("step_size", step_size)):
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        train, _ = arc_angles()
        if goal is None:
            agent = 0 if agent is None else agent
            if isinstance(agent, bool) or not isinstance(agent, int | np.integer):
                raise TypeError(f"agent must be an int, got {type(agent).__name__}")
            if not 0 <= agent < len(train):
                raise ValueError(f"agent must be in [0, {len(train) - 1}], got {agent}")
            goal = _goal_at(train[agent])
        try:
            gx, gy = (float(v) for v in goal)
        except (TypeError, ValueError):
            raise TypeError(f"goal must be a pair (gx, gy) of floats, got {goal!r}") from None
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


class ArcNavigationEnv(FamilyEnv[ArcNavigationParams]):
    """
    ## Description

    The neural-navigation family of Per-FedAvg-PG (appendix C.1): a point moves in the box
    [-1, 1]² towards a goal on an arc of radius 0.8 spanning ±0.5 rad. Six training goals are
    evenly spaced on the arc; three held-out goals lie at the interior midpoints between training
    goals (0,1), (2,3) and (4,5). "Head toward the arc" is shared by all tasks, the exact goal is not.

    ## Action Space

    ``Discrete(8)``: action k moves by 0.15·(cos 2πk/8, sin 2πk/8), then the position is clipped
    to the box.

    ## Observation Space

    ``Box(-1, 1, (2,), float32)``: the position.

    ## Rewards

    1 when the position the action is taken from lies within distance 0.2 of the goal, else 0
    (collected at every step spent in the goal region, including the first).

    ## Starting State

    Uniform in the box [-1, 1]².

    ## Episode End

    Nothing terminates early; after ``horizon + 1`` steps (21 by default) ``truncated=True``.

    ## Arguments

    * ``agent``: index 0..5 of the training goal (angles ``linspace(-0.5, 0.5, 6)``); default 0.
    * ``goal``: any goal ``(gx, gy)`` in the box instead of ``agent`` (e.g. a held-out goal from
      ``fedrl_envs.ARC_NAVIGATION.heldout_tasks``).
    * ``horizon`` (default 20), ``goal_radius`` (0.2), ``step_size`` (0.15).

    ```python
    >>> import gymnasium as gym, fedrl_envs
    >>> env = gym.make("fedrl/ArcNavigation-v0", agent=0)
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, env.action_space
    ((2,), Discrete(8))

    ```

    ## Version History

    * v0: initial version, following appendix C.1 of the Per-FedAvg-PG paper.
    """

    family = ARC_NAVIGATION

    def __init__(
        self,
        agent: int | None = None,
        goal: tuple[float, float] | None = None,
        horizon: int = 20,
        goal_radius: float = 0.2,
        step_size: float = 0.15,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            render_mode=render_mode, agent=agent, goal=goal, horizon=horizon, goal_radius=goal_radius, step_size=step_size
        )
