"""FedAvg-PG: FedAvg applied to policy gradient, the baseline of both papers.

Papers: "Personalized Federated Policy Gradient" (the non-personalized baseline, α → 0 limit of
Per-FedAvg-PG, Proposition 3) and the MFPO paper's comparison (section VI; with its GPOMDP
estimator and step-size schedule), and FedPG-BR's unprotected baseline (an Adam server on the
averaged gradient, under Byzantine attacks). Docs: ``docs/algorithms/fedavg_pg.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from fedrl_algos.common.agent_critic import AgentCriticMixin
from fedrl_algos.common.base_class import FederatedAlgorithm, check_agent_indices, check_agents_per_round
from fedrl_algos.common.evaluation import personalization_metrics
from fedrl_algos.common.round_protocol import RoundProtocol
from fedrl_algos.common.server_state import ControlVariateStateMixin, ServerAdamStateMixin, check_control_variates
from fedrl_algos.core.attacks import Attack, AttackedEstimator, make_attack
from fedrl_algos.core.critic import CriticGradient
from fedrl_algos.core.directions import GradientEstimator, check_step_size
from fedrl_algos.core.gpomdp import ScoreFunctionGradient, check_discounting, check_normalize_returns
from fedrl_algos.core.optim import check_server_optimizer
from fedrl_algos.core.schedules import as_step_size
from fedrl_algos.fedavg_pg.protocol import FedAvgPGProtocol
from fedrl_algos.fedavg_pg.update import fedavg_pg_round
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.validation import check_int

__all__ = ["FedAvgPG"]


class FedAvgPG(AgentCriticMixin, ControlVariateStateMixin, ServerAdamStateMixin, FederatedAlgorithm):
    """Federated policy gradient by parameter averaging (FedAvg-PG).

    Each round every participating agent starts from the server's θ and takes ``local_steps`` (K,
    τ) ascent steps ``θ_k ← θ_k + α_t ĝ_k(θ_k)``, each from ``n_trajectories`` fresh trajectories
    of its own MDP; the server averages the agents' parameters (``server_optimizer="sgd"``) or takes
    an Adam step along the average local direction (``"adam"``). :func:`~fedrl_algos.fedavg_pg.update.fedavg_pg_round`
    is the update, shared with ``fedrl reproduce mfpo/byzantine``.

    The defaults are the Per-FedAvg-PG paper's baseline algorithm — the exact variant's per-step
    budget of 30 trajectories (m_in = m_h = m_out = 10) and a constant step — with a leave-one-out
    baseline in the gradient (unbiased, lower variance); ``FedAvgPG(..., **FedAvgPG.paper_settings)``
    is the paper's eq. (2) estimate (GPOMDP without a baseline, ``Σ_h ∇log π R^h``). The MFPO comparison's FedAvg-PG is
    ``FedAvgPG(..., step_size=ExponentialStepSize(), local_steps=10, n_trajectories=20,
    baseline="loo", gamma=0.99)``. Training does not depend on α; α is used only to evaluate the
    post-adaptation objective F and as :meth:`adapt`'s default step. Docs: ``docs/algorithms/fedavg_pg.md``.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a FlatPolicy class
    :param env: the agents' environments: a fedrl id or task family (its training tasks, or one
        task per ``agent_kwargs`` dict), a ``FederatedVecEnv`` of either backend, or any registered
        Gymnasium id with ``agent_kwargs`` or ``n_agents``
    :param step_size: local step size: a number (β of the Per-FedAvg-PG paper) or a schedule
        ``t -> α_t`` over local steps ``t = 1, 2, …`` (e.g. :class:`~fedrl_algos.core.schedules.ExponentialStepSize`)
    :param local_steps: local steps per round (τ; the MFPO paper's K)
    :param n_trajectories: trajectories per agent and local step (m; the MFPO paper's D)
    :param estimator: ``"gpomdp"`` (reward-to-go weights) or ``"reinforce"`` (whole-return weights)
    :param baseline: ``"loo"`` (default: leave-one-out, unbiased), ``None`` (the paper's eq. (2)), ``"mean"``,
        ``"linear"`` (garage's linear feature baseline, cross-fitted: unbiased; :mod:`fedrl_algos.core.baselines`)
        or ``"critic"`` (a learned value function per agent with GAE(λ) advantages, fitted after each
        batch is weighted: unbiased with λ = 1; :class:`~fedrl_algos.core.critic.CriticGradient`). GPOMDP only
    :param server_optimizer: ``"sgd"`` (the server adopts the average, FedAvg) or ``"adam"``
    :param server_step_size: Adam's step size (``server_optimizer="adam"`` only)
    :param attack: what Byzantine agents do to their local directions: an
        :class:`~fedrl_algos.core.attacks.Attack` or its name (``random_noise``, ``sign_flip``, ...)
    :param byzantine_agents: indices of the Byzantine agents
    :param alpha: adaptation step size used for evaluation and :meth:`adapt` only
    :param gamma: discount γ
    :param agents_per_round: agents sampled per round (default: all); only the sampled agents are
        computed and only their random streams advance (with an attack: every agent is computed, the
        others masked out of the aggregate)
    :param control_variates: SCAFFOLD's control-variate correction of the local steps
        (``θ_k ← θ_k + α_t (ĝ_k + c − c_k)``, option II controls; saved with the model); needs local
        step sizes with a positive sum. Docs: ``docs/algorithms/fedavg_pg.md``
    :param eval_trajectories: see :class:`~fedrl_algos.PerFedAvgPG`
    :param eval_adapt_trajectories: see :class:`~fedrl_algos.PerFedAvgPG`
    :param policy_kwargs: policy keyword arguments
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream
    :param device: torch device
    :param verbose: verbosity
    :param agent_kwargs: with an env id: one dict per agent (``make_params`` arguments of a fedrl
        family, ``gym.make`` arguments of a Gymnasium env)
    :param n_agents: with a Gymnasium id: that many identical agents
    :param horizon: last time index H of the sampled episodes (default: the family's, or the
        Gymnasium env's ``max_episode_steps − 1``)
    :param normalize_observations: SB3 ``VecNormalize`` observation normalization, statistics
        pooled by the server each round (see :class:`~fedrl_algos.common.FederatedAlgorithm`)
    :param discounting: ``"absolute"`` (default, the papers' estimator: step h's reward-to-go
        ``Σ_{t≥h} γ^t r_t``) or ``"relative"`` (``Σ_{t≥h} γ^(t−h) r_t``: every step of a long episode
        weighted alike, as actor-critic libraries do; not the gradient of the discounted return, see
        :mod:`fedrl_algos.core.gpomdp`). GPOMDP only
    :param gae_lambda: λ of GAE with ``baseline="critic"`` (default 1: GPOMDP with the state-dependent
        baseline ``γ^h V(s_h)``, unbiased; SB3's 0.95 has less variance and a bias)
    :param n_critic_epochs: full-batch Adam steps of the critic's regression per local step
    :param critic_learning_rate: their step size
    :param critic_net_arch: hidden layers of the critic (default ``[64, 64]``; for image observations the
        width of the CNN critic's linear layer after its convolutions, default ``[512]``)
    :param critic_activation: ``"tanh"`` (default) or ``"relu"``
    :param critic_aggregation: the federated rule for φ: ``"local"`` (default: each agent keeps its
        own critic: heterogeneous agents have different value functions, and the value of the
        averaged policy is not the average of the values) or ``"average"`` (each round the server
        averages the participating agents' φ, after bringing them to common output statistics, and
        broadcasts it with θ). Every agent's critic is kept in ``agent_critic_*`` and saved with the
        model; with ``agents_per_round`` every agent is computed (its streams advance) but only the
        sampled agents' critics are updated
    :param critic_time_aware: the critic also takes the step's fraction of the horizon ``h/T`` as an
        input (default ``False``): on a fixed horizon the value to go depends on the time left, which
        V(s) alone cannot fit (flat observations only; ``docs/algorithms/baselines.md``)
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running steps
        (subtract the episode's mean, divide by its standard deviation) before the baseline, as the
        MFPO authors' released code and many REINFORCE implementations do (default ``False``, the
        paper's estimator). **Not an unbiased estimate of ∇J**: a per-episode affine map of the returns
        changes the objective (:mod:`fedrl_algos.core.gpomdp`). With ``discounting="absolute"`` step h
        is weighted by ``γ^h`` times its normalised return; the baselines (and the critic's GAE and
        regression targets) work on the normalised returns. GPOMDP only (``ValueError`` with
        REINFORCE). Saved with the model; files saved without it load with it off

    >>> from fedrl_algos import FedAvgPG
    >>> model = FedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", step_size=0.3, alpha=2.0, seed=0, device="cpu")
    >>> model = model.learn(total_rounds=2)
    >>> model.trajectories_per_agent
    300
    """

    #: the Per-FedAvg-PG paper's FedAvg baseline: eq. (2) without a baseline
    paper_settings: ClassVar[dict[str, Any]] = {"baseline": None}
    #: files saved before the ``baseline`` option ran without one
    attributes_of_older_files: ClassVar[dict[str, Any]] = {"baseline": None}
    round_protocol: ClassVar[type[RoundProtocol] | None] = FedAvgPGProtocol
    saved_attribute_renames: ClassVar[dict[str, str]] = {"beta": "step_size", "tau": "local_steps"}
    # Episodes that terminate (CartPole, the MFPO comparison's family) end a batch's rollout early.
    stop_rollouts_when_done: ClassVar[bool] = True
    _BATCH_PARTS: ClassVar[tuple[str, ...]] = ("m_in", "m_h", "m_out")

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        step_size: float | Callable[[int], float] = 0.2,
        local_steps: int = 5,
        n_trajectories: int = 30,
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        server_optimizer: str = "sgd",
        server_step_size: float = 1e-3,
        attack: Attack | str | None = None,
        byzantine_agents: Sequence[int] = (),
        alpha: float = 0.0,
        gamma: float = 0.9,
        agents_per_round: int | None = None,
        control_variates: bool = False,
        eval_trajectories: int | None = None,
        eval_adapt_trajectories: int = 64,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        agent_kwargs: Sequence[dict[str, Any]] | None = None,
        n_agents: int | None = None,
        horizon: int | None = None,
        normalize_observations: bool = False,
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
        self.step_size = as_step_size(step_size)
        self.local_steps = check_int("local_steps", local_steps)
        self.n_trajectories = check_int("n_trajectories", n_trajectories)
        self._set_critic_settings(estimator, baseline, gae_lambda, n_critic_epochs, critic_learning_rate, critic_net_arch,
                                  critic_activation, critic_aggregation, critic_time_aware)
        self.estimator_name = estimator
        self.discounting = check_discounting(estimator, discounting)
        self.normalize_returns = check_normalize_returns(normalize_returns, estimator)
        self.server_optimizer = check_server_optimizer("server_optimizer", server_optimizer)
        if isinstance(server_step_size, bool) or not (isinstance(server_step_size, int | float) and server_step_size > 0):
            raise ValueError(f"server_step_size must be a number > 0, got {server_step_size!r}")
        self.server_step_size = float(server_step_size)
        self.attack = make_attack(attack)
        self.byzantine_agents = check_agent_indices("byzantine_agents", byzantine_agents)
        self.alpha = check_step_size("alpha", alpha)
        self.eval_adapt_trajectories = check_int("eval_adapt_trajectories", eval_adapt_trajectories, 0)
        self.agents_per_round = agents_per_round
        self.control_variates = check_control_variates(control_variates)
        self.local_step = 0
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
    def _migrate_saved_attributes(self) -> None:
        # Files saved before the rename kept the per-step batch as its three parts and β as a number.
        if all(k in self.__dict__ for k in self._BATCH_PARTS):
            self.n_trajectories = sum(int(self.__dict__.pop(k)) for k in self._BATCH_PARTS)
        super()._migrate_saved_attributes()
        self.step_size = as_step_size(self.step_size)

    def _setup_model(self) -> None:
        self.agents_per_round = check_agents_per_round(self.agents_per_round, self.n_agents)
        if any(not 0 <= k < self.n_agents for k in self.byzantine_agents):
            raise ValueError(f"byzantine_agents must be agent indices in [0, {self.n_agents - 1}], got {self.byzantine_agents}")
        if check_control_variates(self.control_variates) and not sum(self.step_size(t) for t in range(1, self.local_steps + 1)) > 0:
            raise ValueError("control_variates=True needs local step sizes (step_size) that sum to > 0 over a round "
                             "(the controls divide the local progress by the sum)")
        super()._setup_model()
        self._setup_agent_critic()
        self.estimator = self._make_estimator()
        self._setup_server_state()
        self._setup_control_variates()

    def _make_estimator(self) -> GradientEstimator:
        discounting = self.__dict__.get("discounting", "absolute")
        normalize_returns = self.__dict__.get("normalize_returns", False)  # files saved before the option: off
        honest: GradientEstimator
        if self.critic_network is not None:
            honest = CriticGradient(self.policy, self.gamma, self.n_trajectories, self.critic_network, self._critic_setting("gae_lambda"),
                                    self._critic_setting("n_critic_epochs"), self._critic_setting("critic_learning_rate"),
                                    discounting=discounting, normalize_returns=normalize_returns)
        else:
            honest = ScoreFunctionGradient(self.policy, self.gamma, self.n_trajectories, self.estimator_name, self.baseline,
                                           discounting=discounting, normalize_returns=normalize_returns)
        if not self.byzantine_agents or self.attack.name == "none":
            return honest
        mask = torch.zeros(self.n_agents, dtype=torch.bool)
        mask[self.byzantine_agents] = True
        return AttackedEstimator(honest, self.attack, mask)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "estimator"]

    # --- training ------------------------------------------------------------------------------
    @property
    def trajectories_per_call(self) -> int:
        """``n_trajectories``, the batch of every local step."""
        return self.n_trajectories

    @property
    def trajectories_per_round(self) -> int:
        return self.local_steps * self.n_trajectories

    @property
    def updates_per_round(self) -> int:
        return self.local_steps

    @property
    def participating_agents(self) -> int:
        return self.agents_per_round or self.n_agents

    @property
    def adaptation_step_size(self) -> float | None:
        """α when one was given (FedAvg-PG learns no adaptation step: with the default α = 0,
        :meth:`adapt` needs ``step_size``)."""
        return self.alpha if self.alpha > 0 else None

    def _train_round(self) -> None:
        theta = self.policy.theta.detach().unsqueeze(0)
        control = self.control_state
        critic = self._start_critic_round(self.estimator)
        rejected: list = []
        new_theta, state, mask = fedavg_pg_round(
            self.federation, theta, self.estimator, self.step_size, self.local_step, self.local_steps,
            self.agents_per_round, self.optimizer_state, self.server_step_size, self._rejections_recorded(rejected), control,
        )
        self._end_critic_round(self.estimator, critic, self._critic_participants(mask, rejected))
        self._store_server_state(state)
        self._store_control_state(control)
        self.local_step += self.local_steps
        self.policy.theta.data.copy_(new_theta[0])

    def evaluate_round(self) -> dict[str, float]:
        """The server policy's returns before and after one adaptation step of size α, as the
        common protocol (:func:`~fedrl_algos.common.evaluation.personalization_metrics`)."""
        return personalization_metrics(self, self.alpha, self.eval_adapt_trajectories)
