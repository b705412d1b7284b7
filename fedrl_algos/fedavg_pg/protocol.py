"""FedAvg-PG's round by halves (Flower): K local policy-gradient steps on the agent, the average
(or the server's Adam step) on the server."""

from __future__ import annotations

from typing import Any

import torch

from fedrl_algos.common.round_protocol import AgentWorker, AveragingProtocol
from fedrl_algos.core.aggregation import UpdateCheck
from fedrl_algos.fedavg_pg.update import fedavg_local_steps, fedavg_server_step, round_step_sizes

__all__ = ["FedAvgPGProtocol"]


class FedAvgPGProtocol(AveragingProtocol):
    """Each agent takes K local steps with the round's step sizes (a schedule's α_t continues
    across rounds: the server sends its local-step count); the server averages the valid local
    parameters and, with ``server_optimizer="adam"``, takes its Adam step from the average."""

    def round_config(self) -> dict[str, Any]:
        return {"local-step": int(self.model.local_step)}

    def local_steps(self, worker: AgentWorker, theta: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
        model = worker.model
        sizes, _ = round_step_sizes(model.step_size, int(config["local-step"]), model.local_steps)
        return fedavg_local_steps(model.estimator, worker.federation.sampler, theta, sizes)

    def server_step(self, theta: torch.Tensor, average: torch.Tensor, check: UpdateCheck) -> torch.Tensor:
        model = self.model
        _, step_sum = round_step_sizes(model.step_size, model.local_step, model.local_steps)
        average, state = fedavg_server_step(theta, average, check, step_sum, model.optimizer_state, model.server_step_size)
        model._store_server_state(state)
        model.local_step += model.local_steps
        return average
