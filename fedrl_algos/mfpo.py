"""MFPO: momentum-assisted federated policy optimization.

Paper: "Momentum-Based Federated Reinforcement Learning with Interaction and Communication
Efficiency" (MFPO), section IV, eq. (3)–(8) and Algorithm 1; experimental settings of section VI-A3.
Docs: ``docs/algorithms/mfpo.md``.

The math is a small batched functional core over ``[*R, n, d]`` (runs, agents, parameters):
:func:`momentum_direction` (eq. 3), :func:`server_step` (eq. 6–7) and :class:`MFPOUpdate`, which
runs local steps and rounds from a :class:`MFPOState`. :class:`MFPO` is the SB3-style shell over
one run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from fedrl_algos.base import FederatedAlgorithm
from fedrl_algos.core.gpomdp import (
    BASELINES,
    ESTIMATORS,
    ScoreFunctionGradient,
    paired_gradients,
    score_gradient,
)
from fedrl_algos.core.meta import aggregate
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.core import check_int

__all__ = [
    "MFPO",
    "MFPOState",
    "MFPOUpdate",
    "ExponentialStepSize",
    "MomentumSchedule",
    "momentum_direction",
    "server_step",
    "evaluate_server_policy",
]


# --- schedules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExponentialStepSize:
    """``α_t = min(initial · growth^t, maximum)`` for local step ``t = 1, 2, …``.

    The defaults are the paper's experimental step size ``α_t = 1e-4 × 0.99^(−t)`` (section VI-A3),
    which *grows* by 1 % a step, with a cap that the paper does not have: uncapped, α_t passes
    0.01 near t = 460 and a CartPole federation that had reached ~495 collapsed (measured; see the
    docs page). The cap ``maximum=1e-3`` is reached at t = 230.

    :param initial: α_0
    :param growth: factor per step (``1/0.99``: the paper; ``< 1``: a decaying schedule)
    :param maximum: cap on α_t (``None``: none)
    """

    initial: float = 1e-4
    growth: float = 1 / 0.99
    maximum: float | None = 1e-3

    def __call__(self, t: int) -> float:
        if self.initial <= 0:
            return 0.0
        # In log space: growth^t overflows a float near t = 70,000 at growth = 1/0.99.
        log_alpha = math.log(self.initial) + t * math.log(self.growth)
        alpha = math.exp(log_alpha) if log_alpha < 709.0 else math.inf
        return alpha if self.maximum is None else min(alpha, self.maximum)


@dataclass(frozen=True)
class MomentumSchedule:
    """``ν_t = clip(1 − c · α_t^power, 0, 1)``.

    The defaults (``c=3``, ``power=1``) are the paper's experimental setting ``ν = 1 − 3α``
    (section VI-A3); Theorem 1 uses ``ν_{t+1} = 1 − c_ν α_t²`` (``power=2`` with ``c = c_ν``).

    :param c: the constant c
    :param power: exponent of α_t
    """

    c: float = 3.0
    power: float = 1.0

    def __call__(self, t: int, alpha: float) -> float:
        return min(max(1.0 - self.c * alpha**self.power, 0.0), 1.0)


def _constant(value: float) -> Callable[..., float]:
    def schedule(*_: Any) -> float:
        return value

    return schedule


def _as_step_size(value: Any) -> Callable[[int], float]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not value >= 0:
            raise ValueError(f"step_size must be >= 0, got {value}")
        return _constant(float(value))
    if callable(value):
        return value
    raise TypeError(f"step_size must be a number or a callable t -> α_t, got {type(value).__name__}")


def _as_momentum(value: Any) -> Callable[[int, float], float]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {value}")
        return _constant(float(value))
    if callable(value):
        return value
    raise TypeError(f"momentum must be a number in [0, 1] or a callable (t, α_t) -> ν_t, got {type(value).__name__}")


# --- functional core --------------------------------------------------------------------------
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
    """Eq. (3): ``ũ_t = ν_t (ũ_{t−1} − (1/D)Σ w·g(θ_{t−1})) + (1/D)Σ g(θ_t)``."""
    return nu * (direction_prev - g_prev_weighted) + g


def server_step(
    theta_local: torch.Tensor, direction_local: torch.Tensor, step_size: float, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (6)–(7): average parameters and directions over agents, then ``θ̄ ← θ̄ + α ū``.

    :param theta_local: agents' parameters ``[*R, n, d]``
    :param direction_local: agents' directions ``[*R, n, d]``
    :param step_size: α_t
    :param weights: optional per-agent weights ``[*R, n]`` (see :func:`~fedrl_algos.core.aggregate`)
    :return: ``(θ̄^(t+1) [*R, d], ū^(t) [*R, d])``, the two things broadcast by eq. (8)
    """
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
    ) -> None:
        self.policy = policy
        self.local_steps = local_steps
        self.initial = ScoreFunctionGradient(policy, gamma, initial_trajectories, estimator, baseline)
        self.local = ScoreFunctionGradient(policy, gamma, n_trajectories, estimator, baseline)
        self.step_size = step_size
        self.momentum = momentum
        self.max_importance_weight = max_importance_weight
        self.self_normalize = self_normalize

    def local_step(self, sampler, state: MFPOState) -> tuple[MFPOState, dict[str, Any]]:
        """One step ``t = state.step + 1`` of every agent (and the global phase when ``t mod K = 0``).

        :return: the new state and diagnostics: ``return`` (undiscounted return of each agent's
            batch ``[*R, n]``), ``env_steps`` ``[*R, n]``, ``trajectories`` (per agent), ``alpha``,
            ``nu``, and ``weight_mean``/``weight_max``/``clipped_fraction`` of the importance
            weights (``None`` at t = 1 or when ν_t = 0, where no weight is needed)
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
        if t % self.local_steps != 0:
            new = MFPOState(theta + alpha * direction, direction, theta, t)
        else:
            theta_bar, direction_bar = server_step(theta, direction, alpha)
            n = theta.shape[-2]
            new = MFPOState(
                theta_bar.unsqueeze(-2).expand(*theta_bar.shape[:-1], n, theta_bar.shape[-1]).clone(),
                direction_bar.unsqueeze(-2).expand_as(direction).clone(),
                theta,
                t,
            )
        return new, info

    def round(self, sampler, state: MFPOState) -> tuple[MFPOState, dict[str, Any]]:
        """K local steps ending with the global phase; ``state.step`` must be a multiple of K.

        :return: the new state and the last step's diagnostics, with ``env_steps`` and
            ``trajectories`` summed over the round
        """
        if state.step % self.local_steps != 0:
            raise ValueError(f"a round must start right after a global phase (step a multiple of {self.local_steps}), got step {state.step}")
        env_steps, trajectories = 0, 0
        for _ in range(self.local_steps):
            state, info = self.local_step(sampler, state)
            env_steps = env_steps + info["env_steps"]
            trajectories += info["trajectories"]
        info.update(env_steps=env_steps, trajectories=trajectories)
        return state, info


# --- the SB3 shell ----------------------------------------------------------------------------
class MFPO(FederatedAlgorithm):
    """Momentum-assisted federated policy optimization (MFPO).

    Every agent keeps a momentum direction ũ_i that is corrected with importance-weighted
    gradients of its previous parameters (eq. 3–4) and takes local ascent steps; every ``K``
    local steps (one communication round) the server averages parameters and directions and takes
    one more step along the averaged direction (eq. 6–8). The learned policy is the server's θ̄.
    Docs: ``docs/algorithms/mfpo.md``.

    Importance weights ``w = Π π_{t−1}/Π π_t`` are computed in log space, so they never overflow,
    and truncated at ``max_importance_weight`` (default 2: on heterogeneous CartPole untruncated
    weights reached 500 and training stalled; ``None``: exact, only the overflow guard),
    or self-normalized over each agent's batch with ``self_normalize_weights=True``.

    :param policy: ``"MlpPolicy"`` (categorical or Gaussian head), ``"TabularPolicy"`` or a
        :class:`~fedrl_algos.policies.FlatPolicy` class
    :param env: a registered fedrl id (its family's training tasks: one agent each), a task
        family, or a ``FederatedVecEnv`` on a fedrl family
    :param step_size: α_t: a number or a callable ``t -> α_t`` (default: the paper's
        ``1e-4·0.99^(−t)``, capped at 1e-3: :class:`ExponentialStepSize`)
    :param momentum: ν_t: a number in [0, 1] or a callable ``(t, α_t) -> ν_t`` (default: the paper's
        ``1 − 3α_t``: :class:`MomentumSchedule`)
    :param local_steps: K, local steps per communication round (paper: 10 on classic control)
    :param n_trajectories: D, trajectories per agent and local step (paper: 20)
    :param initial_trajectories: D̃, trajectories of the initial direction (default ``D·K``, as
        Theorem 1)
    :param estimator: ``"gpomdp"`` or ``"reinforce"``
    :param baseline: ``"loo"`` (leave-one-out, unbiased), ``"mean"`` or ``None``
    :param max_importance_weight: truncation of importance weights (default 2; ``None``: none but
        the overflow guard)
    :param self_normalize_weights: self-normalize importance weights per agent batch
    :param gamma: discount γ (paper: 0.99)
    :param eval_trajectories: Monte Carlo rollouts per agent for the logged evaluation return
        (0: off; tabular families always log the exact discounted return)
    :param policy_kwargs: keyword arguments of the policy (paper: ``net_arch=(16, 16)``,
        ``activation="relu"``)
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run (drawn at random when ``None``)
    :param device: torch device
    :param verbose: 0 silent, 1 logger output to stdout

    >>> from fedrl_algos import MFPO
    >>> model = MFPO("TabularPolicy", "fedrl/GridWorld-v0", step_size=0.5, local_steps=2, n_trajectories=4, seed=0, device="cpu")
    >>> model = model.learn(total_rounds=2)
    >>> model.local_step, model.trajectories_per_agent
    (4, 20)
    """

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        step_size: float | Callable[[int], float] = ExponentialStepSize(),
        momentum: float | Callable[[int, float], float] = MomentumSchedule(),
        local_steps: int = 10,
        n_trajectories: int = 20,
        initial_trajectories: int | None = None,
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        max_importance_weight: float | None = 2.0,
        self_normalize_weights: bool = False,
        gamma: float = 0.99,
        eval_trajectories: int = 0,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        _init_setup_model: bool = True,
    ) -> None:
        self.step_size = _as_step_size(step_size)
        self.momentum = _as_momentum(momentum)
        self.local_steps = check_int("local_steps", local_steps)
        self.n_trajectories = check_int("n_trajectories", n_trajectories)
        if initial_trajectories is None:
            initial_trajectories = self.n_trajectories * self.local_steps
        self.initial_trajectories = check_int("initial_trajectories", initial_trajectories)
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        self.estimator_name, self.baseline = estimator, baseline
        if max_importance_weight is not None and not (
            isinstance(max_importance_weight, int | float) and not isinstance(max_importance_weight, bool) and max_importance_weight >= 1.0
        ):
            raise ValueError(f"max_importance_weight must be a number >= 1 or None, got {max_importance_weight!r}")
        self.max_importance_weight = None if max_importance_weight is None else float(max_importance_weight)
        self.self_normalize_weights = bool(self_normalize_weights)
        self.local_step = 0
        self.env_steps_per_agent = 0.0
        super().__init__(
            policy,
            env,
            beta=0.0,
            tau=self.local_steps,
            alpha=0.0,
            gamma=gamma,
            eval_trajectories=eval_trajectories,
            eval_adapt_trajectories=0,
            policy_kwargs=policy_kwargs,
            tensorboard_log=tensorboard_log,
            seed=seed,
            device=device,
            verbose=verbose,
            _init_setup_model=_init_setup_model,
        )

    # --- set-up --------------------------------------------------------------------------------
    def _make_estimator(self) -> ScoreFunctionGradient:
        return ScoreFunctionGradient(self.policy, self.gamma, self.n_trajectories, self.estimator_name, self.baseline)

    def _setup_model(self) -> None:
        super()._setup_model()
        self._stop_samplers_when_done()
        self.update = MFPOUpdate(
            self.policy,
            self.gamma,
            self.local_steps,
            self.n_trajectories,
            self.initial_trajectories,
            self.step_size,
            self.momentum,
            self.estimator_name,
            self.baseline,
            self.max_importance_weight,
            self.self_normalize_weights,
        )
        d = self.policy.n_params
        if getattr(self, "agent_direction", None) is None:
            self.agent_direction = torch.zeros(self.n_agents, d, dtype=self.policy.theta.dtype)
        if getattr(self, "agent_theta_prev", None) is None:
            self.agent_theta_prev = self.policy.theta.detach().expand(self.n_agents, d).clone()
        self.agent_direction = self.agent_direction.to(self.device)
        self.agent_theta_prev = self.agent_theta_prev.to(self.device)

    def _stop_samplers_when_done(self) -> None:
        # Episodes that terminate (CartPole) end the batch's rollout early; results are unchanged.
        self.federation.sampler.stop_when_done = True
        self.federation.eval_sampler.stop_when_done = True

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        super().set_env(env, force_reset)
        self._stop_samplers_when_done()
        if self.agent_direction.shape[0] != self.n_agents:
            raise ValueError(f"env must have the model's {self.agent_direction.shape[0]} agents, got {self.n_agents}")

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()
        return state_dicts, [*variables, "agent_direction", "agent_theta_prev"]

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "update"]

    # --- training ------------------------------------------------------------------------------
    @property
    def state(self) -> MFPOState:
        """The current :class:`MFPOState` (batch ``[1, n, d]``)."""
        theta = self.policy.theta.detach().reshape(1, 1, -1).expand(1, self.n_agents, -1)
        return MFPOState(theta.clone(), self.agent_direction.unsqueeze(0), self.agent_theta_prev.unsqueeze(0), self.local_step)

    def _train_round(self) -> None:
        first = self.local_step == 0
        state, info = self.update.round(self.federation.sampler, self.state)
        self.policy.theta.data.copy_(state.theta[0, 0])
        self.agent_direction = state.direction[0].clone()
        self.agent_theta_prev = state.theta_prev[0].clone()
        self.local_step = state.step
        if first:  # the initial direction used D̃ trajectories instead of D
            self.trajectories_per_agent += self.initial_trajectories - self.n_trajectories
        self.env_steps_per_agent += float(info["env_steps"].mean())
        self._last_info = info

    def _log_round(self) -> None:
        info = getattr(self, "_last_info", None)
        if info is not None:
            self.logger.record("train/local_step", self.local_step)
            self.logger.record("train/env_steps_per_agent", self.env_steps_per_agent)
            self.logger.record("train/return", float(info["return"].mean()))
            self.logger.record("train/step_size", info["alpha"])
            self.logger.record("train/momentum", info["nu"])
            self.logger.record("train/direction_norm", float(self.agent_direction[0].norm()))
            for key in ("weight_mean", "weight_max", "clipped_fraction"):
                if info[key] is not None:
                    self.logger.record(f"train/importance_{key}", info[key])
        super()._log_round()

    def evaluate_round(self) -> dict[str, float]:
        """The server policy's average return over agents: exact (discounted) ``exact_return`` for
        tabular families; Monte Carlo undiscounted ``return`` and ``discounted_return`` when
        ``eval_trajectories > 0``."""
        return evaluate_server_policy(self)


def evaluate_server_policy(model: FederatedAlgorithm) -> dict[str, float]:
    """Evaluation metrics of a model whose learned policy is the server's θ (MFPO, FedPG-BR)."""
    theta = model.policy.theta.detach().unsqueeze(0)
    out: dict[str, float] = {}
    if model.evaluator is not None:
        out["exact_return"] = float(model.evaluator.returns(theta[0].to(torch.float64).cpu()).mean())
    if model.eval_trajectories > 0:
        traj = model.federation.eval_sampler(model.federation.broadcast(theta), model.eval_trajectories)
        out["return"] = float(traj.returns(1.0).mean())
        out["discounted_return"] = float(traj.returns(model.gamma).mean())
    return out
