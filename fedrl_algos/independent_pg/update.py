"""Independent PG's update: every agent's policy-gradient steps on its own parameters, batched."""

from __future__ import annotations

import torch

from fedrl_algos.core.directions import PolicyGradient, local_update
from fedrl_algos.core.federation import Federation

__all__ = ["independent_pg_steps"]


def independent_pg_steps(
    federation: Federation, theta: torch.Tensor, estimator: PolicyGradient, step_size: float, local_steps: int
) -> torch.Tensor:
    """``local_steps`` policy-gradient steps ``θ_i ← θ_i + β ĝ_i(θ_i)`` of every agent on its own
    parameters ``[R, n, d]``, with no communication (ĝ: the eq. (2) estimate of the Per-FedAvg-PG paper).

    :param federation: the batched federation (its agents' sampler)
    :param theta: every agent's parameters ``[R, n, d]``
    :param estimator: the policy-gradient estimate
    :param step_size: β, the step size
    :param local_steps: the steps
    """
    return local_update(estimator, federation.sampler, theta, step_size, local_steps)
