"""SCAFFOLD's control variates for client sampling (Karimireddy et al., 2020, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", Algorithm 1 with option II), written for ascent.

The server keeps a control ``c [R, d]`` and every agent a control ``c_i [R, n, d]``, estimates of
the average and of agent ``i``'s local direction. An agent's local steps follow the corrected
direction ``g_i(y) + c − c_i`` (:class:`CorrectedDirection`), which removes the drift of its local
steps towards its own optimum; after ``K`` steps of sizes ``β_1..β_K`` from the server's ``x``,

    c_i⁺ = c_i − c + (y_i − x) / Σ_k β_k          (option II: the average corrected direction, minus the correction)
    c⁺   = c + (1/n) Σ_{i ∈ S} (c_i⁺ − c_i)        (S: the agents whose update the server used)

so that ``c`` stays the mean of the ``c_i`` (when it starts so, e.g. at zero). The server's
parameters are aggregated as without control variates (the average of the ``y_i``, SCAFFOLD's
global step size 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedrl_algos.core.directions import GradientEstimator, SamplerFn

__all__ = ["ControlVariates", "CorrectedDirection", "agent_control_update", "server_control_update"]


def agent_control_update(
    agent: torch.Tensor, server: torch.Tensor, local: torch.Tensor, theta: torch.Tensor, step_sum: float | torch.Tensor
) -> torch.Tensor:
    """Option II of SCAFFOLD for ascent: ``c_i⁺ = c_i − c + (y_i − x) / Σ_k β_k``, ``[R, n, d]``.

    :param agent: the agents' controls ``c_i [R, n, d]``
    :param server: the server's control ``c [R, d]``
    :param local: the agents' parameters after their local steps ``y_i [R, n, d]``
    :param theta: the server's parameters the steps started from ``x [R, d]``
    :param step_sum: ``Σ_k β_k`` (a number, or a tensor broadcastable to ``[R, n, 1]``), > 0
    """
    return agent - server.unsqueeze(-2) + (local - theta.unsqueeze(-2)) / step_sum


def server_control_update(server: torch.Tensor, agent: torch.Tensor, new_agent: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """``c⁺ = c + (1/n) Σ_{i ∈ S} (c_i⁺ − c_i)`` over the agents ``used [R, n]`` (bool), ``[R, d]``.

    :param server: ``c [R, d]``
    :param agent: ``c_i [R, n, d]`` before the round
    :param new_agent: ``c_i⁺ [R, n, d]``
    :param used: the agents whose update counts (sampled and accepted by the server)
    """
    delta = torch.where(used.unsqueeze(-1), new_agent - agent, torch.zeros_like(agent))
    return server + delta.sum(-2) / agent.shape[-2]


@dataclass
class ControlVariates:
    """The server's control ``c [R, d]`` and the agents' controls ``c_i [R, n, d]``.

    The round functions (:func:`~fedrl_algos.per_fedavg_pg.update.per_fedavg_pg_round`,
    :func:`~fedrl_algos.fedavg_pg.update.fedavg_pg_round`) update it in place, as they advance the
    federation's random streams.

    :param server: ``c [R, d]``
    :param agents: ``c_i [R, n, d]`` (same dtype and device)
    """

    server: torch.Tensor
    agents: torch.Tensor

    @classmethod
    def zeros(cls, n_runs: int, n_agents: int, dim: int, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> ControlVariates:
        """Controls at zero (SCAFFOLD's initialization): the first round is the uncorrected one."""
        return cls(torch.zeros(n_runs, dim, dtype=dtype, device=device), torch.zeros(n_runs, n_agents, dim, dtype=dtype, device=device))

    def correction(self) -> torch.Tensor:
        """``c − c_i``: what each agent adds to its local direction, ``[R, n, d]``."""
        return self.server.unsqueeze(-2) - self.agents

    def check(self, theta: torch.Tensor, n_agents: int, step_sum: float | torch.Tensor) -> None:
        """Raise ``ValueError`` unless the controls fit server parameters ``theta [R, d]`` of a
        federation of ``n_agents`` agents and the local steps' sizes sum to ``> 0``."""
        runs, dim = theta.shape[0], theta.shape[-1]
        if tuple(self.server.shape) != (runs, dim) or tuple(self.agents.shape) != (runs, n_agents, dim):
            raise ValueError(f"control variates must have shapes c [{runs}, {dim}] and c_i [{runs}, {n_agents}, {dim}], "
                             f"got {list(self.server.shape)} and {list(self.agents.shape)}")
        if self.server.dtype != theta.dtype or self.agents.dtype != theta.dtype:
            raise ValueError(f"control variates must have the parameters' dtype {theta.dtype}, got {self.server.dtype} / {self.agents.dtype}")
        positive = bool((step_sum > 0).all()) if isinstance(step_sum, torch.Tensor) else step_sum > 0
        if not positive:
            raise ValueError(f"control_variates=True needs local step sizes (step_size) that sum to > 0 over a round "
                             f"(the controls divide the local progress by the sum), got {step_sum}")

    def update(self, local: torch.Tensor, theta: torch.Tensor, step_sum: float | torch.Tensor, used: torch.Tensor) -> None:
        """One round's update, in place: ``c_i ← c_i⁺`` for the agents ``used [R, n]``, then ``c ← c⁺``.

        :param local: the agents' parameters after their local steps ``[R, n, d]`` (rows not in
            ``used`` are ignored)
        :param theta: the server's parameters the round started from ``[R, d]``
        :param step_sum: ``Σ_k β_k`` of the local steps
        :param used: the agents whose update the server used (bool ``[R, n]``)
        """
        new_agents = agent_control_update(self.agents, self.server, local, theta, step_sum)
        new_agents = torch.where(used.unsqueeze(-1), new_agents, self.agents)
        self.server = server_control_update(self.server, self.agents, new_agents, used)
        self.agents = new_agents


class CorrectedDirection(GradientEstimator):
    """An estimator's direction plus a fixed correction: ``g(θ) + (c − c_i)`` (SCAFFOLD's local step).

    :param estimator: the uncorrected direction
    :param correction: ``c − c_i`` for every row of the batch the estimator is called on ``[*B, d]``
    """

    per_agent_state: ClassVar[bool] = False

    def __init__(self, estimator: GradientEstimator, correction: torch.Tensor) -> None:
        super().__init__(estimator.policy, estimator.gamma)
        self.inner = estimator
        self.correction = correction
        self.name = estimator.name

    @property
    def trajectories_per_step(self) -> int:
        return self.inner.trajectories_per_step

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        return self.inner(sampler, theta) + self.correction.to(theta.dtype)
