"""FedPG-BR: federated policy gradient with Byzantine resilience, the SB3-style shell.

Paper: "Fault-Tolerant Federated Reinforcement Learning with Theoretical Guarantee" (Fan et al.,
NeurIPS 2021), Algorithm 1 and Algorithm 1.1; the fault-tolerant baseline of the MFPO paper
(section VI-A2). The update is :mod:`fedrl_algos.fedpg_br.update`. Docs: ``docs/algorithms/fedpg_br.md``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fedrl_algos.common.agent_critic import AgentCriticMixin
from fedrl_algos.common.base_class import FederatedAlgorithm, check_agent_indices
from fedrl_algos.common.evaluation import server_policy_metrics
from fedrl_algos.common.round_protocol import RoundProtocol
from fedrl_algos.common.server_state import ServerAdamStateMixin
from fedrl_algos.core.attacks import Attack, attack_streams, make_attack
from fedrl_algos.core.critic import average_critics
from fedrl_algos.core.directions import check_step_size
from fedrl_algos.core.gpomdp import check_discounting, check_max_importance_weight, check_normalize_returns
from fedrl_algos.core.optim import check_server_optimizer
from fedrl_algos.fedpg_br.protocol import FedPGBRProtocol
from fedrl_algos.fedpg_br.update import FedPGBRUpdate, make_env_server_sampler, make_server_sampler, server_task_indices
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.validation import check_bool, check_int, check_real

__all__ = ["FedPGBR"]


class FedPGBR(AgentCriticMixin, ServerAdamStateMixin, FederatedAlgorithm):
    """Federated policy gradient with Byzantine resilience (FedPG-BR).

    Each round the server broadcasts θ̃; every agent reports a GPOMDP gradient from ``B_t``
    trajectories (``B_t`` uniform in ``batch_range``); the server drops gradients its
    distance-based filter flags as Byzantine, averages the rest into ``μ_t``, and runs a
    variance-reduced (SCSG) inner loop of geometric length on its own trajectories, each step
    ``θ_{n+1} = θ_n + η (ĝ(θ_n) − ω ĝ(θ̃) + μ_t)`` with importance weights ω.
    Docs: ``docs/algorithms/fedpg_br.md``.

    The filter's decision for every agent and round is logged (``filter/kept_agent_<k>``) and
    kept in :attr:`filter_history` (one list of booleans per round).

    :param policy: ``"MlpPolicy"``, ``"TabularPolicy"`` or a FlatPolicy class
    :param env: the agents' environments: a fedrl id or task family (its training tasks, or one
        task per ``agent_kwargs`` dict), a ``FederatedVecEnv`` of either backend, or any registered
        Gymnasium id with ``agent_kwargs`` or ``n_agents``
    :param step_size: η, the server's inner-loop step size
    :param batch_range: ``(B_min, B_max)`` of the agents' batch size B_t (FedPG-BR on CartPole:
        14–18)
    :param inner_batch_size: b, server trajectories per inner step (CartPole: 4)
    :param sigma: σ of the filter threshold, or ``"auto"`` (default): each round, the
        ``(1 − α)``-quantile over agents of their reported per-trajectory standard deviations;
        ``"auto_bound"``: the same with their largest per-trajectory deviation (FedPG-BR's σ as a
        bound on ``||g(τ) − ∇J||``; about 3× wider, and on CartPole it let most sign-flipped
        reports through)
    :param delta: δ of the threshold (FedPG-BR: 0.6)
    :param max_byzantine_fraction: α, the largest tolerated fraction of Byzantine agents (FedPG-BR:
        0.4); a first pass keeping fewer than ``(1 − α)K`` agents triggers the wider radius 2σ
    :param estimator: ``"gpomdp"`` or ``"reinforce"``
    :param baseline: ``"loo"`` (leave-one-out, unbiased), ``"mean"``, ``None``,
        ``"linear"`` (garage's linear feature baseline, cross-fitted: unbiased; :mod:`fedrl_algos.core.baselines`)
        or ``"critic"`` (a learned value function with GAE(λ) advantages, fitted after each batch is
        weighted: unbiased with λ = 1; GPOMDP only). Every agent keeps its own critic
        (``agent_critic_*``) for its reports; the server keeps **its own** (``server_critic_*``) for
        the inner loop's batches, fitted on them: it never uses an agent's φ, which a Byzantine agent
        could forge (:class:`~fedrl_algos.fedpg_br.update.FedPGBRUpdate`)
    :param max_importance_weight: truncation of the inner-loop importance weights (``None``: none
        but the overflow guard)
    :param use_filter: ``False``: average every agent's gradient (no protection)
    :param server_task: the task of the server's own environment: an agent index, or ``None``
        (server trajectory j runs agent ``j mod n``'s task, so the inner loop estimates the
        gradient of the agents' average objective)
    :param attack: what Byzantine agents do: an :class:`~fedrl_algos.core.attacks.Attack` or its name
        (``random_noise``, ``sign_flip``, ``zero_gradient``, ``random_action``, ``reward_flip``,
        ``random_reward``, ``fedscspg``, ``huge_spread``, ``tiny_spread``: see :data:`~fedrl_algos.core.attacks.ATTACKS`)
    :param byzantine_agents: indices of the Byzantine agents
    :param gamma: discount γ
    :param eval_trajectories: Monte Carlo rollouts per agent of the logged evaluation (``None``:
        32; 0: none), the common protocol of :mod:`fedrl_algos.common.evaluation`
    :param policy_kwargs: keyword arguments of the policy
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run
    :param device: torch device
    :param verbose: 0 silent, 1 logger output to stdout
    :param agent_kwargs: with an env id: one dict per agent (``make_params`` arguments of a fedrl
        family, ``gym.make`` arguments of a Gymnasium env)
    :param n_agents: with a Gymnasium id: that many identical agents
    :param horizon: last time index H of the sampled episodes (default: the family's, or the
        Gymnasium env's ``max_episode_steps − 1``)
    :param normalize_observations: SB3 ``VecNormalize`` observation normalization, statistics
        pooled by the server each round (see :class:`~fedrl_algos.common.FederatedAlgorithm`)
    :param server_optimizer: the inner-loop step: ``"sgd"`` (plain ascent with step η) or
        ``"adam"`` (Adam with step size η along the variance-reduced direction, state kept across
        rounds in :attr:`optimizer_state`; FedPG-BR's own experiments use Adam)
    :param discounting: ``"absolute"`` (default, the papers' estimator: step h's reward-to-go
        ``Σ_{t≥h} γ^t r_t``) or ``"relative"`` (``Σ_{t≥h} γ^(t−h) r_t``: every step of a long episode
        weighted alike, as actor-critic libraries do; not the gradient of the discounted return, see
        :mod:`fedrl_algos.core.gpomdp`). GPOMDP only
    :param gae_lambda: λ of GAE with ``baseline="critic"`` (default 1: unbiased; SB3's 0.95 has less
        variance and a bias)
    :param n_critic_epochs: full-batch Adam steps of each critic fit
    :param critic_learning_rate: their step size
    :param critic_net_arch: hidden layers of the critic (default ``[64, 64]``; for image observations the
        width of the CNN critic's linear layer after its convolutions, default ``[512]``)
    :param critic_activation: ``"tanh"`` (default) or ``"relu"``
    :param critic_aggregation: the federated rule for the agents' φ: ``"local"`` (default: each agent
        keeps its own: heterogeneous agents have different value functions) or ``"average"`` (each
        round the server averages the φ of the agents its filter kept, after bringing them to
        common output statistics, and sends the average to every agent; the server's own critic
        is not averaged)
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
        REINFORCE). Used by the agents' reports, the server's inner loop and both critics. Saved with
        the model; files saved without it load with it off

    >>> from fedrl_algos import FedPGBR
    >>> model = FedPGBR("TabularPolicy", "fedrl/GridWorld-v0", step_size=0.5, batch_range=(4, 6),
    ...                 inner_batch_size=2, attack="sign_flip", byzantine_agents=[0], seed=0, device="cpu")
    >>> model = model.learn(total_rounds=3)
    >>> len(model.filter_history), len(model.filter_history[0])
    (3, 8)
    """

    round_protocol: ClassVar[type[RoundProtocol] | None] = FedPGBRProtocol
    #: the agents' critics and the server's own (its inner loop samples trajectories itself)
    critic_owners: ClassVar[tuple[str, ...]] = ("agent", "server")
    # ``learning_rate`` is SB3's own attribute (unused here); η was saved as ``server_learning_rate``.
    saved_attribute_renames: ClassVar[dict[str, str]] = {"server_learning_rate": "step_size"}
    stop_rollouts_when_done: ClassVar[bool] = True
    allows_new_agent_count: ClassVar[bool] = False
    obsolete_attributes: ClassVar[tuple[str, ...]] = ("beta", "tau", "alpha", "eval_adapt_trajectories", "agents_per_round")

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        step_size: float = 1e-3,
        batch_range: tuple[int, int] = (14, 18),
        inner_batch_size: int = 4,
        sigma: float | str = "auto",
        delta: float = 0.6,
        max_byzantine_fraction: float = 0.4,
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        max_importance_weight: float | None = None,
        use_filter: bool = True,
        server_task: int | None = None,
        attack: Attack | str | None = None,
        byzantine_agents: Sequence[int] = (),
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
        server_optimizer: str = "sgd",
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
        self.step_size = check_step_size("step_size", step_size)
        if not (isinstance(batch_range, Sequence) and len(batch_range) == 2):
            raise ValueError(f"batch_range must be a pair (B_min, B_max), got {batch_range!r}")
        b_min = check_int("batch_range[0]", batch_range[0], 2)
        b_max = check_int("batch_range[1]", batch_range[1], b_min)
        self.batch_range = (b_min, b_max)
        self.inner_batch_size = check_int("inner_batch_size", inner_batch_size)
        if isinstance(sigma, str):
            if sigma not in ("auto", "auto_bound"):
                raise ValueError(f"sigma must be a finite number > 0, 'auto' or 'auto_bound', got {sigma!r}")
            self.sigma: float | str = sigma
        else:  # an infinite radius would switch the filter off
            self.sigma = check_real("sigma", sigma, 0, low_inclusive=False)
        self.delta = check_real("delta", delta, 0, 1, low_inclusive=False, high_inclusive=False)
        self.max_byzantine_fraction = check_real("max_byzantine_fraction", max_byzantine_fraction, 0, 0.5, high_inclusive=False)
        self._set_critic_settings(estimator, baseline, gae_lambda, n_critic_epochs, critic_learning_rate, critic_net_arch,
                                  critic_activation, critic_aggregation, critic_time_aware)
        self.estimator_name = estimator
        self.discounting = check_discounting(estimator, discounting)
        self.normalize_returns = check_normalize_returns(normalize_returns, estimator)
        self.max_importance_weight = check_max_importance_weight(max_importance_weight)
        self.use_filter = check_bool("use_filter", use_filter)
        self.server_task = server_task
        self.attack = make_attack(attack)
        self.byzantine_agents = check_agent_indices("byzantine_agents", byzantine_agents)
        self.server_optimizer = check_server_optimizer("server_optimizer", server_optimizer)
        self.filter_history: list[list[bool]] = []
        self.env_steps_per_agent = 0.0
        self.server_env_steps = 0.0
        self._extra_rng_state: dict[str, Any] | None = None
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
        self.update = FedPGBRUpdate(
            self.policy,
            self.gamma,
            self.batch_range,
            self.inner_batch_size,
            self.step_size,
            self.sigma,
            self.delta,
            self.max_byzantine_fraction,
            self.estimator_name,
            self.baseline,
            self.max_importance_weight,
            self.use_filter,
            self.attack,
            self.server_optimizer,
            self.__dict__.get("discounting", "absolute"),
            critic,
            self._critic_setting("gae_lambda"),
            self._critic_setting("n_critic_epochs"),
            self._critic_setting("critic_learning_rate"),
            self.__dict__.get("normalize_returns", False),  # files saved before the option: off
        )
        self._setup_server_state()
        self._make_server_sampler()
        if self._extra_rng_state is not None:
            self.server_sampler.streams.load_state_dict(self._extra_rng_state["server_traj"])
            self.noise_streams.load_state_dict(self._extra_rng_state["noise"])
            if "server_envs" in self._extra_rng_state and hasattr(self.server_sampler, "set_random_state"):
                self.server_sampler.set_random_state(json.loads(self._extra_rng_state["server_envs"]))

    def _check_agents(self) -> None:
        if any(not 0 <= k < self.n_agents for k in self.byzantine_agents):
            raise ValueError(f"byzantine_agents must be agent indices in [0, {self.n_agents - 1}], got {self.byzantine_agents}")
        if self.server_task is not None:
            check_int("server_task", self.server_task, 0)
            if self.server_task >= self.n_agents:
                raise ValueError(f"server_task must be an agent index in [0, {self.n_agents - 1}], got {self.server_task}")

    def _make_server_sampler(self) -> None:
        self._check_agents()
        if self.is_generic:
            # The server's own environments (the paper's server samples trajectories itself).
            tasks = server_task_indices(self.n_agents, self.inner_batch_size, self.server_task)
            server_env = self._generic_env([self.agent_kwargs[k] for k in tasks], n_envs=1, seed=self.seed ^ 1)
            self.server_sampler = make_env_server_sampler(server_env, self.policy, self.seed, self.inner_batch_size, self.server_task, self.horizon)
        else:
            self.server_sampler = make_server_sampler(
                self.family, self.federation.agent_params, self.policy, torch.tensor([self.seed]), self.inner_batch_size,
                self.server_task, self.device,
            )
        # The server's own trajectories are read with the agents' (pooled) observation statistics.
        self.server_sampler.normalizer = self.obs_normalizer
        self.noise_streams = attack_streams(self.federation.streams)
        self.byzantine_mask = torch.zeros(self.n_agents, dtype=torch.bool, device=self.device)
        if self.byzantine_agents:
            self.byzantine_mask[torch.tensor(self.byzantine_agents)] = True

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        super().set_env(env, force_reset)
        self._make_server_sampler()

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "update", "server_sampler", "noise_streams", "byzantine_mask"]

    def save(self, path: Any, exclude: Sequence[str] | None = None, include: Sequence[str] | None = None) -> None:
        """Save parameters, configuration and every random-stream state (SB3 zip format)."""
        self._extra_rng_state = {"server_traj": self.server_sampler.streams.state_dict(), "noise": self.noise_streams.state_dict()}
        if hasattr(self.server_sampler, "random_state"):  # the server's own Gymnasium environments
            self._extra_rng_state["server_envs"] = json.dumps(self.server_sampler.random_state())
        try:
            super().save(path, exclude=exclude, include=include)
        finally:
            self._extra_rng_state = None

    @classmethod
    def load(cls, path: Any, env: Any = None, device: torch.device | str = "auto", **kwargs: Any) -> FedPGBR:  # type: ignore[override]
        model = super().load(path, env=env, device=device, **kwargs)
        model._extra_rng_state = None
        return model

    # --- training ------------------------------------------------------------------------------
    @property
    def trajectories_per_call(self) -> int:
        """Every agent samples ``B_max`` episodes per round."""
        return self.batch_range[1]

    @property
    def trajectories_per_round(self) -> int:
        """Nominal per-round cost: agents sample ``B_max`` trajectories (and use ``B_t`` of them)."""
        return self.batch_range[1]

    def _train_round(self) -> None:
        theta = self.policy.theta.detach().unsqueeze(0)
        uniform = self.federation.server_streams.uniform((2,), dtype=torch.float64)
        if self.update.agent_critic is not None:
            self.update.agent_critic.state = self.critic_state
            self.update.server_critic.state = self._critic_of("server")
        new_theta, info = self.update.round(
            theta, self.federation.sampler, self.server_sampler, uniform, self.byzantine_mask, self.noise_streams,
            self.optimizer_state, self._reject_updates,
        )
        if self.update.agent_critic is not None:
            agents = self.update.agent_critic.state
            if self._critic_setting("critic_aggregation") == "average":  # over the agents the filter kept
                agents = average_critics(self.critic_network, agents, info["kept"])
            self._keep_critic(agents)
            self._keep_critic(self.update.server_critic.state, "server")
        self._store_round(new_theta, info)

    def _store_round(self, new_theta: torch.Tensor, info: dict[str, Any]) -> None:
        """Keep what a round produced (in one process, or from a Flower round): θ̃, Adam's state,
        the filter's decisions and the diagnostics."""
        self._store_server_state(info["optimizer_state"])
        self.policy.theta.data.copy_(new_theta[0])
        self.filter_history.append([bool(k) for k in info["kept"][0].tolist()])
        self.env_steps_per_agent += float(info["env_steps"].mean())
        self.server_env_steps += float(info["server_env_steps"].sum())
        self._last_info = info

    def _log_round(self) -> None:
        info = self.__dict__.get("_last_info")
        if info is not None:
            kept = info["kept"][0]
            for k, value in enumerate(kept.tolist()):
                self.logger.record(f"filter/kept_agent_{k}", int(value))
            self.logger.record("filter/n_kept", int(kept.sum()))
            self.logger.record("filter/fallback", int(info["fallback"][0]))
            self.logger.record("filter/threshold", float(info["threshold"][0]))
            self.logger.record("filter/sigma", float(info["sigma"][0]))
            if self.byzantine_agents:
                self.logger.record("filter/byzantine_rejected", int((~kept & self.byzantine_mask).sum()))
                self.logger.record("filter/honest_rejected", int((~kept & ~self.byzantine_mask).sum()))
            self.logger.record("train/batch_size", int(info["batch_size"][0]))
            self.logger.record("train/inner_steps", int(info["inner_steps"][0]))
            self.logger.record("train/return", float(info["return"].mean()))
            self.logger.record("train/env_steps_per_agent", self.env_steps_per_agent)
            self.logger.record("train/server_env_steps", self.server_env_steps)
        super()._log_round()

    def evaluate_round(self) -> dict[str, float]:
        """The server policy's average return over agents (see :meth:`MFPO.evaluate_round`)."""
        return server_policy_metrics(self)
