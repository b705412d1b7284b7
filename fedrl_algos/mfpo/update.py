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
from fedrl_algos.core.critic import (
    CriticState,
    FlatCritic,
    average_critics,
    check_critic_settings,
    critic_batch_weights,
)
from fedrl_algos.core.gpomdp import (
    ScoreFunctionGradient,
    check_max_importance_weight,
    check_normalize_returns,
    paired_gradients,
    score_gradient,
)
from fedrl_algos.core.optim import AdamState, adam_ascent, check_server_optimizer

__all__ = ["MFPOState", "MFPOUpdate", "adam_server_step", "ascend", "momentum_direction", "server_step"]


class MFPOState(NamedTuple):
    """Everything MFPO carries from one local step to the next; axes ``[*R, n, d]``.

    :param theta: every agent's current parameters θ_i^(t) (equal right after a global phase)
    :param direction: every agent's last direction ũ_i^(t−1)
    :param theta_prev: every agent's parameters of the last step θ_i^(t−1)
    :param step: local steps done so far (the next step is ``t = step + 1``)
    :param moments: every agent's Adam state (batch ``[*R, n]``) with ``optimizer="adam"``;
        ``None`` with the paper's plain steps
    :param critic: every agent's critic (batch ``[*R, n]``) with ``baseline="critic"``, else ``None``
    """

    theta: torch.Tensor
    direction: torch.Tensor
    theta_prev: torch.Tensor
    step: int
    moments: AdamState | None = None
    critic: CriticState | None = None

    @classmethod
    def initial(cls, theta: torch.Tensor, n_agents: int, optimizer: str = "sgd") -> MFPOState:
        """Start from server parameters ``theta [*R, d]``: every agent holds θ̄^(1) (and, with
        ``optimizer="adam"``, a zero Adam state)."""
        local = theta.unsqueeze(-2).expand(*theta.shape[:-1], n_agents, theta.shape[-1]).clone()
        moments = AdamState.zeros_like(local) if check_server_optimizer("optimizer", optimizer) == "adam" else None
        return cls(local, torch.zeros_like(local), local.clone(), 0, moments)


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
    theta_bar, direction_bar = _average((theta_local, direction_local), weights, valid)
    return theta_bar + step_size * direction_bar, direction_bar


def _average(local: tuple[torch.Tensor, ...], weights: torch.Tensor | None, valid: torch.Tensor | None) -> list[torch.Tensor]:
    """:func:`~fedrl_algos.core.aggregate` of each ``[*R, n, d]`` tensor over the valid agents (see :func:`server_step`)."""
    if valid is not None:
        w = masked_weights(valid, weights).clamp(min=0)
        w = torch.where(w.sum(-1, keepdim=True) > 0, w, torch.ones_like(w))  # skipped runs: zeros below, not 0/0
        rows = valid.unsqueeze(-1)
        local = tuple(torch.where(rows, x, torch.zeros_like(x)) for x in local)
        weights = w
    return [aggregate(x, weights) for x in local]


def ascend(
    theta: torch.Tensor, direction: torch.Tensor, step_size: float, moments: AdamState | None
) -> tuple[torch.Tensor, AdamState | None]:
    """Eq. (5) in ascent form, ``θ ← θ + α_t ũ`` (``moments`` ``None``), or an Adam step of size
    α_t along ũ (:func:`~fedrl_algos.core.optim.adam_ascent`; ``moments`` its state, batch ``theta``'s).

    :return: the new parameters and Adam state (``None`` for the plain step)
    """
    if moments is None:
        return theta + step_size * direction, None
    return adam_ascent(theta, direction, moments, step_size)


