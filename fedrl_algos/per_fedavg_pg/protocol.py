"""Per-FedAvg-PG's round by halves (Flower): Algorithm 1's local steps on the agent, the average on the server."""

from __future__ import annotations

from typing import Any

import torch

from fedrl_algos.common.round_protocol import AgentWorker, AveragingProtocol
from fedrl_algos.core.directions import local_update

__all__ = ["PerFedAvgPGProtocol"]


class PerFedAvgPGProtocol(AveragingProtocol):
    """Each agent takes τ local steps ``θ_i ← θ_i + β ∇̂F_i(θ_i)`` from the server's θ (the local
    loop of :func:`~fedrl_algos.per_fedavg_pg.update.per_fedavg_pg_round`); the server averages the
    valid local parameters (client sampling by the model's ``agents_per_round``)."""

    def local_steps(self, worker: AgentWorker, theta: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
        model = worker.model
        return local_update(model.estimator, worker.federation.sampler, theta, model.step_size, model.local_steps)
