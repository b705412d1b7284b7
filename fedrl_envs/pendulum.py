"""A heterogeneous Pendulum family: Gymnasium's ``Pendulum-v1`` with per-agent mass, length and gravity.

The pendulum is a uniform rod of mass ``mass`` and length ``length`` hinged at one end, under
gravity ``gravity``, driven by a torque ``u`` at the hinge. With θ measured from upright, its
moment of inertia about the hinge is ``I = mass·length²/3`` and the gravity torque is
``mass·gravity·(length/2)·sin θ``, so ``θ̈ = (mass·gravity·length/2·sin θ + u) / I``. One step of
``DT`` seconds clips the torque, updates θ̇ with that acceleration, clips θ̇ to ``MAX_SPEED`` and
then moves θ with the new θ̇ (semi-implicit Euler), the order of Gymnasium's ``Pendulum-v1``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from fedrl_envs.cartpole import _DefaultPopulation
from fedrl_envs.family import TaskFamily
from fedrl_envs.ops import array_ops
from fedrl_envs.params import derived
from fedrl_envs.single import FamilyEnv

__all__ = ["PendulumParams", "PendulumFamily", "PendulumEnv", "PENDULUM", "PENDULUM_DEFAULTS", "angle_normalize"]

#: largest torque magnitude (N·m); larger actions are clipped
MAX_TORQUE = 2.0
#: largest angular speed magnitude (rad/s); θ̇ is clipped after every step
MAX_SPEED = 8.0
#: seconds per step
DT = 0.05
#: Gymnasium's default task (agent 0), in the order of the default population's design columns;
#: ``gravity`` is Gymnasium's ``g``
PENDULUM_DEFAULTS: dict[str, float] = {"mass": 1.0, "length": 1.0, "gravity": 10.0}
#: multiplier of each of the 5 levels of the default-population design: 1 + 0.1·d, d ≡ level (mod 5) in {-2..2}
LEVEL_FACTORS = (1.0, 1.1, 1.2, 0.8, 0.9)


def angle_normalize(theta: torch.Tensor) -> torch.Tensor:
    """``theta`` wrapped to [-π, π) (the remainder takes the sign of the divisor, as Python's ``%``).

    :param theta: angles, a tensor or NumPy values (:mod:`fedrl_envs.ops`)
    """
    return array_ops(theta).remainder(theta + math.pi, 2 * math.pi) - math.pi


@dataclass(frozen=True)
class PendulumParams:
    """Parameters of one Pendulum task (or of a stack of tasks along a leading agent axis).

    :param mass: mass of the rod (kg), float32 ``[...]``
    :param length: length of the rod (m), float32 ``[...]``
    :param gravity: gravitational acceleration (m/s², Gymnasium's ``g``), float32 ``[...]``
    :param horizon: last time index H (an episode has H + 1 = 200 steps by default)
    """

    mass: torch.Tensor
    length: torch.Tensor
    gravity: torch.Tensor
    horizon: int = 199

    @derived  # once per parameter object, not at every step
    def inertia(self) -> torch.Tensor:
        """Moment of inertia of the uniform rod about its hinge, ``mass·length²/3`` (kg·m²)."""
        return self.mass * self.length * self.length / 3.0

    @derived
    def gravity_torque(self) -> torch.Tensor:
        """Gravity torque at θ = ±90°, ``mass·gravity·length/2`` (N·m): it scales as ``sin θ``."""
        return self.mass * self.gravity * self.length / 2.0

    def to_dtype(self, dtype: Any) -> PendulumParams:
        """The same parameters with every array field cast to ``dtype`` (``self`` if already there).

        :param dtype: a torch dtype for tensor fields, a NumPy dtype for NumPy ones (:mod:`fedrl_envs.ops`)
        """
        if self.mass.dtype == dtype:
            return self
        xp = array_ops(self.mass)
        return dataclasses.replace(
            self, mass=xp.astype(self.mass, dtype), length=xp.astype(self.length, dtype), gravity=xp.astype(self.gravity, dtype)
        )


class PendulumFamily(_DefaultPopulation, TaskFamily[PendulumParams]):
    """Kernels and task catalogue of ``fedrl/Pendulum-v0``.

    The kernel state is ``(theta, theta_dot)`` (float32 in the environments) with θ kept in
    [-π, π]; the kernels compute in the state's dtype.
    """

    env_id = "fedrl/Pendulum-v0"
    reset_noise_dim = 2
    numpy_kernels = True
    reset_reads_params = False  # every task starts alike; observations are (cos θ, sin θ, θ̇)
    state_as_components = True  # the kernels unbind the state into its components
    params_cls = PendulumParams
    defaults = PENDULUM_DEFAULTS
    level_factors = LEVEL_FACTORS

    # --- kernels -------------------------------------------------------------------------------
    def reset(self, params: PendulumParams, noise: torch.Tensor) -> torch.Tensor:
        # θ uniform in [-π, π), θ̇ uniform in [-1, 1).
        xp = array_ops(noise)
        u_theta, u_theta_dot = xp.unbind(xp.astype(noise, xp.float32))
        return xp.stack((math.pi * (2.0 * u_theta - 1.0), 2.0 * u_theta_dot - 1.0))

    def step(
        self, state: torch.Tensor, action: torch.Tensor, params: PendulumParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xp = array_ops(state)
        p = params.to_dtype(state.dtype)
        theta, theta_dot = xp.unbind(state)
        u = xp.clip(xp.astype(xp.unbind(action)[0], state.dtype), -MAX_TORQUE, MAX_TORQUE)
        # The cost of the state the action is taken in, and of the clipped torque.
        angle = angle_normalize(theta)
        cost = angle * angle + 0.1 * theta_dot * theta_dot + 0.001 * u * u
        theta_acc = (p.gravity_torque * xp.sin(theta) + u) / p.inertia
        next_theta_dot = xp.clip(theta_dot + theta_acc * DT, -MAX_SPEED, MAX_SPEED)
        # θ is kept in [-π, π] (Gymnasium lets it grow): observations and costs depend on θ only
        # through cos, sin and the wrapped angle, and float32 keeps its precision.
        next_theta = angle_normalize(theta + next_theta_dot * DT)
        next_state = xp.stack((next_theta, next_theta_dot))
        return next_state, -cost, xp.zeros_like(theta, dtype=xp.bool)

    def observe(self, state: torch.Tensor, params: PendulumParams) -> torch.Tensor:
        xp = array_ops(state)
        theta, theta_dot = xp.unbind(state)
        return xp.stack((xp.cos(theta), xp.sin(theta), theta_dot))

    # --- spaces and tasks ----------------------------------------------------------------------
    def observation_space(self, params: PendulumParams) -> gym.Space:
        high = np.array([1.0, 1.0, MAX_SPEED], dtype=np.float32)
        return gym.spaces.Box(-high, high, dtype=np.float32)

    def action_space(self, params: PendulumParams) -> gym.Space:
        return gym.spaces.Box(-MAX_TORQUE, MAX_TORQUE, (1,), np.float32)

    def horizon(self, params: PendulumParams) -> int:
        return params.horizon

    def validate_state(self, state: torch.Tensor, params: PendulumParams) -> None:
        if not bool(torch.isfinite(state).all()) or bool((state[..., 1].abs() > MAX_SPEED).any()):
            raise ValueError(
                f"state must be finite (theta, theta_dot) with |theta_dot| <= {MAX_SPEED}, got {state.tolist()}"
            )

    def make_params(
        self,
        agent: int | None = None,
        mass: float | None = None,
        length: float | None = None,
        gravity: float | None = None,
        horizon: int = 199,
    ) -> PendulumParams:
        """Validated parameters: agent ``agent`` of the default population (0 = Gymnasium's
        defaults when ``None``), with any of ``mass``, ``length``, ``gravity`` given by keyword
        replacing that agent's value."""
        return self._population_params(agent, horizon, {"mass": mass, "length": length, "gravity": gravity})


PENDULUM = PendulumFamily()


class PendulumEnv(FamilyEnv[PendulumParams]):
    """
    ## Description

    Gymnasium's inverted pendulum swing-up as a heterogeneous family: a rod hinged at one end
    starts at a random angle and the agent applies a torque at the hinge to swing it up and keep it
    upright. The torque (at most 2 N·m) is too weak to lift the rod directly, so it must be swung
    up. Each task has its own rod ``mass``, ``length`` and ``gravity``; the moment of inertia
    ``mass·length²/3`` and the gravity torque ``mass·gravity·length/2`` are derived from them.
    The torque limit, the speed limit (8 rad/s) and the step of 0.05 s are Gymnasium's and shared
    by all tasks. With the default parameters (agent 0) the environment reproduces
    ``Pendulum-v1`` transition for transition (up to float32 rounding: the kernels run in float32,
    Gymnasium in float64). The family object ``fedrl_envs.PENDULUM`` lists the 10 default agents
    (``train_tasks``).

    ## Action Space

    ``Box(-2.0, 2.0, (1,), float32)``: the torque at the hinge (positive increases θ). As in
    Gymnasium, a torque outside [-2, 2] is clipped to it (and the clipped torque is charged);
    non-finite actions raise ``ValueError``.

    ## Observation Space

    ``Box(float32)`` of shape ``(3,)``: ``(cos θ, sin θ, θ̇)`` in [-1, 1] × [-1, 1] × [-8, 8];
    θ = 0 is upright.

    ## Rewards

    ``-(θ² + 0.1·θ̇² + 0.001·u²)`` of the state the action is taken in, with θ wrapped to
    [-π, π) and ``u`` the clipped torque: 0 is upright and at rest with no torque, the minimum is
    about -16.27.

    ## Starting State

    θ uniform in [-π, π), θ̇ uniform in [-1, 1).

    ## Episode End

    Nothing terminates. Truncated after ``horizon + 1`` steps: 200 by default (``horizon=199``),
    as ``Pendulum-v1``.

    ## Arguments

    * ``agent``: index 0..9 of the default population below; default 0 (Gymnasium's defaults).
    * ``mass`` (kg), ``length`` (m), ``gravity`` (m/s², Gymnasium's ``g``): any positive value
      replaces the one of ``agent`` (``gym.make(id, gravity=9.81)`` is agent 0 on Earth).
      Non-positive or non-finite values raise ``ValueError``.
    * ``horizon``: last time index H (an episode has H + 1 steps), default 199.
    * ``render_mode``: ``"ansi"`` (the state as text).

    The default population varies every parameter by up to ±20% around Gymnasium's value, at
    five levels ×1, ×1.1, ×1.2, ×0.8, ×0.9 (levels 0..4), with the design of the CartPole
    family: agent k = 5b + a (a, b in 0..4) gives the p-th parameter (mass, length, gravity)
    level (a·p + b) mod 5, with p = 1..3, so every parameter takes every level twice and two
    agents never share more than one parameter value. The spread is kept at ±20% because the
    torque and speed limits are shared: Gymnasium's task needs almost all of the kinetic energy
    the speed limit allows (``mass·length²/6·8²`` ≈ 10.7 J at the bottom against
    ``mass·gravity·length`` = 10 J to lift the rod); at ±50% the heaviest rods under the
    strongest gravity can no longer be swung up, while at ±20% a simple energy-pumping
    controller swings up and balances every agent.

    | agent | mass | length | gravity |
    |---|---|---|---|
    | 0 | 1.0 | 1.0 | 10.0 |
    | 1 | 1.1 | 1.2 | 8.0 |
    | 2 | 1.2 | 0.9 | 11.0 |
    | 3 | 0.8 | 1.1 | 9.0 |
    | 4 | 0.9 | 0.8 | 12.0 |
    | 5 | 1.1 | 1.1 | 11.0 |
    | 6 | 1.2 | 0.8 | 9.0 |
    | 7 | 0.8 | 1.0 | 12.0 |
    | 8 | 0.9 | 1.2 | 10.0 |
    | 9 | 1.0 | 0.9 | 8.0 |

    ```python
    >>> import gymnasium as gym, numpy as np, fedrl_envs
    >>> env = gym.make("fedrl/Pendulum-v0", agent=4)
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, env.action_space
    ((3,), Box(-2.0, 2.0, (1,), float32))
    >>> params = env.unwrapped.params
    >>> round(params.inertia.item(), 4)                          # 0.9 * 0.8**2 / 3
    0.192
    >>> env.unwrapped.set_state([0.0, 0.0]).tolist()             # upright, at rest
    [1.0, 0.0, 0.0]
    >>> obs, reward, terminated, truncated, info = env.step(np.array([5.0], dtype=np.float32))
    >>> round(reward, 6), round(float(obs[2]), 4)                # the torque is clipped to 2
    (-0.004, 0.5208)

    ```

    ## Version History

    * v0: initial version: ``Pendulum-v1`` physics, reward and 200-step limit, with per-agent
      mass, length and gravity.
    """

    family = PENDULUM
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 20}

    def _render_ansi(self) -> str:
        theta, theta_dot = self.state.tolist()
        return f"theta={math.degrees(theta):+.2f} deg  theta_dot={theta_dot:+.3f} rad/s  t={self._t}\n"
