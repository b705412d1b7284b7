"""Step-size and momentum schedules of the local steps (the MFPO paper's experimental settings).

MFPO and FedAvg-PG both step with ``α_t`` from a schedule; a number is a constant schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedrl_envs.validation import check_int, check_real, is_real

__all__ = ["ExponentialStepSize", "LinearStepSize", "MomentumSchedule", "ConstantSchedule", "as_step_size", "as_momentum"]


@dataclass(frozen=True)
class ExponentialStepSize:
    """``α_t = min(initial · growth^t, maximum)`` for local step ``t = 1, 2, …``.

    The defaults are the paper's experimental step size ``α_t = 1e-4 × 0.99^(−t)`` (section VI-A3),
    which *grows* by 1 % a step, with a cap that the paper does not have: uncapped, α_t passes
    0.01 near t = 460 and a CartPole federation that had reached ~495 collapsed (measured; see the
    docs page). The cap ``maximum=1e-3`` is reached at t = 230.

    :param initial: α_0, a finite number ``>= 0`` (0: the steps stop)
    :param growth: factor per step, finite ``> 0`` (``1/0.99``: the paper; ``< 1``: a decaying schedule)
    :param maximum: cap on α_t, finite ``>= 0`` (``None``: none)
    """

    initial: float = 1e-4
    growth: float = 1 / 0.99
    maximum: float | None = 1e-3

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial", check_real("initial", self.initial, 0))
        object.__setattr__(self, "growth", check_real("growth", self.growth, 0, low_inclusive=False))
        if self.maximum is not None:
            object.__setattr__(self, "maximum", check_real("maximum", self.maximum, 0))

    def __call__(self, t: int) -> float:
        if self.initial <= 0:
            return 0.0
        # In log space: growth^t overflows a float near t = 70,000 at growth = 1/0.99.
        log_alpha = math.log(self.initial) + t * math.log(self.growth)
        alpha = math.exp(log_alpha) if log_alpha < 709.0 else math.inf
        return alpha if self.maximum is None else min(alpha, self.maximum)


@dataclass(frozen=True)
class LinearStepSize:
    """``α_t = initial · max(1 − (t − 1) / steps, final)`` for local step ``t = 1, 2, …``: from
    ``initial`` down to ``initial · final`` over ``steps`` local steps, then constant (SB3's linear
    schedules, counted in local steps; not the MFPO paper's).

    A run of a known length ends on small steps, so its last evaluations measure one policy rather
    than the swings of full-size steps (MFPO with Adam steps on HalfCheetah,
    docs/reproduction_mfpo.md).

    :param initial: α_1, ``>= 0``
    :param steps: local steps of the decay, ``>= 1`` (e.g. a run's local steps)
    :param final: fraction of ``initial`` kept after them, in ``[0, 1]`` (0: the steps stop)
    """

    initial: float
    steps: int
    final: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial", check_real("initial", self.initial, 0))
        object.__setattr__(self, "steps", check_int("steps", self.steps))
        object.__setattr__(self, "final", check_real("final", self.final, 0, 1))

    def __call__(self, t: int) -> float:
        return self.initial * max(1.0 - (t - 1) / self.steps, self.final)


@dataclass(frozen=True)
class MomentumSchedule:
    """``ν_t = clip(1 − c · α_t^power, 0, 1)``.

    The defaults (``c=3``, ``power=1``) are the paper's experimental setting ``ν = 1 − 3α``
    (section VI-A3); Theorem 1 uses ``ν_{t+1} = 1 − c_ν α_t²`` (``power=2`` with ``c = c_ν``).

    :param c: the constant c, a finite number (``<= 0``: ν_t = 1, no momentum, after the clip)
    :param power: exponent of α_t, finite ``> 0`` (``<= 0`` would not decay with α_t, or divide by α_t = 0)
    """

    c: float = 3.0
    power: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "c", check_real("c", self.c))
        object.__setattr__(self, "power", check_real("power", self.power, 0, low_inclusive=False))

    def __call__(self, t: int, alpha: float) -> float:
        return min(max(1.0 - self.c * alpha**self.power, 0.0), 1.0)


@dataclass(frozen=True)
class ConstantSchedule:
    """A schedule that returns ``value`` whatever its arguments (a fixed step size or momentum).

    :param value: the constant, a number ``>= 0`` (``inf`` is accepted: its updates are non-finite, and a round rejects them)
    """

    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", check_real("value", self.value, 0, finite=False))

    def __call__(self, *_: Any) -> float:
        return self.value


def as_step_size(value: Any, name: str = "step_size") -> Callable[[int], float]:
    """A step-size schedule ``t -> α_t`` from a number ``>= 0`` (constant; Python or NumPy) or a callable;
    errors name ``name``."""
    if is_real(value):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        return ConstantSchedule(float(value))
    if callable(value):
        return value
    raise TypeError(f"{name} must be a number or a callable t -> α_t, got {type(value).__name__}")


def as_momentum(value: Any) -> Callable[[int, float], float]:
    """A momentum schedule ``(t, α_t) -> ν_t`` from a number in [0, 1] (constant; Python or NumPy) or a callable."""
    if is_real(value):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {value}")
        return ConstantSchedule(float(value))
    if callable(value):
        return value
    raise TypeError(f"momentum must be a number in [0, 1] or a callable (t, α_t) -> ν_t, got {type(value).__name__}")
