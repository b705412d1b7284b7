"""Independent PG's round by halves (Flower): each agent steps on its own parameters; the server keeps them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrl_algos.common.round_protocol import (
    AgentReply,
    AgentWorker,
    RoundProtocol,
    RoundReplies,
    message_tensor,
    stack_replies,
)
from fedrl_algos.independent_pg.update import independent_pg_steps

__all__ = ["IndependentPGProtocol"]


class IndependentPGProtocol(RoundProtocol):
    """Independent PG: every agent steps on its own parameters; the server only keeps them."""

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {"theta": self._theta_message(self.model.agent_theta[agent])}, {}

    def _agent_update(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        model = worker.model
        theta = message_tensor(arrays, "theta", model.policy.theta).reshape(1, 1, -1)
        local = independent_pg_steps(worker.federation, theta, model.estimator, model.step_size, model.local_steps)
        return AgentReply(worker.agent, {"theta": local[0, 0].cpu().numpy()}, {"num-trajectories": float(model.trajectories_per_round)})

    def _server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        model = self.model
        like = model.agent_theta.unsqueeze(0)
        local, check = stack_replies(replies, "theta", int(model.n_agents), like[0, 0], (like.shape[-1],))
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        if not check.all_valid:
            self._reject(check)
        model.agent_theta = torch.where(check.valid[0].unsqueeze(-1), local[0], model.agent_theta)
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons,
                "accepted": check.valid[0].nonzero().reshape(-1).tolist()}
