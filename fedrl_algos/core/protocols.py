"""What the core asks of a policy: the interface that policies implement and the core calls.

The core never inspects a policy's type. It calls these methods; :class:`fedrl_algos.policies.FlatPolicy`
gives every one an autograd (or "no fast path") default, and a policy with closed forms overrides
them next to its parametrization (:class:`~fedrl_algos.policies.TabularPolicy`, the paper's softmax
MLP). Any object with these methods works, e.g. a user's own torch policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.rng import RandomStreams

__all__ = ["FlatPolicyProtocol", "KernelRolloutPlan"]

#: ``plan(theta, streams, n_trajectories, horizon, stop_when_done)`` → trajectories, or ``None``
#: where the plan does not apply to this call (then the generic rollout runs)
KernelRolloutPlan = Callable[[torch.Tensor, RandomStreams, int, int, bool], "Trajectories | None"]


@runtime_checkable
class FlatPolicyProtocol(Protocol):
    """A stochastic policy over flat parameters ``theta [*B, d]`` (batch axes first)."""

    def log_prob(self, theta: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``log π(a | s; θ)`` ``[*B, *M]`` for ``obs [*B, *M, ...]``."""

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        """Actions ``[*B, *M, ...]`` drawn with each row's own random stream."""

    def score_gradient(self, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor) -> torch.Tensor:
        """``(1/m) Σ_j Σ_h ψ_{j,h} ∇log π(a_{j,h} | s_{j,h}; θ)`` ``[*B, d]`` for step weights ``ψ [*B, m, T]``."""

    def hvp(self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``(1/m) Σ_ξ [g(ξ) ∇log q(ξ)ᵀv + ∇²ν(ξ) v]`` ``[*B, d]`` with ``ν = Σ_h ψ_h log π(a_h|s_h)``."""

    def kernel_rollout_plan(self, family: Any, params: Any) -> KernelRolloutPlan | None:
        """A faster rollout of this policy through ``family``'s kernels on ``params``, or ``None``."""