def adam_server_step(
    theta_local: torch.Tensor,
    direction_local: torch.Tensor,
    moments_local: AdamState,
    step_size: float,
    weights: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, AdamState]:
    """Eq. (6)–(7) with Adam steps: the server averages parameters, directions and the agents'
    Adam moments, then takes an Adam step of size α from the averaged ones along ``ū``.

    Arguments as :func:`server_step`, and the agents' Adam states ``moments_local`` (batch
    ``[*R, n]``; agents of a run share the step count, the largest is kept).

    :return: ``(θ̄^(t+1) [*R, d], ū^(t) [*R, d], the server's Adam state, batch [*R])``
    """
    theta_bar, direction_bar, first_bar, second_bar = _average(
        (theta_local, direction_local, moments_local.first, moments_local.second), weights, valid)
    server = AdamState(moments_local.step.amax(-1), first_bar, second_bar)
    theta_new, server = adam_ascent(theta_bar, direction_bar, server, step_size)
    return theta_new, direction_bar, server


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
    :param baseline: ``"loo"``, ``"mean"``, ``None`` or ``"linear"`` (:data:`~fedrl_algos.core.gpomdp.BASELINES`)
    :param max_importance_weight: truncation of the importance weights (``None``: only the
        overflow guard); see :func:`~fedrl_algos.core.gpomdp.importance_weights`
    :param self_normalize: self-normalize the importance weights over each agent's batch
    :param normalize_advantage: divide every batch's step weights ψ by their standard deviation
        (:func:`~fedrl_algos.core.gpomdp.normalize_step_weights`); g and the weighted g_prev of
        eq. (3) share the batch and so the divisor
    :param discounting: ``"absolute"`` (the paper's, ``R^h = Σ_{t≥h} γ^t r_t``) or ``"relative"``
        (``Σ_{t≥h} γ^(t−h) r_t``, every step weighted alike; not the gradient of J, see
        :mod:`fedrl_algos.core.gpomdp`)
    :param optimizer: ``"sgd"``: the paper's steps ``θ ← θ + α_t ũ`` (eq. 5 and 7); ``"adam"``: Adam
        steps of size α_t along ũ, the agents' Adam moments averaged by the server with the
        directions (the state's ``moments``; not the paper's, see ``docs/algorithms/mfpo.md``)
    :param critic: with ``baseline="critic"``: the value network (:class:`~fedrl_algos.core.critic.MlpCritic` or, for images, :class:`~fedrl_algos.policies.critics.CnnCritic`);
        the state's ``critic`` holds every agent's φ. Each local step weights its batch with the
        critic fitted on the earlier batches (GAE(λ), :func:`~fedrl_algos.core.critic.critic_step_weights`),
        g and the importance-weighted g_prev of eq. (3) share those weights (the same critic values),
        and only then is the critic fitted on the batch (so the λ = 1 estimate stays unbiased)
    :param gae_lambda: λ of GAE (1: unbiased)
    :param n_critic_epochs: full-batch Adam steps of the critic's fit per local step
    :param critic_learning_rate: their step size
    :param critic_aggregation: ``"local"`` (each agent keeps its φ) or ``"average"`` (the server
        averages φ, after bringing every agent to common output statistics, with θ each round)
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running steps
        before the baseline (the MFPO authors' code; :func:`~fedrl_algos.core.gpomdp.normalized_return_rewards`;
        GPOMDP only; **not an unbiased estimate of ∇J**). With ``baseline="critic"`` the critic's GAE and
        its regression targets use the normalised returns too (V estimates what it is subtracted from)
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
        optimizer: str = "sgd",
        discounting: str = "absolute",
        critic: FlatCritic | None = None,
        gae_lambda: float = 1.0,
        n_critic_epochs: int = 5,
        critic_learning_rate: float = 1e-3,
        critic_aggregation: str = "local",
        normalize_returns: bool = False,
    ) -> None:
        self.policy = policy
        self.normalize_returns = check_normalize_returns(normalize_returns, estimator)
        if baseline == "critic":
            if critic is None:
                raise ValueError("baseline='critic' needs critic (an MlpCritic or CnnCritic), got None")
            if estimator != "gpomdp":
                raise ValueError(f"baseline='critic' needs estimator='gpomdp' (GAE weights each step), got estimator={estimator!r}")
            check_critic_settings(gae_lambda, n_critic_epochs, critic_learning_rate, critic_aggregation)
            self.critic = critic
            baseline = None  # the estimators below only sample; the weights come from the critic
        else:
            self.critic = None
        self.gamma, self.discounting, self.normalize_advantage = gamma, discounting, normalize_advantage
        self.gae_lambda, self.n_critic_epochs = float(gae_lambda), n_critic_epochs
        self.critic_learning_rate, self.critic_aggregation = float(critic_learning_rate), critic_aggregation
        self.optimizer = check_server_optimizer("optimizer", optimizer)
        self.local_steps = local_steps
        self.initial = ScoreFunctionGradient(policy, gamma, initial_trajectories, estimator, baseline, normalize_advantage, discounting,
                                             normalize_returns)
        self.local = ScoreFunctionGradient(policy, gamma, n_trajectories, estimator, baseline, normalize_advantage, discounting,
                                           normalize_returns)
        self.step_size = step_size
        self.momentum = momentum
        self.max_importance_weight = check_max_importance_weight(max_importance_weight)
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
            new_theta, moments = ascend(theta, direction, alpha, self._moments(state))
            new = MFPOState(new_theta, direction, theta, t, moments)
        else:
            new = self._global_phase(theta, direction, alpha, t, state if round_start is None else round_start, on_reject,
                                     self._moments(state))
            if self.critic is not None and self.critic_aggregation == "average":
                info["critic"] = self.average_critic(info["critic"])
        return new._replace(critic=info.pop("critic", None)), info

    def average_critic(self, critic: CriticState) -> CriticState:
        """The server's rule ``critic_aggregation="average"``: every agent's output layer is brought
        to the agents' mean statistics (μ̄, σ̄; V unchanged), then φ and the fit's Adam moments are
        averaged over the agents and broadcast (batch ``[*R, n]``; :func:`~fedrl_algos.core.critic.average_critics`)."""
        return average_critics(self.critic, critic)

    def _moments(self, state: MFPOState) -> AdamState | None:
        """The agents' Adam state of ``state`` (zeros when it holds none), ``None`` for plain steps."""
        if self.optimizer != "adam":
            return None
        return state.moments if state.moments is not None else AdamState.zeros_like(state.theta)

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
            psi = self._weights(self.initial, traj, state, info)
            direction = score_gradient(self.policy, theta, traj, psi)
        else:
            traj = sampler(theta, self.local.m)
            psi = self._weights(self.local, traj, state, info)
            if nu == 0.0:
                direction = score_gradient(self.policy, theta, traj, psi)
            else:
                g, g_prev, w, clipped = paired_gradients(
                    self.policy, theta, state.theta_prev, traj, psi, self.max_importance_weight, self.self_normalize
                )
                direction = momentum_direction(g, g_prev, state.direction, nu)
                info.update(weight_mean=float(w.mean()), weight_max=float(w.max()), clipped_fraction=float(clipped.float().mean()))
        if self.critic is not None:  # fitted after the batch is weighted: batch k's critic saw batches < k only
            info["critic"] = self.critic.fit(state.critic, traj.obs, info.pop("critic_targets"), traj.mask,
                                             self.n_critic_epochs, self.critic_learning_rate)
        info["return"] = traj.rewards.sum(-1).mean(-1)
        info["env_steps"] = traj.mask.sum((-1, -2))
        info["trajectories"] = traj.n_trajectories
        return theta, direction, info

    def _weights(self, estimator: ScoreFunctionGradient, traj, state: MFPOState, info: dict[str, Any]) -> torch.Tensor:
        """ψ of a batch: the estimator's, or GAE(λ) with the state's critic (its regression targets
        kept in ``info["critic_targets"]`` for the fit after the step)."""
        if self.critic is None:
            return estimator.weights(traj)
        if state.critic is None:
            raise ValueError("baseline='critic' needs the agents' critic in the state (MFPOState.critic), got None")
        psi, info["critic_targets"] = critic_batch_weights(self.critic, state.critic, traj, self.gamma, self.gae_lambda,
                                                           self.discounting, self.normalize_returns, self.normalize_advantage)
        return psi

    def agent_phase(self, sampler, state: MFPOState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The agent side of one round (one Flower client's work): the ``K − 1`` local steps
        (eq. 5) and the direction of step K, from a state right after a global phase.

        :return: ``θ^(K)`` and ``ũ^(K)`` (what the agent sends the server), its ``θ^(K−1)``, and the
            last step's diagnostics with ``env_steps`` and ``trajectories`` summed over the round;
            with ``optimizer="adam"`` the diagnostics' ``moments`` is the agent's Adam state after
            the K − 1 steps (sent to the server too)
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
        if self.optimizer == "adam":
            info["moments"] = self._moments(state)
        return theta, direction, state.theta_prev, info

    def global_phase(
        self, theta: torch.Tensor, direction: torch.Tensor, step: int, round_start: MFPOState, on_reject: OnReject | None = None,
        moments: AdamState | None = None,
    ) -> MFPOState:
        """The server side of one round: eq. (6)–(8) from every agent's ``θ^(K)`` and ``ũ^(K)``
        ``[*R, n, d]`` at local step ``step`` (a multiple of K), and with ``optimizer="adam"`` the
        agents' Adam states ``moments`` (batch ``[*R, n]``; required then); see :meth:`local_step`
        for rejected agents."""
        if self.optimizer == "adam" and moments is None:
            raise ValueError("moments must be the agents' Adam states with optimizer='adam', got None")
        return self._global_phase(theta, direction, float(self.step_size(step)), step, round_start, on_reject,
                                  moments if self.optimizer == "adam" else None)

    def _global_phase(
        self, theta: torch.Tensor, direction: torch.Tensor, alpha: float, t: int, round_start: MFPOState, on_reject: OnReject | None,
        moments: AdamState | None = None,
    ) -> MFPOState:
        """Eq. (6)–(8) over the valid agents (see :meth:`local_step`); with ``moments`` an agent's
        Adam moments are checked too (finite, second moments not negative)."""
        like = round_start.theta[..., 0, :]
        check = validate_updates(theta, like, "parameters").merge(validate_updates(direction, like, "direction"))
        if moments is not None:
            # a negative second moment has no root: such an agent is rejected like a non-finite one
            second = torch.where(moments.second < 0, torch.full_like(moments.second, float("nan")), moments.second)
            check = check.merge(validate_updates(moments.first, like, "Adam first moment")).merge(
                validate_updates(second, like, "Adam second moment"))
        n = theta.shape[-2]

        def spread(x: torch.Tensor) -> torch.Tensor:
            return x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1]).clone()

        def spread_state(server: AdamState) -> AdamState:
            step = server.step.unsqueeze(-1).expand(*server.step.shape, n).clone()
            return AdamState(step, spread(server.first), spread(server.second))

        if check.all_valid:
            if moments is None:
                theta_bar, direction_bar = server_step(theta, direction, alpha)
                return MFPOState(spread(theta_bar), spread(direction_bar), theta, t)
            theta_bar, direction_bar, server = adam_server_step(theta, direction, moments, alpha)
            return MFPOState(spread(theta_bar), spread(direction_bar), theta, t, spread_state(server))
        (on_reject or warn_rejected)(check)
        if theta.shape != round_start.theta.shape or direction.shape != round_start.direction.shape:
            return round_start._replace(step=t)  # nothing usable: every run skips the round
        new_moments = None
        if moments is None:
            theta_bar, direction_bar = server_step(theta, direction, alpha, valid=check.valid)
        else:
            theta_bar, direction_bar, server = adam_server_step(theta, direction, moments, alpha, valid=check.valid)
            new_moments = spread_state(server)
        rows = check.valid.unsqueeze(-1)
        new_theta, new_direction = spread(theta_bar), spread(direction_bar)
        theta_prev = torch.where(rows, theta, new_theta)
        keep = check.skipped.reshape(*check.skipped.shape, 1, 1)
        if new_moments is not None and round_start.moments is not None:
            keep_step = check.skipped.unsqueeze(-1)
            new_moments = AdamState(torch.where(keep_step, round_start.moments.step, new_moments.step),
                                    torch.where(keep, round_start.moments.first, new_moments.first),
                                    torch.where(keep, round_start.moments.second, new_moments.second))
        return MFPOState(
            torch.where(keep, round_start.theta, new_theta),
            torch.where(keep, round_start.direction, new_direction),
            torch.where(keep, round_start.theta_prev, theta_prev),
            t,
            new_moments,
        )

    def round(self, sampler, state: MFPOState, on_reject: OnReject | None = None) -> tuple[MFPOState, dict[str, Any]]:
        """One round of Algorithm 1: K local steps ending with the global phase; ``state.step`` must be a
        multiple of K.

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
