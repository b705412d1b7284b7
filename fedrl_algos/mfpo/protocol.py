"""MFPO's round by halves (Flower): the agents' local phase, the server's global phase (eq. 6–8)."""

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
from fedrl_algos.core.optim import AdamState
from fedrl_algos.mfpo.update import MFPOState

__all__ = ["MFPOProtocol"]


class MFPOProtocol(RoundProtocol):
    """MFPO: K − 1 local momentum steps and the K-th direction on the agent (its θ^(t−1) kept in
    ``Context.state`` across rounds); the server's global phase (eq. 6–8) on the replies. With
    ``optimizer="adam"`` the agent's Adam moments travel both ways too (``adam-first``,
    ``adam-second``; the step count is the local step, which the server knows)."""

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        model = self.model
        arrays = {"theta": self._theta_message(model.policy.theta), "direction": self._theta_message(model.agent_direction[agent])}
        synced = model.__dict__.get("_flower_prev_from_agent")
        # The agent's θ^(t−1) is its own last θ^(K) unless the server replaced it (first round,
        # a rejected or skipped round, a restarted server): then it travels with the message.
        if synced is None or not bool(synced[agent]):
            arrays["theta-prev"] = self._theta_message(model.agent_theta_prev[agent])
        if model.update.optimizer == "adam":
            arrays["adam-first"] = self._theta_message(model.agent_adam_first[agent])
            arrays["adam-second"] = self._theta_message(model.agent_adam_second[agent])
        return arrays, {"local-step": int(model.local_step), "round": int(model.rounds_done)}

    def _agent_update(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        model = worker.model
        like = model.policy.theta
        theta = message_tensor(arrays, "theta", like).reshape(1, 1, -1)
        direction = message_tensor(arrays, "direction", like).reshape(1, 1, -1)
        if "theta-prev" in arrays:
            prev = message_tensor(arrays, "theta-prev", like)
        else:
            if state.get("mfpo-round") is None or int(np.asarray(state["mfpo-round"]).reshape(-1)[0]) != int(config["round"]) - 1:
                raise ValueError("MFPO agent state lost: the server did not send θ^(t-1) and this client's Context.state does not hold it")
            prev = torch.as_tensor(np.asarray(state["mfpo-theta-prev"])).to(like.device)
        step = int(config["local-step"])
        moments = None
        if model.update.optimizer == "adam":
            moments = AdamState(torch.full((1, 1), float(step), dtype=like.dtype, device=like.device),
                                message_tensor(arrays, "adam-first", like).reshape(1, 1, -1), message_tensor(arrays, "adam-second", like).reshape(1, 1, -1))
        start = MFPOState(theta, direction, prev.reshape(1, 1, -1), step, moments, worker.critic)
        theta_k, direction_k, _, info = model.update.agent_phase(worker.federation.sampler, start)
        if info.get("critic") is not None:  # the agent's critic after its K fits (returned by agent_round)
            worker.keep_critic(info["critic"])
        state["mfpo-theta-prev"] = theta_k[0, 0].cpu().numpy()
        state["mfpo-round"] = np.array([int(config["round"])], dtype=np.int64)
        metrics = {"num-trajectories": float(info["trajectories"]), "return": float(info["return"].mean()),
                   "env-steps": float(info["env_steps"].sum())}
        reply = {"theta": theta_k[0, 0].cpu().numpy(), "direction": direction_k[0, 0].cpu().numpy()}
        if moments is not None:
            reply.update({"adam-first": info["moments"].first[0, 0].cpu().numpy(), "adam-second": info["moments"].second[0, 0].cpu().numpy()})
        return AgentReply(worker.agent, reply, metrics)

    def _server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        model = self.model
        start = model.state
        like = start.theta[0, 0]
        n = int(model.n_agents)
        theta, check_t = stack_replies(replies, "theta", n, like, (like.shape[-1],))
        direction, check_d = stack_replies(replies, "direction", n, like, (like.shape[-1],))
        check = merge_checks(check_t, check_d)
        adam = model.update.optimizer == "adam"
        if adam:
            first, check_f = stack_replies(replies, "adam-first", n, like, (like.shape[-1],))
            second, check_s = stack_replies(replies, "adam-second", n, like, (like.shape[-1],))
            check = merge_checks(merge_checks(check, check_f), check_s)
        if not self._enough(check, min_replies):
            self._flower_prev(torch.zeros(n, dtype=torch.bool))
            return self._skip(check, min_replies)

        def usable(x: torch.Tensor) -> torch.Tensor:  # unusable rows become NaN, which the global phase rejects as in one process
            return x if check.all_valid else torch.where(check.valid.unsqueeze(-1), x, torch.full_like(x, float("nan")))

        theta, direction = usable(theta), usable(direction)
        step = model.local_step + model.local_steps
        moments = None
        if adam:  # the agents took K − 1 Adam steps since the last global phase
            moments = AdamState(torch.full((1, n), float(step - 1), dtype=like.dtype, device=like.device), usable(first), usable(second))
        new = model.update.global_phase(theta, direction, step, start, on_reject=self._merged_reject(check), moments=moments)
        got = replies.replies
        steps = [got[a].metrics.get("env-steps", 0.0) for a in sorted(got)]
        alpha = float(model.update.step_size(step))
        returns = torch.tensor([got[a].metrics.get("return", float("nan")) for a in sorted(got)])
        info = {"return": returns, "alpha": alpha, "nu": float(model.update.momentum(step, alpha)),
                "weight_mean": None, "weight_max": None, "clipped_fraction": None}
        model._store_round(new, info, float(np.mean(steps)) if steps else 0.0)
        self._flower_prev(check.valid[0].cpu())
        accepted = check.valid
        if adam:  # the global phase also rejects a negative second moment
            accepted = accepted & ~(second < 0).any(-1)
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons,
                "accepted": accepted[0].nonzero().reshape(-1).tolist()}

    def agent_critic_gradient(self, worker: AgentWorker) -> Any:
        return None  # the critic travels in MFPOState (see _agent_update)

    def _flower_prev(self, from_agent: torch.Tensor) -> None:
        self.model._flower_prev_from_agent = [bool(v) for v in from_agent.tolist()]
