"""A heterogeneous CartPole family: Gymnasium's ``CartPole-v1`` physics with per-agent pole and cart.

The dynamics are the frictionless cart-pole of Barto, Sutton & Anderson (1983) in the corrected
form of Florian (2007), integrated with explicit Euler steps of ``TAU`` seconds, exactly as
Gymnasium's ``CartPole-v1`` does. The pole is a uniform rod of mass ``masspole`` whose centre of
mass lies ``length`` above the hinge (``length`` is the *half* pole length); the cart has mass
``masscart`` and is pushed by ``±force_mag`` newtons. Those four quantities are the task
parameters; ``total_mass`` and ``polemass_length`` are derived from them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from fedrl_envs.family import TaskFamily
from fedrl_envs.fused import numba_available
from fedrl_envs.ops import array_ops
from fedrl_envs.params import derived
from fedrl_envs.single import FamilyEnv
from fedrl_envs.validation import check_int, is_real

__all__ = [
    "CartPoleParams",
    "CartPoleFamily",
    "CartPoleEnv",
    "CARTPOLE",
    "CARTPOLE_DEFAULTS",
    "population_levels",
]

#: gravitational acceleration (m/s²)
GRAVITY = 9.8
#: seconds per step (one explicit Euler step)
TAU = 0.02
#: the episode terminates when ``|x|`` exceeds this (m)
X_THRESHOLD = 2.4
#: the episode terminates when ``|theta|`` exceeds 12 degrees (rad)
THETA_THRESHOLD = 12 * 2 * math.pi / 360
#: the 4/3 of a uniform rod's inertia (kept a named constant: the fused step applies every constant of
#: the arithmetic below in the state's precision, as torch and NumPy apply a Python float)
FOUR_THIRDS = 4.0 / 3.0
#: every state variable of a start is uniform in [-START_HALF_WIDTH, START_HALF_WIDTH)
START_WIDTH, START_HALF_WIDTH = 0.1, 0.05
#: Gymnasium's default task (agent 0), in the order of the default population's design columns
CARTPOLE_DEFAULTS: dict[str, float] = {"length": 0.5, "masspole": 0.1, "masscart": 1.0, "force_mag": 10.0}
#: multiplier of each of the 5 levels of the default-population design: 1 + 0.25·d, d ≡ level (mod 5) in {-2..2}
LEVEL_FACTORS = (1.0, 1.25, 1.5, 0.5, 0.75)
N_DEFAULT_AGENTS = 10


def population_levels(n_params: int, n_agents: int = N_DEFAULT_AGENTS) -> list[tuple[int, ...]]:
    """Level of each parameter for each agent of a default population (shared with Pendulum).

    Agent ``k = 5·b + a`` (``a, b`` in 0..4) gives parameter ``p`` (0-based) the level
    ``(a·(p + 1) + b) mod 5``. These are rows of the classic 5-level orthogonal array: agent 0 has
    every parameter at level 0 (the Gymnasium default), each parameter takes each level twice in
    10 agents, and two agents never share more than one parameter value.
    """
    if n_params > 4:
        raise ValueError(f"n_params must be <= 4 for the 5-level design, got {n_params}")
    return [tuple(((k % 5) * (p + 1) + k // 5) % 5 for p in range(n_params)) for k in range(n_agents)]


def _positive_float(name: str, value: Any) -> float:
    """``value`` as a float > 0 that float32 represents (finite, not rounded to 0); errors name ``name``.

    Shared with the Pendulum family. Accepts Python, NumPy and one-element torch numbers.
    """
    given = value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not is_real(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    with np.errstate(over="ignore", under="ignore"):
        as_float32 = float(np.float32(value))
    if not (math.isfinite(as_float32) and as_float32 > 0):
        raise ValueError(f"{name} must be a finite number > 0 (representable in float32), got {given!r}")
    return value


def _short(value: torch.Tensor) -> float:
    """(Shared with the Pendulum family.) A float32 scalar as the shortest Python float that rounds back to it (0.1, not 0.10000000149)."""
    return float(str(np.float32(value.item())))


class _DefaultPopulation:
    """Task catalogue of a classic-control family (shared with Pendulum): 10 agents around Gymnasium's task.

    Agent ``k`` gives parameter ``p`` (in ``defaults``' order) the value
    ``defaults[p] * level_factors[population_levels(...)[k][p]]``; a family's ``make_params`` keeps
    its explicit signature (the env constructors take it) and builds through :meth:`_population_params`.
    """

    #: the family's frozen parameter dataclass (tensor fields named like ``defaults``, plus ``horizon``)
    params_cls: ClassVar[type]
    #: Gymnasium's value of each task parameter (agent 0), in the order of the design's columns
    defaults: ClassVar[dict[str, float]]
    #: multiplier of each of the 5 levels of the design
    level_factors: ClassVar[tuple[float, ...]]

    def default_agent_values(self, agent: int) -> dict[str, float]:
        """Parameters of agent ``agent`` (0..9) of the default population, as Python floats."""
        levels = population_levels(len(self.defaults))[agent]
        return {name: default * self.level_factors[lv] for (name, default), lv in zip(self.defaults.items(), levels)}

    def _population_params(self, agent: int | None, horizon: int, given: dict[str, Any]) -> Any:
        """Agent ``agent``'s parameters (0 when ``None``) with the non-``None`` values of ``given`` replacing its own."""
        horizon = check_int("horizon", horizon, 0)
        agent = 0 if agent is None else check_int("agent", agent, 0, N_DEFAULT_AGENTS - 1)
        values = self.default_agent_values(agent)
        for name, value in given.items():
            if value is not None:
                values[name] = _positive_float(name, value)
        return self.params_cls(**{k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()}, horizon=horizon)

    @property
    def train_tasks(self) -> list[Any]:
        """The default population of 10 agents (see the env class's Arguments)."""
        return [self.make_params(agent=k) for k in range(N_DEFAULT_AGENTS)]  # type: ignore[attr-defined]

    def task_kwargs(self, task: Any) -> dict[str, Any]:
        return {name: _short(getattr(task, name)) for name in self.defaults} | {"horizon": task.horizon}

    def describe_task(self, task: Any) -> str:
        return ", ".join(f"{name}={_short(getattr(task, name)):g}" for name in self.defaults)


@dataclass(frozen=True)
class CartPoleParams:
    """Parameters of one CartPole task (or of a stack of tasks along a leading agent axis).

    :param length: half the pole length, i.e. hinge to the pole's centre of mass (m), float32 ``[...]``
    :param masspole: mass of the pole (kg), float32 ``[...]``
    :param masscart: mass of the cart (kg), float32 ``[...]``
    :param force_mag: magnitude of the push of either action (N), float32 ``[...]``
    :param horizon: last time index H (an episode has at most H + 1 = 500 steps by default)
    """

    length: torch.Tensor
    masspole: torch.Tensor
    masscart: torch.Tensor
    force_mag: torch.Tensor
    horizon: int = 499

    # Derived once per parameter object (the fields are never written in place): a batch's
    # kernel step then spends no operation on them.
    @derived
    def total_mass(self) -> torch.Tensor:
        """Cart plus pole (kg)."""
        return self.masspole + self.masscart

    @derived
    def polemass_length(self) -> torch.Tensor:
        """Pole mass times the hinge-to-centre-of-mass distance (kg·m)."""
        return self.masspole * self.length

    @derived
    def neg_force_mag(self) -> torch.Tensor:
        """The push of action 0 (N): ``-force_mag``."""
        return -self.force_mag

    @derived
    def two_force_mag(self) -> torch.Tensor:
        """The difference between the pushes of actions 1 and 0 (N): ``2 * force_mag``."""
        return 2.0 * self.force_mag

    def to_dtype(self, dtype: Any) -> CartPoleParams:
        """The same parameters with every array field cast to ``dtype`` (``self`` if already there).

        :param dtype: a torch dtype for tensor fields, a NumPy dtype for NumPy ones (:mod:`fedrl_envs.ops`)
        """
        if self.length.dtype == dtype:
            return self
        xp = array_ops(self.length)
        return dataclasses.replace(
            self,
            length=xp.astype(self.length, dtype),
            masspole=xp.astype(self.masspole, dtype),
            masscart=xp.astype(self.masscart, dtype),
            force_mag=xp.astype(self.force_mag, dtype),
        )


# The arithmetic of a step, written once for every backend: these take and return torch tensors,
# NumPy arrays or scalars alike (arithmetic, abs, comparisons and |), and the fused CPU step
# (fedrl_envs.fused) compiles these very functions with Numba.


def start_state(uniform):
    """Initial state variables from uniforms in [0, 1): each uniform in [-0.05, 0.05)."""
    return START_WIDTH * uniform - START_HALF_WIDTH


def push(action, neg_force_mag, two_force_mag):
    """The force of each action (0: ``-force_mag``, 1: ``+force_mag``), from the action as a float.

    Arithmetic that is exact for both actions (``0 · 2f = 0``, and ``-f + 2f = f`` by Sterbenz's
    lemma): torch's ``where`` is not vectorized on the CPU and was the costliest operation of the step.
    """
    return neg_force_mag + action * two_force_mag


def accelerations(force, cos, sin, theta_dot, total_mass, polemass_length, length, masspole):
    """Cart and pole accelerations ``(x_acc, theta_acc)`` from the push and the pole's angle and spin.

    Lagrange's equations of the frictionless cart-pole solved for the two accelerations:
    ``shared`` is the cart acceleration the force and the pole's centripetal pull would give
    without the pole's own angular acceleration; the pole's inertia about its centre of mass (a
    uniform rod: m·(2l)²/12 = m·l²/3) gives the 4/3.
    """
    shared = (force + polemass_length * theta_dot * theta_dot * sin) / total_mass
    theta_acc = (GRAVITY * sin - cos * shared) / (length * (FOUR_THIRDS - masspole * cos * cos / total_mass))
    x_acc = shared - polemass_length * theta_acc * cos / total_mass
    return x_acc, theta_acc


def euler(q, q_dot):
    """One explicit Euler step of ``TAU`` seconds."""
    return q + TAU * q_dot


def is_terminal(x, theta):
    """Whether the cart left the track or the pole fell past 12 degrees."""
    return (abs(x) > X_THRESHOLD) | (abs(theta) > THETA_THRESHOLD)


class CartPoleFamily(_DefaultPopulation, TaskFamily[CartPoleParams]):
    """Kernels and task catalogue of ``fedrl/CartPole-v0``.

    The kernel state is ``(x, x_dot, theta, theta_dot)`` (float32 in the environments); the kernels
    compute in the state's dtype, so a float64 state steps in float64.
    """

    env_id = "fedrl/CartPole-v0"
    reset_noise_dim = 4
    numpy_kernels = True
    reset_reads_params = False  # every task starts alike and observes its state
    state_as_components = True  # the kernels unbind the state into its components
    params_cls = CartPoleParams
    defaults = CARTPOLE_DEFAULTS
    level_factors = LEVEL_FACTORS

    # --- kernels -------------------------------------------------------------------------------
    def reset(self, params: CartPoleParams, noise: torch.Tensor) -> torch.Tensor:
        xp = array_ops(noise)
        return start_state(xp.astype(noise, xp.float32))

    def step(
        self, state: torch.Tensor, action: torch.Tensor, params: CartPoleParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xp = array_ops(state)
        p = params.to_dtype(state.dtype)
        x, x_dot, theta, theta_dot = xp.unbind(state)
        force = push(xp.astype(action, state.dtype), p.neg_force_mag, p.two_force_mag)
        cos, sin = xp.cos(theta), xp.sin(theta)
        x_acc, theta_acc = accelerations(force, cos, sin, theta_dot, p.total_mass, p.polemass_length, p.length, p.masspole)
        # Explicit Euler: positions advance with the old velocities, velocities with the new
        # accelerations (one stacked operation instead of four: fewer calls, the same values).
        next_state = euler(state, xp.stack((x_dot, x_acc, theta_dot, theta_acc)))
        next_x, _, next_theta, _ = xp.unbind(next_state)
        terminated = is_terminal(next_x, next_theta)
        # Reward 1 for every step, including the one that terminates.
        return next_state, xp.ones_like(next_x), terminated

    def fused_params(self, params: CartPoleParams) -> np.ndarray:
        """The rows' parameters as the compiled loops read them: float32 ``[6, N]`` (the push's two
        terms, total mass, pole mass × length, length, pole mass), packed once per parameter object
        (its fields are never written in place) and kept on it."""
        packed = params.__dict__.get("_fused_packed")
        if packed is None:
            p = params.to_dtype(torch.float32)
            fields = (p.neg_force_mag, p.two_force_mag, p.total_mass, p.polemass_length, p.length, p.masspole)
            packed = params.__dict__["_fused_packed"] = np.stack([f.detach().cpu().numpy() for f in fields])
        return packed

    def fused_step(self, state: np.ndarray, action: np.ndarray, *rest: Any) -> tuple[int, int]:
        """A whole native vector env step in one compiled call (``kernels="numba"``, :mod:`fedrl_envs.fused`).

        ``state`` is float32 components ``[4, N]``, ``action`` int64 ``[N]``; ``rest`` the env's
        step inputs and outputs in the order :meth:`FamilyVectorEnv._step_fused
        <fedrl_envs.vector.FamilyVectorEnv._step_fused>` passes them. The cosine and sine are torch's,
        so every value is bitwise what :meth:`step`, the env's time limit and its reset draw give on
        torch tensors. Returns ``(n_done, n_bad)``: rows that ended, actions out of range (then
        nothing was drawn).
        """
        theta = torch.from_numpy(state[2])
        return _fused_kernels()[0](state, action, torch.cos(theta).numpy(), torch.sin(theta).numpy(), *rest)

    def fast_step(
        self, state: torch.Tensor, action: torch.Tensor, params: CartPoleParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`step` through the compiled transition where it applies: bitwise the same values
        (NaN stays NaN), a few times faster on small batches.

        It applies to a float32 CPU state ``[N, 4]`` without gradients, integer actions ``[N]`` and
        float32 parameters of ``N`` rows without gradients, with Numba installed and the family's
        own kernels (:attr:`fused_kernels`); anything else (broadcasting shapes, float64, a subclass
        with other dynamics) is :meth:`step` itself. The algorithms' rollouts step the family
        through this method. The next state comes back laid out as components (a ``[N, 4]`` view
        of ``[4, N]``, as the torch kernel's).
        """
        n = state.shape[0] if state.dim() == 2 else -1
        if not (state.dtype == torch.float32 and state.device.type == "cpu" and not state.requires_grad
                and state.shape == (n, 4) and action.shape == (n,) and action.device.type == "cpu"
                and not action.is_floating_point() and action.dtype != torch.bool and not action.requires_grad
                and _rows_of_float32(params, n) and self.fused_kernels and numba_available()):
            return self.step(state, action, params)
        packed = self.fused_params(params)
        components = state.T if state.T.is_contiguous() else state.T.contiguous()  # one compiled layout
        next_state = np.empty((4, n), np.float32)
        reward, terminated = np.empty(n, np.float32), np.empty(n, np.bool_)
        theta = components[2]
        _fused_kernels()[1](components.numpy(), action.numpy().astype(np.int64, copy=False), torch.cos(theta).numpy(),
                            torch.sin(theta).numpy(), packed, next_state, reward, terminated)
        return torch.from_numpy(next_state).T, torch.from_numpy(reward), torch.from_numpy(terminated)

    @property
    def fused_kernels(self) -> bool:  # type: ignore[override]
        """Whether the compiled loops compute this family's dynamics: CartPole's, not a subclass's
        that overrides a kernel (the loops compile CartPole's own arithmetic)."""
        cls = type(self)
        return all(getattr(cls, name) is getattr(CartPoleFamily, name) for name in ("reset", "step", "observe"))

    # --- spaces and tasks ----------------------------------------------------------------------
    def observation_space(self, params: CartPoleParams) -> gym.Space:
        # Gymnasium's bounds: twice the termination thresholds, unbounded velocities.
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        return gym.spaces.Box(-high, high, dtype=np.float32)

    def action_space(self, params: CartPoleParams) -> gym.Space:
        return gym.spaces.Discrete(2)

    def horizon(self, params: CartPoleParams) -> int:
        return params.horizon

    def validate_state(self, state: torch.Tensor, params: CartPoleParams) -> None:
        high = torch.as_tensor(self.observation_space(params).high, dtype=state.dtype, device=state.device)
        if not bool(torch.isfinite(state).all()) or bool((state.abs() > high).any()):
            raise ValueError(
                f"state must be finite (x, x_dot, theta, theta_dot) with |x| <= {X_THRESHOLD * 2} and "
                f"|theta| <= {THETA_THRESHOLD * 2:.4f} (the observation bounds), got {state.tolist()}"
            )

    def make_params(
        self,
        agent: int | None = None,
        length: float | None = None,
        masspole: float | None = None,
        masscart: float | None = None,
        force_mag: float | None = None,
        horizon: int = 499,
    ) -> CartPoleParams:
        """Validated parameters: agent ``agent`` of the default population (0 = Gymnasium's
        defaults when ``None``), with any of ``length``, ``masspole``, ``masscart``, ``force_mag``
        given by keyword replacing that agent's value."""
        given = {"length": length, "masspole": masspole, "masscart": masscart, "force_mag": force_mag}
        return self._population_params(agent, horizon, given)


CARTPOLE = CartPoleFamily()


def _rows_of_float32(params: CartPoleParams, n: int) -> bool:
    """Whether every field of ``params`` is a float32 CPU tensor ``[n]`` without gradients (no broadcasting)."""
    return all(
        isinstance(f, torch.Tensor) and f.dtype == torch.float32 and f.device.type == "cpu" and f.shape == (n,)
        and not f.requires_grad
        for f in (params.length, params.masspole, params.masscart, params.force_mag)
    )


# --- the fused CPU step (fedrl_envs.fused) ----------------------------------------------------
# The loops below call the float32 twins of the arithmetic above and the shared parts of
# fedrl_envs.fused by global name; _fused_kernels binds those names when it compiles them (first
# use), so importing this module imports no Numba.


def _transition_loop(state, action, cos, sin, packed, next_state, reward, terminated):
    # One pass over the rows with the step function's operations in its order (so its roundings).
    for i in range(state.shape[1]):
        x, x_dot, theta, theta_dot = state[0, i], state[1, i], state[2, i], state[3, i]
        force = push32(np.float32(action[i]), packed[0, i], packed[1, i])  # noqa: F821
        x_acc, theta_acc = accelerations32(force, cos[i], sin[i], theta_dot, packed[2, i], packed[3, i],  # noqa: F821
                                           packed[4, i], packed[5, i])
        next_x, next_theta = euler32(x, x_dot), euler32(theta, theta_dot)  # noqa: F821
        next_state[0, i], next_state[2, i] = next_x, next_theta
        next_state[1, i], next_state[3, i] = euler32(x_dot, x_acc), euler32(theta_dot, theta_acc)  # noqa: F821
        reward[i] = 1.0
        terminated[i] = is_terminal32(next_x, next_theta)  # noqa: F821


def _vector_step_loop(state, action, cos, sin, packed, t, last_t, autoreset, low, high, row_agent, bases, counters,
                      golden, advance, next_state, obs, final_obs, reward, terminated, truncated, done, next_t, rows,
                      noise):
    transition(state, action, cos, sin, packed, next_state, reward, terminated)  # noqa: F821
    # The observations in passes of their own, which (unlike one loop writing everything) the
    # compiler vectorizes.
    flat_obs = obs.reshape(-1)
    rows_of_components(next_state, flat_obs)  # noqa: F821
    copy_flat(flat_obs, final_obs.reshape(-1))  # noqa: F821
    n_done, n_bad = bookkeeping(action, low, high, terminated, t, last_t, autoreset, truncated, done, next_t, rows)  # noqa: F821
    if n_bad or not autoreset or not n_done:
        return n_done, n_bad
    # The ended rows start again: their starts (observed as they are) replace the transition's.
    reset_noise(rows[:n_done], row_agent, bases, counters, golden, advance, noise)  # noqa: F821
    for j in range(n_done):
        r = rows[j]
        for k in range(4):
            value = start32(noise[j, k])  # noqa: F821
            next_state[k, r] = value
            flat_obs[4 * r + k] = value
    return n_done, n_bad


@functools.cache
def _fused_kernels():
    """The fused CartPole loops ``(vector env step, transition only)``, compiled on first use from
    the kernel's own arithmetic (:mod:`fedrl_envs.fused`)."""
    from fedrl_envs.fused import compile_loop, float32_twin, inline, kernel, kernel_sources

    arithmetic = (start_state, push, accelerations, euler, is_terminal)
    twins = dict(zip(("start32", "push32", "accelerations32", "euler32", "is_terminal32"),
                     (float32_twin(f) for f in arithmetic), strict=True))
    parts = {name: kernel(name) for name in ("bookkeeping", "reset_noise", "rows_of_components", "copy_flat")}
    sources = (*arithmetic, _transition_loop, *kernel_sources())
    transition = compile_loop(_transition_loop, twins, sources)
    vector_step = compile_loop(_vector_step_loop, twins | parts | {"transition": inline(_transition_loop, twins)}, sources)
    return vector_step, transition


class CartPoleEnv(FamilyEnv[CartPoleParams]):
    """
    ## Description

    Gymnasium's CartPole (Barto, Sutton & Anderson, 1983) as a heterogeneous family: a pole is
    hinged on a cart that moves without friction along a track, and the agent pushes the cart left
    or right to keep the pole upright. Each task has its own half pole length ``length``, pole mass
    ``masspole``, cart mass ``masscart`` and push ``force_mag``; the total mass and the pole's
    mass-length product are derived from them. Gravity (9.8 m/s²), the step of 0.02 s and the
    explicit Euler integrator are Gymnasium's and shared by all tasks. With the default parameters
    (agent 0) the environment reproduces ``CartPole-v1`` transition for transition (up to float32
    rounding: the kernels run in float32, Gymnasium in float64). The family object
    ``fedrl_envs.CARTPOLE`` lists the 10 default agents (``train_tasks``).

    ## Action Space

    ``Discrete(2)``: 0 pushes the cart to the left with ``force_mag`` newtons, 1 pushes it to the
    right.

    ## Observation Space

    ``Box(float32)`` of shape ``(4,)`` with Gymnasium's bounds: cart position x in [-4.8, 4.8],
    cart velocity (unbounded), pole angle θ in [-0.419, 0.419] rad (±24°), pole angular velocity
    (unbounded). θ = 0 is upright and grows clockwise (the pole's top moving right).

    ## Rewards

    1 for every step, including the step that terminates the episode, so the return is the
    episode length (at most 500).

    ## Starting State

    Every state variable uniform in [-0.05, 0.05).

    ## Episode End

    Terminated when |θ| > 12° or |x| > 2.4 (the cart's centre leaves the track) after a step.
    Truncated after ``horizon + 1`` steps: 500 by default (``horizon=499``), as ``CartPole-v1``.

    ## Arguments

    * ``agent``: index 0..9 of the default population below; default 0 (Gymnasium's defaults).
    * ``length`` (half pole length, m), ``masspole`` (kg), ``masscart`` (kg), ``force_mag`` (N):
      any positive value replaces the one of ``agent`` (``gym.make(id, length=0.8)`` is agent 0
      with a longer pole). Non-positive or non-finite values raise ``ValueError``.
    * ``horizon``: last time index H (an episode has H + 1 steps), default 499.
    * ``render_mode``: ``"ansi"`` (the state as text).

    The default population varies every parameter by up to ±50% around Gymnasium's value, at
    five levels ×1, ×1.25, ×1.5, ×0.5, ×0.75 (levels 0..4). Agent k = 5b + a (a, b in 0..4)
    gives the p-th parameter (length, masspole, masscart, force_mag) level (a·p + b) mod 5, with
    p = 1..4: rows of a 5-level orthogonal array, so every parameter takes every level twice and
    two agents never share more than one parameter value.

    | agent | length | masspole | masscart | force_mag |
    |---|---|---|---|---|
    | 0 | 0.5 | 0.1 | 1.0 | 10.0 |
    | 1 | 0.625 | 0.15 | 0.5 | 7.5 |
    | 2 | 0.75 | 0.075 | 1.25 | 5.0 |
    | 3 | 0.25 | 0.125 | 0.75 | 15.0 |
    | 4 | 0.375 | 0.05 | 1.5 | 12.5 |
    | 5 | 0.625 | 0.125 | 1.25 | 12.5 |
    | 6 | 0.75 | 0.05 | 0.75 | 10.0 |
    | 7 | 0.25 | 0.1 | 1.5 | 7.5 |
    | 8 | 0.375 | 0.15 | 1.0 | 5.0 |
    | 9 | 0.5 | 0.075 | 0.5 | 15.0 |

    ```python
    >>> import gymnasium as gym, fedrl_envs
    >>> env = gym.make("fedrl/CartPole-v0", agent=3)
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, env.action_space
    ((4,), Discrete(2))
    >>> params = env.unwrapped.params
    >>> params.length.item(), params.polemass_length.item()    # derived from the fields
    (0.25, 0.03125)
    >>> env.unwrapped.set_state([0.0, 0.0, 0.2, 0.0]).tolist()  # tilted 0.2 rad to the right
    [0.0, 0.0, 0.20000000298023224, 0.0]
    >>> obs, reward, terminated, truncated, info = env.step(0)  # push left: it falls further right
    >>> round(float(obs[3]), 4), reward, terminated, truncated
    (1.2539, 1.0, False, False)
    >>> _ = env.unwrapped.set_state([0.0, 0.0, 0.2, 0.0])
    >>> round(float(env.step(1)[0][3]), 4)                       # push right: the cart catches it
    -0.9935

    ```

    ## Version History

    * v0: initial version: ``CartPole-v1`` physics, termination and 500-step limit, with
      per-agent pole length, pole mass, cart mass and force magnitude.
    """

    family = CARTPOLE
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 50}

    def _render_ansi(self) -> str:
        x, x_dot, theta, theta_dot = self.state.tolist()
        return (
            f"x={x:+.3f} m  x_dot={x_dot:+.3f} m/s  theta={math.degrees(theta):+.2f} deg  "
            f"theta_dot={theta_dot:+.3f} rad/s  t={self._t}\n"
        )
