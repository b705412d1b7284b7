"""Per-agent update directions as strategy objects, and the local loop.

A :class:`GradientEstimator` maps ``(sampler, theta [*B, d])`` to an ascent direction ``[*B, d]``,
drawing fresh trajectories through the sampler; :func:`local_update` takes ``τ`` steps along it.
:class:`PolicyGradient` is the plain estimate of eq. (2) of the Per-FedAvg-PG paper from ``m``
trajectories at θ; the algorithms define their own directions (Per-FedAvg-PG's meta-gradients in
:mod:`fedrl_algos.per_fedavg_pg.update`, GPOMDP in :mod:`fedrl_algos.core.gpomdp`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedrl_algos.core.estimators import policy_gradient
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.validation import check_int, is_real

__all__ = ["GradientEstimator", "PolicyGradient", "SamplerFn", "local_update", "check_step_size", "check_step_size_or_tensor", "scale"]

SamplerFn = Callable[[torch.Tensor, int], Trajectories]


def check_step_size(name: str, value: float) -> float:
    """A non-negative number (Python or NumPy) as ``float``; ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if not is_real(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return float(value)


def check_step_size_or_tensor(name: str, value: float | torch.Tensor) -> float | torch.Tensor:
    """A non-negative number (as ``float``) or a floating tensor of finite non-negative values
    (errors name the argument ``name``)."""
    if not isinstance(value, torch.Tensor):
        return check_step_size(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if not bool(torch.isfinite(value).all()) or bool((value < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0")
    return value.detach()


def scale(alpha: float | torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``α x`` in x's dtype: a tensor α broadcasts against x (cast to x's dtype, as a number is)."""
    return alpha.to(x.dtype) * x if isinstance(alpha, torch.Tensor) else alpha * x


class GradientEstimator(ABC):
    """An ascent direction for one local step, estimated from fresh trajectories."""

    #: short name used in logs and results (``exact``, ``first_order``, ``fedavg``, ``pg``)
    name: str = ""
    #: whether the estimator holds settings per agent of the federation (e.g. which agents are
    #: Byzantine), so that it needs the whole ``[R, n]`` batch: client sampling then computes every
    #: agent and masks the aggregate instead of computing only the sampled ones
    per_agent_state: ClassVar[bool] = False

    def __init__(self, policy, gamma: float) -> None:
        self.policy = policy
        self.gamma = float(gamma)

    @property
    @abstractmethod
    def trajectories_per_step(self) -> int:
        """Trajectories one call draws per agent (the paper's per-step sampling cost)."""

    @abstractmethod
    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        """Direction ``[*B, d]`` at ``theta [*B, d]``."""


@dataclass(init=False)
class PolicyGradient(GradientEstimator):
    """Plain policy gradient from ``m`` trajectories at θ (FedAvg-PG, independent PG)."""

    m: int
    name = "pg"

    def __init__(self, policy, gamma: float, m: int, name: str = "pg") -> None:
        super().__init__(policy, gamma)
        self.m = check_int("m", m)
        self.name = name

    @property
    def trajectories_per_step(self) -> int:
        return self.m

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        return policy_gradient(self.policy, theta, sampler(theta, self.m), self.gamma)


def local_update(
    estimator: GradientEstimator, sampler: SamplerFn, theta: torch.Tensor, step_size: float | torch.Tensor, local_steps: int
) -> torch.Tensor:
    """``τ`` local ascent steps ``θ ← θ + β·direction(θ)`` with fresh batches: ``[*B, d]``.

    :param estimator: the direction (a :class:`GradientEstimator`)
    :param sampler: draws fresh trajectories: ``sampler(theta, m)``
    :param theta: starting parameters ``[*B, d]``
    :param step_size: β, the step size (a number, or a tensor broadcastable to ``[*B, 1]``)
    :param local_steps: τ, the number of steps
    """
    for _ in range(local_steps):
        theta = theta + step_size * estimator(sampler, theta)
    return theta


