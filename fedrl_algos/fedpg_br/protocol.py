"""FedPG-BR's round by halves (Flower): agents report gradients and spreads; the server filters and runs SCSG."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrl_algos.common.round_protocol import (
    AgentReply,
    AgentWorker,
    RoundProtocol,
    RoundReplies,
    merge_checks,
    message_tensor,
    stack_replies,
)
from fedrl_algos.core.attacks import attack_streams
from fedrl_algos.core.federation import Federation
from fedrl_envs.rng import RandomStreams

__all__ = ["FedPGBRProtocol"]


class FedPGBRProtocol(RoundProtocol):
    """FedPG-BR: every agent reports its gradient estimate and spread at the server's θ̃ (a
    Byzantine agent runs its attack); the server filters, averages and runs the SCSG loop on its
    own environment."""

    accepts_aggregate = True

    @classmethod
    def assumed_faulty_agents(cls, model: Any) -> int:
        return len(model.byzantine_agents)

    def __init__(self, model: Any, aggregate: Any = None) -> None:
        super().__init__(model)
        #: a robust aggregation replacing FedPG-BR's filter (e.g. :func:`fedrl_algos.flower.robust.flower_aggregator`); ``None``: the filter
        self.aggregate = aggregate
        self._kept: torch.Tensor | None = None

    def agent_streams(self, federation: Federation) -> list[RandomStreams]:
        noise = federation.__dict__.get("_flower_noise_streams")
        if noise is None:
            noise = self.model.noise_streams if federation is self.model.federation else attack_streams(federation.streams)
            federation._flower_noise_streams = noise
        return [federation.streams, noise]

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        model = self.model
        if model.update.attack.colluding:
            raise ValueError(f"attack {model.update.attack.name!r} pools the Byzantine agents' gradients; one Flower client cannot run it")
        if "_flower_uniform" not in model.__dict__:
            model._flower_uniform = model.federation.server_streams.uniform((2,), dtype=torch.float64)
        batch = model.update.batch_size(model._flower_uniform)
        config = {"batch-size": int(batch[0]), "byzantine": bool(model.byzantine_mask[agent])}
        return {"theta": self._theta_message(model.policy.theta)}, config

    def _agent_update(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        model = worker.model
        theta = message_tensor(arrays, "theta", model.policy.theta).reshape(1, -1)
        batch = torch.tensor([int(config["batch-size"])], device=theta.device)
        byzantine = torch.tensor([bool(config["byzantine"])], device=theta.device)
        noise = self.agent_streams(worker.federation)[1]
        grads, spread, returns, env_steps = model.update.agent_gradients(worker.federation.sampler, theta, batch, byzantine, noise)
        metrics = {"num-trajectories": float(config["batch-size"]), "return": float(returns[0, 0]), "env-steps": float(env_steps[0, 0])}
        return AgentReply(worker.agent, {"gradient": grads[0, 0].cpu().numpy(), "spread": spread[0, :1].cpu().numpy()}, metrics)

    def _server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        model = self.model
        theta = model.policy.theta.detach().unsqueeze(0)
        n = int(model.n_agents)
        uniform = model.__dict__.pop("_flower_uniform")
        grads, check_g = stack_replies(replies, "gradient", n, theta, (theta.shape[-1],))
        spread, check_s = stack_replies(replies, "spread", n, theta, (1,))
        check = merge_checks(check_g, check_s)
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        spread = torch.where(check.valid, spread[..., 0], torch.ones_like(spread[..., 0]))
        got = replies.replies
        returns = torch.tensor([[got[a].metrics.get("return", 0.0) if a in got else 0.0 for a in range(n)]], dtype=theta.dtype)
        env_steps = torch.tensor([[got[a].metrics.get("env-steps", 0.0) if a in got else 0.0 for a in range(n)]], dtype=theta.dtype)
        batch = model.update.batch_size(uniform)
        if not check.all_valid:
            grads = torch.where(check.valid.unsqueeze(-1), grads, torch.full_like(grads, float("nan")))  # server_phase rejects them
        server_critic = model.update.server_critic
        if server_critic is not None:  # the server's own critic stays on the server (its inner loop)
            server_critic.state = model._critic_of("server")
        new_theta, info = model.update.server_phase(
            theta, grads, spread, returns, env_steps, batch, uniform, model.server_sampler, model.optimizer_state, self._merged_reject(check),
            aggregate=self.aggregate,
        )
        if server_critic is not None:
            model._keep_critic(server_critic.state, "server")
        model._store_round(new_theta, info)
        self._kept = info["kept"]
        accepted = check.valid & info["valid"] if "valid" in info else check.valid
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons,
                "accepted": accepted[0].nonzero().reshape(-1).tolist()}

    def agent_critic_gradient(self, worker: AgentWorker) -> Any:
        return worker.model.update.agent_critic

    def critic_weights(self, accepted: torch.Tensor) -> torch.Tensor | None:
        return self._kept & accepted  # as in one process: the agents the filter kept
