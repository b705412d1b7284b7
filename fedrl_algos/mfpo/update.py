"""MFPO's update: momentum directions (eq. 3–4), local steps (eq. 5) and the global phase (eq. 6–8).

Paper: "Momentum-Based Federated Reinforcement Learning with Interaction and Communication
Efficiency" (MFPO), section IV and Algorithm 1. A small batched functional core over
``[*R, n, d]`` (runs, agents, parameters): :func:`momentum_direction` (eq. 3),
:func:`server_step` (eq. 6–7) and :class:`MFPOUpdate`, which runs local steps and rounds from a
:class:`MFPOState`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from fedrl_algos.core.aggregation import OnReject, aggregate, masked_weights, validate_updates, warn_rejected
from fedrl_algos.core.gpomdp import ScoreFunctionGradient, paired_gradients, score_gradient

__all__ = ["MFPOState", "MFPOUpdate", "momentum_direction", "server_step"]


class MFPOState(NamedTuple):
    """Everything MFPO carries from one local step to the next; axes ``[*R, n, d]``.

    :param theta: every agent's current parameters θ_i^(t) (equal right after a global phase)
    :param direction: every agent's last direction ũ_i^(t−1)
    :param theta_prev: every agent's parameters of the last step θ_i^(t−1)
    :param step: local steps done so far (the next step is ``t = step + 1``)
    """

    theta: torch.Tensor
    direction: torch.Tensor
    theta_prev: torch.Tensor
    step: int

    @classmethod
    def initial(cls, theta: torch.Tensor, n_agents: int) -> MFPOState:
        """Start from server parameters ``theta [*R, d]``: every agent holds θ̄^(1)."""
        local = theta.unsqueeze(-2).expand(*theta.shape[:-1], n_agents, theta.shape[-1]).clone()
        return cls(local, torch.zeros_like(local), local.clone(), 0)


def momentum_direction(
    g: torch.Tensor, g_prev_weighted: torch.Tensor, direction_prev: torch.Tensor, nu: float
) -> torch.Tensor:
    """Eq. (3): ``ũ_t = ν_t (ũ_{t−1} − (1/D)Σ w·g(θ_{t−1})) + (1/D)Σ g(θ_t)``.

    :param g: ``(1/D)Σ g(τ; θ_t)`` ``[*R, n, d]``
    :param g_prev_weighted: ``(1/D)Σ w(τ) g(τ; θ_{t−1})`` on the same trajectories (eq. (4)'s weights)
    :param direction_prev: ``ũ_{t−1}``
    :param nu: ν_t
    """
    return nu * (direction_prev - g_prev_weighted) + g


def server_step(
    theta_local: torch.Tensor,
    direction_local: torch.Tensor,
    step_size: float,
    weights: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (6)–(7): average parameters and directions over agents, then ``θ̄ ← θ̄ + α ū``.

    :param theta_local: agents' parameters ``[*R, n, d]``
    :param direction_local: agents' directions ``[*R, n, d]``
    :param step_size: α_t
    :param weights: optional per-agent weights ``[*R, n]`` (see :func:`~fedrl_algos.core.aggregate`)
    :param valid: optional mask ``[*R, n]`` of the agents whose parameters and direction may be
        averaged (the others count with weight 0, their values never read); a run without a valid
        agent gets zeros, which the caller replaces (:meth:`MFPOUpdate.local_step` keeps the server's state)
    :return: ``(θ̄^(t+1) [*R, d], ū^(t) [*R, d])``, the two things broadcast by eq. (8)
    """
    if valid is not None:
        w = masked_weights(valid, weights).clamp(min=0)
        w = torch.where(w.sum(-1, keepdim=True) > 0, w, torch.ones_like(w))  # skipped runs: zeros below, not 0/0
        rows = valid.unsqueeze(-1)
        theta_local = torch.where(rows, theta_local, torch.zeros_like(theta_local))
        direction_local = torch.where(rows, direction_local, torch.zeros_like(direction_local))
        weights = w
    direction_bar = aggregate(direction_local, weights)
    theta_bar = aggregate(theta_local, weights)
    return theta_bar + step_size * direction_bar, direction_bar


class MFPOUpdate:
    """MFPO's local steps and rounds as one batched program (a strategy object).

    Per local step ``t`` every agent samples ``D`` trajectories with θ_i^(t) (``D̃`` at t = 1,
    where the direction is the plain estimate ``ũ^(1) = (1/D̃)Σ g(θ^(1))``), forms ũ_i^(t) by
    eq. (3), and ascends ``θ ← θ + α_t ũ`` (eq. 5 in ascent form) unless ``t mod K = 0``, when
    the server averages and steps (eq. 6–7) and both results are broadcast (eq. 8).

    :param policy: the flat policy
    :param gamma: discount
    :param local_steps: K
    :param n_trajectories: D
    :param initial_trajectories: D̃
    :param step_size: ``t -> α_t``
    :param momentum: ``(t, α_t) -> ν_t``
    :param estimator: ``"gpomdp"`` or ``"reinforce"``
    :param baseline: ``"loo"``, ``"mean"`` or ``None``
    :param max_importance_weight: truncation of the importance weights (``None``: only the
        overflow guard); see :func:`~fedrl_algos.core.gpomdp.importance_weights`
    :param self_normalize: self-normalize the importance weights over each agent's batch
    :param normalize_advantage: divide every batch's step weights ψ by their standard deviation
        (:func:`~fedrl_algos.core.gpomdp.normalize_step_weights`); g and the weighted g_prev of
        eq. (3) share the batch and so the divisor
    """

    def __init__(
        self,
        policy,
        gamma: float,
        local_steps: int,
        n_trajectories: int,
        initial_trajectories: int,
        step_size: Callable[[int], float],
        momentum: Callable[[int, float], float],
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        max_importance_weight: float | None = None,
        self_normalize: bool = False,
        normalize_advantage: bool = False,
    ) -> None:
        self.policy = policy
        self.local_steps = local_steps
        self.initial = ScoreFunctionGradient(policy, gamma, initial_trajectories, estimator, baseline, normalize_advantage)
        self.local = ScoreFunctionGradient(policy, gamma, n_trajectories, estimator, baseline, normalize_advantage)
        self.step_size = step_size
        self.momentum = momentum
        self.max_importance_weight = max_importance_weight
        self.self_normalize = self_normalize

    def local_step(
        self, sampler, state: MFPOState, round_start: MFPOState | None = None, on_reject: OnReject | None = None
    ) -> tuple[MFPOState, dict[str, Any]]:
        """One step ``t = state.step + 1`` of every agent (and the global phase when ``t mod K = 0``).

        In the global phase the server checks every agent's parameters and direction (finite, of
        the right shape and dtype; :func:`~fedrl_algos.core.aggregation.validate_updates`) and
        averages the valid ones; a rejected agent receives the broadcast like the others (its
        ``θ^(t−1)`` becomes θ̄, so no NaN is carried into the next importance weights). A run with
        no valid agent skips the round: its state returns to ``round_start``.

        :param round_start: the state right after the last global phase (default: ``state``)
        :param on_reject: called with the check when an agent is rejected (default: a
            :class:`~fedrl_algos.core.aggregation.RejectedUpdateWarning`)
        :return: the new state and diagnostics: ``return`` (undiscounted return of each agent's
            batch ``[*R, n]``), ``env_steps`` ``[*R, n]``, ``trajectories`` (per agent), ``alpha``,
            ``nu``, and ``weight_mean``/``weight_max``/``clipped_fraction`` of the importance
            weights (``None`` at t = 1 or when ν_t = 0, where no weight is needed)
        """
        theta, direction, info = self.direction(sampler, state)
        t, alpha = state.step + 1, info["alpha"]
        if t % self.local_steps != 0:
            new = MFPOState(theta + alpha * direction, direction, theta, t)
        else:
            new = self._global_phase(theta, direction, alpha, t, state if round_start is None else round_start, on_reject)
        return new, info

    def direction(self, sampler, state: MFPOState) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """What every agent computes at step ``t = state.step + 1``: its direction ũ^(t) (eq. 3–4)
        from a fresh batch at θ^(t); no parameter moves.

        :return: ``θ^(t)``, ``ũ^(t)`` and the diagnostics of :meth:`local_step`
        """
        t = state.step + 1
        alpha = float(self.step_size(t))
        nu = float(self.momentum(t, alpha))
        theta = state.theta
        info: dict[str, Any] = {"alpha": alpha, "nu": nu, "weight_mean": None, "weight_max": None, "clipped_fraction": None}
        if t == 1:
            traj = sampler(theta, self.initial.m)
            direction = score_gradient(self.policy, theta, traj, self.initial.weights(traj))
        else:
            traj = sampler(theta, self.local.m)
            psi = self.local.weights(traj)
            if nu == 0.0:
                direction = score_gradient(self.policy, theta, traj, psi)
            else:
                g, g_prev, w, clipped = paired_gradients(
                    self.policy, theta, state.theta_prev, traj, psi, self.max_importance_weight, self.self_normalize
                )
                direction = momentum_direction(g, g_prev, state.direction, nu)
                info.update(weight_mean=float(w.mean()), weight_max=float(w.max()), clipped_fraction=float(clipped.float().mean()))
        info["return"] = traj.rewards.sum(-1).mean(-1)
        info["env_steps"] = traj.mask.sum((-1, -2))
        info["trajectories"] = traj.n_trajectories
        return theta, direction, info

    def agent_phase(self, sampler, state: MFPOState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The agent side of one round (one Flower client's work): the ``K − 1`` local steps
        (eq. 5) and the direction of step K, from a state right after a global phase.

        :return: ``θ^(K)`` and ``ũ^(K)`` (what the agent sends the server), its ``θ^(K−1)``, and the
            last step's diagnostics with ``env_steps`` and ``trajectories`` summed over the round
        """
        if state.step % self.local_steps != 0:
            raise ValueError(f"a round must start right after a global phase (step a multiple of {self.local_steps}), got step {state.step}")
        env_steps, trajectories = 0, 0
        for _ in range(self.local_steps - 1):
            state, info = self.local_step(sampler, state)
            env_steps = env_steps + info["env_steps"]
            trajectories += info["trajectories"]
        theta, direction, info = self.direction(sampler, state)
        info.update(env_steps=env_steps + info["env_steps"], trajectories=trajectories + info["trajectories"])
        return theta, direction, state.theta_prev, info

    def global_phase(
        self, theta: torch.Tensor, direction: torch.Tensor, step: int, round_start: MFPOState, on_reject: OnReject | None = None
    ) -> MFPOState:
        """The server side of one round: eq. (6)–(8) from every agent's ``θ^(K)`` and ``ũ^(K)``
        ``[*R, n, d]`` at local step ``step`` (a multiple of K); see :meth:`local_step` for rejected agents."""
        return self._global_phase(theta, direction, float(self.step_size(step)), step, round_start, on_reject)

    def _global_phase(
        self, theta: torch.Tensor, direction: torch.Tensor, alpha: float, t: int, round_start: MFPOState, on_reject: OnReject | None
    ) -> MFPOState:
        """Eq. (6)–(8) over the valid agents (see :meth:`local_step`)."""
        like = round_start.theta[..., 0, :]
        check = validate_updates(theta, like, "parameters").merge(validate_updates(direction, like, "direction"))
        n = theta.shape[-2]

        def spread(x: torch.Tensor) -> torch.Tensor:
            return x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1]).clone()

        if check.all_valid:
            theta_bar, direction_bar = server_step(theta, direction, alpha)
            return MFPOState(spread(theta_bar), spread(direction_bar), theta, t)
        (on_reject or warn_rejected)(check)
        if theta.shape != round_start.theta.shape or direction.shape != round_start.direction.shape:
            return round_start._replace(step=t)  # nothing usable: every run skips the round
        theta_bar, direction_bar = server_step(theta, direction, alpha, valid=check.valid)
        rows = check.valid.unsqueeze(-1)
        new_theta, new_direction = spread(theta_bar), spread(direction_bar)
        theta_prev = torch.where(rows, theta, new_theta)
        keep = check.skipped.reshape(*check.skipped.shape, 1, 1)
        return MFPOState(
            torch.where(keep, round_start.theta, new_theta),
            torch.where(keep, round_start.direction, new_direction),
            torch.where(keep, round_start.theta_prev, theta_prev),
            t,
        )

    def round(self, sampler, state: MFPOState, on_reject: OnReject | None = None) -> tuple[MFPOState, dict[str, Any]]:
        """K local steps ending with the global phase; ``state.step`` must be a multiple of K.

        :param on_reject: see :meth:`local_step` (a run with no valid agent returns to ``state``)
        :return: the new state and the last step's diagnostics, with ``env_steps`` and
            ``trajectories`` summed over the round
        """
        if state.step % self.local_steps != 0:
            raise ValueError(f"a round must start right after a global phase (step a multiple of {self.local_steps}), got step {state.step}")
        env_steps, trajectories = 0, 0
        start = state
        for _ in range(self.local_steps):
            state, info = self.local_step(sampler, state, start, on_reject)
            env_steps = env_steps + info["env_steps"]
            trajectories += info["trajectories"]
        info.update(env_steps=env_steps, trajectories=trajectories)
        return state, info
