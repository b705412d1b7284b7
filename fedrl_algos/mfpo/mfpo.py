"""MFPO: momentum-assisted federated policy optimization, the SB3-style shell.

Paper: "Momentum-Based Federated Reinforcement Learning with Interaction and Communication
Efficiency" (MFPO), section IV, eq. (3)–(8) and Algorithm 1; experimental settings of section VI-A3.
The update is :mod:`fedrl_algos.mfpo.update`. Docs: ``docs/algorithms/mfpo.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from fedrl_algos.common.agent_critic import AgentCriticMixin
from fedrl_algos.common.base_class import FederatedAlgorithm
from fedrl_algos.common.evaluation import server_policy_metrics
from fedrl_algos.common.round_protocol import RoundProtocol
from fedrl_algos.core.gpomdp import check_discounting, check_max_importance_weight, check_normalize_returns
from fedrl_algos.core.optim import AdamState, check_server_optimizer
from fedrl_algos.core.schedules import ExponentialStepSize, MomentumSchedule, as_momentum, as_step_size
from fedrl_algos.mfpo.protocol import MFPOProtocol
from fedrl_algos.mfpo.update import MFPOState, MFPOUpdate
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.validation import check_bool, check_int

__all__ = ["MFPO"]

# The paper's schedules (section VI-A3); frozen dataclasses, so one shared default is safe.
_PAPER_STEP_SIZE = ExponentialStepSize()
_PAPER_MOMENTUM = MomentumSchedule()


class MFPO(AgentCriticMixin, FederatedAlgorithm):
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
    :param env: the agents' environments: a fedrl id or task family (its training tasks, or one
        task per ``agent_kwargs`` dict), a ``FederatedVecEnv`` of either backend, or any registered
        Gymnasium id with ``agent_kwargs`` or ``n_agents``
    :param step_size: α_t: a number or a callable ``t -> α_t`` (default: the paper's
        ``1e-4·0.99^(−t)``, capped at 1e-3: :class:`ExponentialStepSize`)
    :param momentum: ν_t: a number in [0, 1] or a callable ``(t, α_t) -> ν_t`` (default: the paper's
        ``1 − 3α_t``: :class:`MomentumSchedule`)
    :param local_steps: K, local steps per communication round (paper: 10 on classic control)
    :param n_trajectories: D, trajectories per agent and local step (paper: 20)
    :param initial_trajectories: D̃, trajectories of the initial direction (default ``D·K``, as
        Theorem 1)
    :param estimator: ``"gpomdp"`` or ``"reinforce"``
    :param baseline: ``"loo"`` (leave-one-out, unbiased), ``"mean"``, ``None`` or
        ``"linear"`` (garage's linear feature baseline, cross-fitted: unbiased; :mod:`fedrl_algos.core.baselines`)
        or ``"critic"`` (a learned value function per agent with GAE(λ) advantages, fitted after
        each batch is weighted: unbiased with λ = 1; :mod:`fedrl_algos.core.critic`). GPOMDP only
    :param max_importance_weight: truncation of importance weights (default 2; ``None``: none but
        the overflow guard)
    :param self_normalize_weights: self-normalize importance weights per agent batch
    :param normalize_advantage: divide each agent batch's GPOMDP/REINFORCE step weights by their
        standard deviation (SB3's ``normalize_advantage``, without centring; default ``False``, the
        paper's estimator); makes the step size independent of the reward scale
    :param gamma: discount γ (paper: 0.99)
    :param eval_trajectories: Monte Carlo rollouts per agent of the logged evaluation (``None``:
        32; 0: none), the common protocol of :mod:`fedrl_algos.common.evaluation`
    :param policy_kwargs: keyword arguments of the policy (paper: ``net_arch=(16, 16)``,
        ``activation="relu"``)
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run (drawn at random when ``None``)
    :param device: torch device
    :param verbose: 0 silent, 1 logger output to stdout
    :param agent_kwargs: with an env id: one dict per agent (``make_params`` arguments of a fedrl
        family, ``gym.make`` arguments of a Gymnasium env)
    :param n_agents: with a Gymnasium id: that many identical agents
    :param horizon: last time index H of the sampled episodes (default: the family's, or the
        Gymnasium env's ``max_episode_steps − 1``)
    :param normalize_observations: SB3 ``VecNormalize`` observation normalization, statistics
        pooled by the server each round (see :class:`~fedrl_algos.common.FederatedAlgorithm`)
    :param optimizer: ``"sgd"`` (default): the paper's steps ``θ ← θ + α_t ũ``; ``"adam"``: every
        local and server step is an Adam step of size α_t along the momentum direction, the server
        averaging the agents' Adam moments with their directions (not the paper's; it is what makes
        MFPO learn Pendulum: ``step_size=3e-3, momentum=0.5``, ``docs/algorithms/mfpo.md``). The
        agents' moments are kept in ``agent_adam_step``, ``agent_adam_first`` and ``agent_adam_second``
        and saved with the model
    :param discounting: ``"absolute"`` (default, the papers' estimator: step h's reward-to-go
        ``Σ_{t≥h} γ^t r_t``) or ``"relative"`` (``Σ_{t≥h} γ^(t−h) r_t``: every step of a long episode
        weighted alike, as actor-critic libraries do; not the gradient of the discounted return, see
        :mod:`fedrl_algos.core.gpomdp`). GPOMDP only
    :param gae_lambda: λ of GAE with ``baseline="critic"`` (default 1: GPOMDP with the state-dependent
        baseline ``γ^h V(s_h)``, unbiased; SB3's 0.95 has less variance and a bias)
    :param n_critic_epochs: full-batch Adam steps of the critic's regression per local step
    :param critic_learning_rate: their step size
    :param critic_net_arch: hidden layers of the critic (default ``[64, 64]``; for image observations the
        width of the CNN critic's linear layer after its convolutions, default ``[512]``; the flat MLP policies
        take a list ``net_arch``, so the critic's sizes are their own argument)
    :param critic_activation: ``"tanh"`` (default) or ``"relu"``
    :param critic_aggregation: the federated rule for φ: ``"local"`` (default: each agent keeps its
        own critic: heterogeneous agents have different value functions, and the value of the
        averaged policy is not the average of the values) or ``"average"`` (the server averages
        φ with θ each round)
    :param critic_time_aware: the critic also takes the step's fraction of the horizon ``h/T`` as an
        input (default ``False``): on a fixed horizon the value to go depends on the time left, which
        V(s) alone cannot fit (flat observations only; ``docs/algorithms/baselines.md``)
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running steps
        (subtract the episode's mean, divide by its standard deviation) before the baseline, as the
        MFPO authors' released code and many REINFORCE implementations do (default ``False``, the
        paper's estimator). **Not an unbiased estimate of ∇J**: a per-episode affine map of the returns
        changes the objective (:mod:`fedrl_algos.core.gpomdp`). With ``discounting="absolute"`` step h
        is weighted by ``γ^h`` times its normalised return; the baselines (and the critic's GAE and
        regression targets) work on the normalised returns; ``normalize_advantage`` divides afterwards.
        GPOMDP only

    >>> from fedrl_algos import MFPO
    >>> model = MFPO("TabularPolicy", "fedrl/GridWorld-v0", step_size=0.5, local_steps=2, n_trajectories=4, seed=0, device="cpu")
    >>> model = model.learn(total_rounds=2)
    >>> model.local_step, model.trajectories_per_agent
    (4, 20)
    """

    round_protocol: ClassVar[type[RoundProtocol] | None] = MFPOProtocol
    stop_rollouts_when_done: ClassVar[bool] = True
    allows_new_agent_count: ClassVar[bool] = False
    obsolete_attributes: ClassVar[tuple[str, ...]] = ("beta", "tau", "alpha", "eval_adapt_trajectories", "agents_per_round")

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        step_size: float | Callable[[int], float] = _PAPER_STEP_SIZE,
        momentum: float | Callable[[int, float], float] = _PAPER_MOMENTUM,
        local_steps: int = 10,
        n_trajectories: int = 20,
        initial_trajectories: int | None = None,
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        max_importance_weight: float | None = 2.0,
        self_normalize_weights: bool = False,
        normalize_advantage: bool = False,
        gamma: float = 0.99,
        eval_trajectories: int | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        agent_kwargs: Sequence[dict[str, Any]] | None = None,
        n_agents: int | None = None,
        horizon: int | None = None,
        normalize_observations: bool = False,
        optimizer: str = "sgd",
        discounting: str = "absolute",
        gae_lambda: float = 1.0,
        n_critic_epochs: int = 5,
        critic_learning_rate: float = 1e-3,
        critic_net_arch: Sequence[int] | None = None,
        critic_activation: str = "tanh",
        critic_aggregation: str = "local",
        critic_time_aware: bool = False,
        normalize_returns: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        self.optimizer = check_server_optimizer("optimizer", optimizer)
        self.step_size = as_step_size(step_size)
        self.momentum = as_momentum(momentum)
        self.local_steps = check_int("local_steps", local_steps)
        self.n_trajectories = check_int("n_trajectories", n_trajectories)
        if initial_trajectories is None:
            initial_trajectories = self.n_trajectories * self.local_steps
        self.initial_trajectories = check_int("initial_trajectories", initial_trajectories)
        self._set_critic_settings(estimator, baseline, gae_lambda, n_critic_epochs, critic_learning_rate, critic_net_arch,
                                  critic_activation, critic_aggregation, critic_time_aware)
        self.estimator_name = estimator
        self.discounting = check_discounting(estimator, discounting)
        self.max_importance_weight = check_max_importance_weight(max_importance_weight)
        self.self_normalize_weights = check_bool("self_normalize_weights", self_normalize_weights)
        self.normalize_advantage = check_bool("normalize_advantage", normalize_advantage)
        self.normalize_returns = check_normalize_returns(normalize_returns, estimator)
        self.local_step = 0
        self.env_steps_per_agent = 0.0
        super().__init__(
            policy,
            env,
            gamma=gamma,
            eval_trajectories=eval_trajectories,
            policy_kwargs=policy_kwargs,
            tensorboard_log=tensorboard_log,
            seed=seed,
            device=device,
            verbose=verbose,
            agent_kwargs=agent_kwargs,
            n_agents=n_agents,
            horizon=horizon,
            normalize_observations=normalize_observations,
            _init_setup_model=_init_setup_model,
        )

    # --- set-up --------------------------------------------------------------------------------
    def _setup_model(self) -> None:
        super()._setup_model()
        critic = self._setup_agent_critic()
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
            self.__dict__.get("normalize_advantage", False),
            self._optimizer,
            self.__dict__.get("discounting", "absolute"),
            critic,
            self._critic_setting("gae_lambda"),
            self._critic_setting("n_critic_epochs"),
            self._critic_setting("critic_learning_rate"),
            self._critic_setting("critic_aggregation"),
            # files saved before the option existed hold none: the paper's estimator
            normalize_returns=self.__dict__.get("normalize_returns", False),
        )
        d, dtype = self.policy.n_params, self.policy.theta.dtype
        if self.__dict__.get("agent_direction") is None:
            self.agent_direction = torch.zeros(self.n_agents, d, dtype=dtype)
        if self.__dict__.get("agent_theta_prev") is None:
            self.agent_theta_prev = self.policy.theta.detach().expand(self.n_agents, d).clone()
        self.agent_direction = self.agent_direction.to(self.device)
        self.agent_theta_prev = self.agent_theta_prev.to(self.device)
        if self._optimizer == "adam":
            if self.__dict__.get("agent_adam_first") is None:
                self.agent_adam_step = torch.zeros(self.n_agents, dtype=dtype)
                self.agent_adam_first = torch.zeros(self.n_agents, d, dtype=dtype)
                self.agent_adam_second = torch.zeros(self.n_agents, d, dtype=dtype)
            self.agent_adam_step, self.agent_adam_first, self.agent_adam_second = (
                x.to(self.device) for x in (self.agent_adam_step, self.agent_adam_first, self.agent_adam_second))

    @property
    def _optimizer(self) -> str:
        # files saved before the option existed hold no ``optimizer``: the paper's steps
        return self.__dict__.get("optimizer", "sgd")

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()
        variables = [*variables, "agent_direction", "agent_theta_prev"]
        if self._optimizer == "adam":  # only then: files of the paper's MFPO keep their fields
            variables += ["agent_adam_step", "agent_adam_first", "agent_adam_second"]
        return state_dicts, variables

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "update"]

    # --- training ------------------------------------------------------------------------------
    @property
    def state(self) -> MFPOState:
        """The current :class:`MFPOState` (batch ``[1, n, d]``)."""
        theta = self.policy.theta.detach().reshape(1, 1, -1).expand(1, self.n_agents, -1)
        moments = None
        if self._optimizer == "adam":
            moments = AdamState(self.agent_adam_step.unsqueeze(0), self.agent_adam_first.unsqueeze(0), self.agent_adam_second.unsqueeze(0))
        return MFPOState(theta.clone(), self.agent_direction.unsqueeze(0), self.agent_theta_prev.unsqueeze(0), self.local_step, moments,
                         self.critic_state)

    @property
    def trajectories_per_call(self) -> int:
        """``n_trajectories``, the batch of every local step (a round's first batch is a multiple of it)."""
        return self.n_trajectories

    @property
    def trajectories_per_round(self) -> int:
        """``K · D`` (the first round's initial direction costs ``D̃ − D`` more, counted when it runs)."""
        return self.local_steps * self.n_trajectories

    @property
    def updates_per_round(self) -> int:
        return self.local_steps

    def _train_round(self) -> None:
        state, info = self.update.round(self.federation.sampler, self.state, self._reject_updates)
        self._store_round(state, info, float(info["env_steps"].mean()))

    def _store_round(self, state: MFPOState, info: dict[str, Any], env_steps_per_agent: float) -> None:
        """Keep what a round produced (in one process, or from a Flower round): the server's θ,
        every agent's direction and θ^(t−1), the step counter, and the diagnostics."""
        first = self.local_step == 0
        self.policy.theta.data.copy_(state.theta[0, 0])
        self.agent_direction = state.direction[0].clone()
        self.agent_theta_prev = state.theta_prev[0].clone()
        if state.moments is not None:
            self.agent_adam_step, self.agent_adam_first, self.agent_adam_second = (x[0].clone() for x in state.moments)
        if state.critic is not None:
            self._keep_critic(state.critic)
        self.local_step = state.step
        if first:  # the initial direction used D̃ trajectories instead of D
            self.trajectories_per_agent += self.initial_trajectories - self.n_trajectories
        self.env_steps_per_agent += env_steps_per_agent
        self._last_info = info

    def _log_round(self) -> None:
        info = self.__dict__.get("_last_info")
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
        """The server policy's return per agent and averaged, as the common protocol
        (:func:`~fedrl_algos.common.evaluation.server_policy_metrics`)."""
        return server_policy_metrics(self)
