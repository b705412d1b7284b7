"""Per-agent update directions (strategy objects), the local loop and server aggregation.

An estimator maps ``(sampler, theta [*B, d])`` to an ascent direction ``[*B, d]``, drawing fresh
trajectories through the sampler. The three directions of Algorithm 1 of the Per-FedAvg-PG paper:

* :class:`ExactMetaGradient` — ``(I + αĤ) ĝ_out`` with ``ĝ_in`` (m_in at θ), ``θ̃ = θ + αĝ_in``,
  ``ĝ_out`` (m_out at θ̃) and ``Ĥ`` (m_h at θ) from three independent batches;
* :class:`FirstOrderMetaGradient` — ``ĝ_out`` (the Hessian-free variant, section 5);
* :class:`PolicyGradient` — one REINFORCE estimate from m trajectories at θ (FedAvg-PG uses
  ``m = m_in + m_h + m_out``; independent PG uses its own batch).

The meta-gradients' ``α`` is a non-negative number or a tensor broadcastable to θ (e.g. ``[R, 1, 1]``
for one step size per run of ``θ [R, n, d]``), so an α sweep is one batched program; a run's result
does not depend on whether its α came as a number or as its row of a tensor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedrl_algos.core.estimators import hessian_vector_product, policy_gradient
from fedrl_algos.core.rollout import Trajectories
from fedrl_envs.core import check_int

__all__ = [
    "GradientEstimator",
    "PolicyGradient",
    "FirstOrderMetaGradient",
    "ExactMetaGradient",
    "local_update",
    "aggregate",
]

SamplerFn = Callable[[torch.Tensor, int], Trajectories]


def _check_step(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return float(value)


def _check_step_or_tensor(name: str, value: float | torch.Tensor) -> float | torch.Tensor:
    """A non-negative number (as ``float``) or a floating tensor of finite non-negative values."""
    if not isinstance(value, torch.Tensor):
        return _check_step(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if not bool(torch.isfinite(value).all()) or bool((value < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0")
    return value.detach()


def _scale(alpha: float | torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``α x`` in x's dtype: a tensor α broadcasts against x (cast to x's dtype, as a number is)."""
    return alpha.to(x.dtype) * x if isinstance(alpha, torch.Tensor) else alpha * x


class GradientEstimator(ABC):
    """An ascent direction for one local step, estimated from fresh trajectories."""

    #: short name used in logs and results (``exact``, ``first_order``, ``fedavg``, ``pg``)
    name: str = ""

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


class _MetaBase(GradientEstimator):
    def __init__(self, policy, gamma: float, alpha: float | torch.Tensor, m_in: int, m_out: int) -> None:
        super().__init__(policy, gamma)
        self.alpha = _check_step_or_tensor("alpha", alpha)
        self.m_in = check_int("m_in", m_in)
        self.m_out = check_int("m_out", m_out)

    def adapted(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        """``θ̃ = θ + α ĝ_in`` from a fresh inner batch."""
        g_in = policy_gradient(self.policy, theta, sampler(theta, self.m_in), self.gamma)
        return theta + _scale(self.alpha, g_in)

    def outer_gradient(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        adapted = self.adapted(sampler, theta)
        return policy_gradient(self.policy, adapted, sampler(adapted, self.m_out), self.gamma)


class FirstOrderMetaGradient(_MetaBase):
    """Hessian-free meta-gradient ``ĝ_out`` (section 5): cost ``m_in + m_out`` per step."""

    name = "first_order"

    @property
    def trajectories_per_step(self) -> int:
        return self.m_in + self.m_out

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        return self.outer_gradient(sampler, theta)


class ExactMetaGradient(_MetaBase):
    """Exact-variant meta-gradient ``(I + αĤ) ĝ_out`` (eq. (7)): cost ``m_in + m_h + m_out``.

    ``Ĥ ĝ_out`` is a Hessian-vector product (closed form for tabular policies, autograd otherwise),
    computed in chunks of at most ``hvp_chunk`` trajectories to keep intermediates cache-sized.
    """

    name = "exact"

    def __init__(
        self, policy, gamma: float, alpha: float | torch.Tensor, m_in: int, m_h: int, m_out: int, hvp_chunk: int = 100
    ) -> None:
        super().__init__(policy, gamma, alpha, m_in, m_out)
        self.m_h = check_int("m_h", m_h)
        self.hvp_chunk = check_int("hvp_chunk", hvp_chunk)

    @property
    def trajectories_per_step(self) -> int:
        return self.m_in + self.m_h + self.m_out

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        g_out = self.outer_gradient(sampler, theta)
        if not isinstance(self.alpha, torch.Tensor) and self.alpha == 0.0:
            # The curvature term is multiplied by α: skip the Hessian batch's work, not its draws,
            # so the random streams advance exactly as for α > 0. (A tensor α computes the term for
            # every row; rows with α = 0 get g_out + 0·Ĥg_out, the same values.)
            sampler(theta, self.m_h)
            return g_out
        curvature = self.curvature(sampler, theta, g_out)
        return g_out + _scale(self.alpha, curvature)

    def curvature(self, sampler: SamplerFn, theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``Ĥ v`` from a fresh batch of ``m_h`` trajectories at θ."""
        traj = sampler(theta, self.m_h)
        if self.m_h <= self.hvp_chunk:
            return hessian_vector_product(self.policy, theta, traj, v, self.gamma)
        total = torch.zeros_like(theta)
        m_axis = theta.dim() - 1
        for start in range(0, self.m_h, self.hvp_chunk):
            part = Trajectories(*(x.narrow(m_axis, start, min(self.hvp_chunk, self.m_h - start)) for x in traj))
            total = total + hessian_vector_product(self.policy, theta, part, v, self.gamma) * part.n_trajectories
        return total / self.m_h


def local_update(
    estimator: GradientEstimator, sampler: SamplerFn, theta: torch.Tensor, beta: float, tau: int
) -> torch.Tensor:
    """``τ`` local ascent steps ``θ ← θ + β·direction(θ)`` with fresh batches: ``[*B, d]``.

    :param estimator: the direction (a :class:`GradientEstimator`)
    :param sampler: draws fresh trajectories: ``sampler(theta, m)``
    :param theta: starting parameters ``[*B, d]``
    :param beta: step size (a number, or a tensor broadcastable to ``[*B, 1]``)
    :param tau: number of steps
    """
    for _ in range(tau):
        theta = theta + beta * estimator(sampler, theta)
    return theta


def aggregate(local: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Server average over the agent axis (second to last): ``[*R, n, d] → [*R, d]``.

    :param local: agents' parameters after their local steps
    :param weights: optional non-negative weights ``[*R, n]`` (e.g. a participation mask); each
        run's weights are normalized to sum to one
    """
    if weights is None:
        return local.mean(-2)
    weights = weights.to(local.dtype)
    return (local * weights.unsqueeze(-1)).sum(-2) / weights.sum(-1, keepdim=True)
