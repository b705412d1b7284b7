"""Independent policy gradient: every agent trains alone from the shared initialization.

The from-scratch baseline of the Per-FedAvg-PG paper. Docs: ``docs/algorithms/independent_pg.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fedrl_algos.common.agent_critic import AgentCriticMixin
from fedrl_algos.common.base_class import FederatedAlgorithm
from fedrl_algos.common.evaluation import own_policy_metrics
from fedrl_algos.common.round_protocol import RoundProtocol
from fedrl_algos.core.critic import CriticGradient
from fedrl_algos.core.directions import PolicyGradient, check_step_size
from fedrl_algos.core.gpomdp import ScoreFunctionGradient, check_normalize_returns
from fedrl_algos.independent_pg.protocol import IndependentPGProtocol
from fedrl_algos.independent_pg.update import independent_pg_steps
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.validation import check_int

__all__ = ["IndependentPG"]


class IndependentPG(AgentCriticMixin, FederatedAlgorithm):
    """Every agent trains its own policy from the shared initialization, without communication.

    The paper's from-scratch baseline. A "round" is ``local_steps`` policy-gradient steps of
    ``n_trajectories`` trajectories on every agent; the agents' parameters are :attr:`agent_theta`
    ``[n, d]`` and :meth:`predict` uses ``agent``'s own parameters. Docs: ``docs/algorithms/independent_pg.md``.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a FlatPolicy class
    :param env: the agents' environments: a fedrl id or task family (its training tasks, or one
        task per ``agent_kwargs`` dict), a ``FederatedVecEnv`` of either backend, or any registered
        Gymnasium id with ``agent_kwargs`` or ``n_agents``
    :param step_size: step size β
    :param n_trajectories: trajectories per policy-gradient step (m)
    :param local_steps: steps per round
    :param gamma: discount γ
    :param eval_trajectories: Monte Carlo rollouts per agent of the logged evaluation (``None``:
        32; 0: none), the common protocol of :mod:`fedrl_algos.common.evaluation`
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
    :param baseline: baseline of each step's GPOMDP estimate: ``None`` (default, the paper's eq. (2)
        estimate ``Σ_h ∇log π R^h``), ``"loo"`` (leave-one-out time-dependent mean, unbiased),
        ``"mean"``, ``"linear"`` (garage's linear feature baseline, cross-fitted: unbiased;
        :mod:`fedrl_algos.core.baselines`) or ``"critic"`` (a learned value function per agent with
        GAE(λ) advantages, fitted after each batch is weighted: unbiased with λ = 1;
        :class:`~fedrl_algos.core.critic.CriticGradient`). Saved with the model; files saved without it load as ``None``
    :param gae_lambda: λ of GAE with ``baseline="critic"`` (default 1: unbiased; SB3's 0.95 has less
        variance and a bias)
    :param n_critic_epochs: full-batch Adam steps of the critic's regression per step
    :param critic_learning_rate: their step size
    :param critic_net_arch: hidden layers of the critic (default ``[64, 64]``; for image observations the
        width of the CNN critic's linear layer after its convolutions, default ``[512]``)
    :param critic_activation: ``"tanh"`` (default) or ``"relu"``
    :param critic_aggregation: ``"local"`` only: independent agents do not communicate, so each
        keeps its own critic (kept in ``agent_critic_*`` and saved with the model)
    :param critic_time_aware: the critic also takes the step's fraction of the horizon ``h/T`` as an
        input (default ``False``): on a fixed horizon the value to go depends on the time left, which
        V(s) alone cannot fit (flat observations only; ``docs/algorithms/baselines.md``)
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running steps
        (subtract the episode's mean, divide by its standard deviation) before the baseline, as the
        MFPO authors' released code and many REINFORCE implementations do (default ``False``, the
        paper's estimator). **Not an unbiased estimate of ∇J**: a per-episode affine map of the returns
        changes the objective (:mod:`fedrl_algos.core.gpomdp`). Step h is weighted by ``γ^h`` times
        its normalised return; the baselines (and the critic's GAE and regression targets) work on
        the normalised returns. GPOMDP only (the estimator here); without a baseline the estimate is
        GPOMDP of the normalised returns in place of eq. (2). Saved with the model; files saved
        without it load with it off
    """

    #: no server: each agent keeps its own critic
    critic_aggregations: ClassVar[tuple[str, ...]] = ("local",)

    round_protocol: ClassVar[type[RoundProtocol] | None] = IndependentPGProtocol
    saved_attribute_renames: ClassVar[dict[str, str]] = {"beta": "step_size", "m": "n_trajectories", "tau": "local_steps"}
    allows_new_agent_count: ClassVar[bool] = False
    obsolete_attributes: ClassVar[tuple[str, ...]] = ("alpha", "eval_adapt_trajectories", "agents_per_round")

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        step_size: float = 0.2,
        n_trajectories: int = 20,
        local_steps: int = 1,
        gamma: float = 0.9,
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
        baseline: str | None = None,
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
        self._set_critic_settings("gpomdp", baseline, gae_lambda, n_critic_epochs, critic_learning_rate, critic_net_arch,
                                  critic_activation, critic_aggregation, critic_time_aware)
        self.normalize_returns = check_normalize_returns(normalize_returns, "gpomdp")
        self.n_trajectories = check_int("n_trajectories", n_trajectories)
        self.local_steps = check_int("local_steps", local_steps)
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

    def _setup_model(self) -> None:
        super()._setup_model()
        self._setup_agent_critic()
        self.estimator = self._make_estimator()
        if self.__dict__.get("agent_theta") is None:
            self.agent_theta = self.policy.theta.detach().expand(self.n_agents, -1).clone()
        self.agent_theta = self.agent_theta.to(self.device)

    def _make_estimator(self) -> PolicyGradient | ScoreFunctionGradient | CriticGradient:
        """Eq. (2)'s plain estimate without a baseline (bitwise the paper's), GPOMDP with one (or
        with ``normalize_returns``: eq. (2) has no place for the normalised returns)."""
        baseline = self.__dict__.get("baseline")
        normalize_returns = self.__dict__.get("normalize_returns", False)  # files saved before the option: off
        if self.critic_network is not None:
            critic = CriticGradient(self.policy, self.gamma, self.n_trajectories, self.critic_network, self._critic_setting("gae_lambda"),
                                    self._critic_setting("n_critic_epochs"), self._critic_setting("critic_learning_rate"),
                                    normalize_returns=normalize_returns)
            critic.name = "independent"
            return critic
        if baseline is None and not normalize_returns:
            return PolicyGradient(self.policy, self.gamma, self.n_trajectories, name="independent")
        estimator = ScoreFunctionGradient(self.policy, self.gamma, self.n_trajectories, "gpomdp", baseline,
                                          normalize_returns=normalize_returns)
        estimator.name = "independent"
        return estimator

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "estimator"]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()
        return state_dicts, [*variables, "agent_theta"]

    @property
    def trajectories_per_call(self) -> int:
        """``n_trajectories``, the batch of every step."""
        return self.n_trajectories

    @property
    def trajectories_per_round(self) -> int:
        return self.local_steps * self.n_trajectories

    @property
    def updates_per_round(self) -> int:
        return self.local_steps

    def _parameters_to_check(self) -> torch.Tensor:
        return self.agent_theta

    def _train_round(self) -> None:
        theta = self.agent_theta.unsqueeze(0)
        critic = self._start_critic_round(self.estimator)
        self.agent_theta = independent_pg_steps(self.federation, theta, self.estimator, self.step_size, self.local_steps)[0]
        self._end_critic_round(self.estimator, critic)

    def evaluate_round(self) -> dict[str, float]:
        """Each agent's own θ_i on its own task, as the common protocol
        (:func:`~fedrl_algos.common.evaluation.own_policy_metrics`)."""
        return own_policy_metrics(self, self.agent_theta)

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False, agent: int | None = None) -> Any:
        """SB3 ``predict``; with ``agent`` it uses that agent's own parameters.

        :param observation: observation(s)
        :param state: unused (no recurrent state)
        :param episode_start: unused
        :param deterministic: the most likely action instead of a sample
        :param agent: agent index (default: the shared initialization)
        """
        if agent is None:
            return super().predict(observation, state, episode_start, deterministic)
        if not 0 <= agent < self.n_agents:
            raise ValueError(f"agent must be in [0, {self.n_agents - 1}], got {agent}")
        saved = self.policy.theta.detach().clone()
        try:
            self.policy.theta.data.copy_(self.agent_theta[agent])
            return self.policy.predict(self._policy_observation(observation), state, episode_start, deterministic)
        finally:
            self.policy.theta.data.copy_(saved)
