"""Per-FedAvg-PG: personalized federated policy gradient by MAML.

Paper: "Personalized Federated Policy Gradient" (Per-FedAvg-PG), sections 3 and 5, Algorithm 1.
Docs: ``docs/algorithms/per_fedavg_pg.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fedrl_algos.common.agent_critic import AgentCriticMixin
from fedrl_algos.common.base_class import FederatedAlgorithm, check_agents_per_round
from fedrl_algos.common.evaluation import personalization_metrics
from fedrl_algos.common.round_protocol import RoundProtocol
from fedrl_algos.common.server_state import ControlVariateStateMixin, check_control_variates
from fedrl_algos.core.adaptation import CRITIC_BASELINE, check_adaptation_baseline
from fedrl_algos.core.critic import CriticBaseline
from fedrl_algos.core.curvature import check_curvature, check_curvature_clip
from fedrl_algos.core.directions import GradientEstimator, check_step_size
from fedrl_algos.per_fedavg_pg.debiased import DebiasedMetaGradient
from fedrl_algos.per_fedavg_pg.protocol import PerFedAvgPGProtocol
from fedrl_algos.per_fedavg_pg.update import ExactMetaGradient, FirstOrderMetaGradient, per_fedavg_pg_round
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.validation import check_int

__all__ = ["PerFedAvgPG"]

_VARIANTS = ("exact", "first_order")
_OBJECTIVES = ("paper", "debiased")
#: the trust region of the default exact variant (``curvature_clip="auto"``): measured to train at m_h = 10
DEFAULT_CURVATURE_CLIP = 1.0


class PerFedAvgPG(AgentCriticMixin, ControlVariateStateMixin, FederatedAlgorithm):
    """Personalized federated policy gradient by MAML (Per-FedAvg-PG).

    Each round the server broadcasts θ; every participating agent takes ``local_steps`` (τ) local
    ascent steps ``θ ← θ + β ∇̂F_i(θ)`` on fresh trajectories of its own MDP, and the server
    averages the results (Algorithm 1). ``∇̂F_i`` is the exact-variant estimator ``(I + αĤ) ĝ_out``
    of eq. (7) (``variant="exact"``; m_in + m_h + m_out trajectories per step) or the Hessian-free
    ``ĝ_out`` of section 5 (``variant="first_order"``; m_in + m_out). The learned θ is an
    initialization that one policy-gradient step of size α personalizes to any task of the family
    (:meth:`adapt`). Docs: ``docs/algorithms/per_fedavg_pg.md``.

    **Defaults that train, the paper's estimator one argument away.** The paper's exact variant at
    m_h = 10 collapses (its section 6, and ``docs/reproduction.md``); the defaults are the settings
    measured to train there and on a user's own env — the causal curvature estimator, leave-one-out
    baselines in the inner step and outer gradient, the trust region ``curvature_clip=1``, β = 0.1
    and batches of 20 (m_in = m_h = m_out; arc navigation, 150 rounds, 10 seeds: median
    post-adaptation return 1.99, every seed ≥ 1.60, where the paper's estimator gets ≈ 0.2; with
    batches of 10 two of eight seeds of the user env collapsed within 100 rounds;
    ``docs/evaluation.md``). ``PerFedAvgPG(..., **PerFedAvgPG.paper_settings)`` is eq. (7) with the
    paper's neural β and batches exactly as the paper writes it.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a :class:`~fedrl_algos.policies.FlatPolicy` class
    :param env: the agents' environments: a fedrl id or task family (its training tasks, or one
        task per ``agent_kwargs`` dict), a ``FederatedVecEnv`` of either backend, or any registered
        Gymnasium id with ``agent_kwargs`` or ``n_agents``
    :param alpha: adaptation step size α (inner step); default 1.0 (the paper's neural setting,
        the tabular experiments use 2.0)
    :param step_size: local (outer) step size β; default 0.1 (measured to train on arc navigation and on a
        user's env; the paper's neural setting is 0.2, its tabular one 0.3)
    :param local_steps: local steps per round τ
    :param m_in: inner-batch trajectories (ĝ_in); default 20 (the paper's 10 trained unstably on a
        user's env: ``docs/evaluation.md``)
    :param m_h: Hessian-batch trajectories (Ĥ; exact variant only); default 20
    :param m_out: outer-batch trajectories (ĝ_out, sampled at the adapted parameters); default 20
    :param variant: ``"exact"`` or ``"first_order"``
    :param gamma: discount γ
    :param agents_per_round: agents sampled without replacement each round (default: all); only the
        sampled agents are computed and only their random streams advance
    :param control_variates: SCAFFOLD's control-variate correction of the local steps
        (``θ_i ← θ_i + β (∇̂F_i + c − c_i)``, option II controls; saved with the model); needs
        ``step_size > 0``. Docs: ``docs/algorithms/per_fedavg_pg.md``
    :param hvp_chunk: trajectories per chunk of the Hessian-vector product (memory/cache trade-off)
    :param eval_trajectories: Monte Carlo rollouts per agent of the logged evaluation before and
        after adaptation (``None``: 32; 0: none; the paper's evaluation uses 512), the common
        protocol of :mod:`fedrl_algos.common.evaluation`. Evaluation runs only when the logger has
        an output (``verbose=1``, a CSV/TensorBoard logger), on separate streams.
    :param eval_adapt_trajectories: trajectories of the logged evaluation adaptation step
        (default 64; the paper's evaluation uses 256)
    :param policy_kwargs: keyword arguments of the policy (e.g. ``dtype``, ``net_arch``, ``init_seed``)
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run (drawn at random when ``None``)
    :param device: torch device (``"auto"``: CUDA when available)
    :param verbose: 0 silent, 1 logger output to stdout
    :param agent_kwargs: with an env id: one dict per agent (``make_params`` arguments of a fedrl
        family, ``gym.make`` arguments of a Gymnasium env)
    :param n_agents: with a Gymnasium id: that many identical agents
    :param horizon: last time index H of the sampled episodes (default: the family's, or the
        Gymnasium env's ``max_episode_steps − 1``)
    :param normalize_observations: SB3 ``VecNormalize`` observation normalization, statistics
        pooled by the server each round (see :class:`~fedrl_algos.common.FederatedAlgorithm`)
    :param objective: ``"paper"`` (default): eq. (5), ``F_i(θ) = J_i(θ + α∇J_i(θ))``, estimated by
        ``variant``; ``"debiased"``: SG-MRL's stochastic-adaptation objective
        ``E_{D_in}[J_i(θ + α ĝ_in(D_in))]`` with its unbiased meta-gradient
        (:class:`~fedrl_algos.per_fedavg_pg.debiased.DebiasedMetaGradient`; needs
        ``variant="exact"``, draws no Hessian batch: m_in + m_out trajectories per step)
    :param adaptation_baseline: baseline of every adaptation gradient ĝ_in — the inner step of
        training, the logged evaluation and :meth:`adapt`: ``"loo"`` (default: time-dependent mean
        reward-to-go of the other trajectories of the batch; unbiased, lower variance), ``None``
        (the paper's eq. (2)), ``"mean"`` (including the trajectory itself; biased by O(1/m)),
        ``"linear"`` (garage's linear feature baseline of the state and time step, fitted on the other
        folds of the batch: unbiased; :mod:`fedrl_algos.core.baselines`) or ``"critic"`` (a learned
        value function V_φ(s) per agent with GAE(λ) step weights, fitted on each inner and outer batch
        after weighting it: unbiased with λ = 1; :mod:`fedrl_algos.core.critic`). With ``"critic"``
        the logged evaluation adapts each agent with its own critic and :meth:`adapt` a new task with
        the agents' averaged one (neither is fitted there)
    :param curvature: the exact variant's curvature estimator ``Ĥ``: ``"auto"`` (default:
        ``"causal"`` where there is a curvature term — ``variant="exact"``, ``objective="paper"`` —
        and ``"paper"`` otherwise), ``"paper"`` (eq. (3)), ``"causal"`` (Hessian of a
        causality-respecting surrogate with a leave-one-out per-step baseline: unbiased, lower
        variance) or ``"lvc"`` (ProMP's low-variance curvature, **biased**); see
        ``docs/algorithms/per_fedavg_pg.md``. Values other than ``"auto"``/``"paper"`` need
        ``variant="exact"`` and ``objective="paper"``. Saved with the model; files saved without it
        load as ``"paper"``
    :param outer_baseline: baseline of the outer gradient ĝ_out of training (at the adapted
        parameters): ``"loo"`` (default, unbiased), ``None`` (eq. (2)), ``"mean"`` or ``"linear"``, as
        ``adaptation_baseline`` (``"critic"`` included: one critic per agent serves the inner and the outer
        batches). The exact variant multiplies ĝ_out by ``I + αĤ``, so a less noisy
        ĝ_out also makes the curvature term less noisy. Saved with the model; files saved without it
        load as ``None``
    :param curvature_clip: ``c`` of a trust region on the exact variant's curvature term: where
        ``‖αĤĝ_out‖ > c‖ĝ_out‖`` the term is shortened to that length (**biased** where it acts).
        ``"auto"`` (default): ``c = 1`` where there is a curvature term (``variant="exact"``,
        ``objective="paper"``), none otherwise; ``None``: eq. (7) unclipped. With ``c = 1`` the exact
        variant trains at m_h = 10–50 on arc navigation, where it otherwise collapses
        (``docs/reproduction.md``). A number needs ``variant="exact"`` and ``objective="paper"``.
        Saved with the model; files saved without it load as ``None``
    :param gae_lambda: λ of GAE where a baseline is ``"critic"`` (default 1: the state-dependent
        baseline ``γ^h V_φ(s_h)``, unbiased; SB3's 0.95 trades bias for variance)
    :param n_critic_epochs: full-batch Adam steps of the critic's regression per batch (inner and outer)
    :param critic_learning_rate: their step size
    :param critic_net_arch: hidden layers of the critic (default ``[64, 64]``; image observations: the
        width after the Nature CNN's convolutions, default ``[512]``); SB3's
        ``policy_kwargs=dict(net_arch=dict(pi=[...], vf=[...]))`` works too
    :param critic_activation: ``"tanh"`` (default) or ``"relu"``
    :param critic_aggregation: the federated rule for φ: ``"local"`` (default: each agent keeps its
        own critic — the agents' tasks differ, and so do their values) or ``"average"`` (each round the
        server averages the participants' critics and broadcasts the average with θ). Every agent's
        critic is kept in ``agent_critic_*`` and saved with the model; with ``agents_per_round`` every
        agent is computed and only the sampled agents' fits are kept (with ``"average"`` their average
        is then sent to every agent); an agent whose update the server rejects keeps its critic
    :param critic_time_aware: the critic also takes the step's fraction of the horizon ``h/T`` as an
        input (default ``False``): on a fixed horizon the value to go depends on the time left, which
        V(s) alone cannot fit (flat observations only; ``docs/algorithms/baselines.md``)

    >>> from fedrl_algos import PerFedAvgPG
    >>> model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", alpha=2.0, step_size=0.3, seed=0, device="cpu")
    >>> model = model.learn(total_rounds=2)
    >>> model.theta.shape
    torch.Size([100])
    """

    round_protocol: ClassVar[type[RoundProtocol] | None] = PerFedAvgPGProtocol
    #: the paper's estimator, eq. (7) with eq. (2)'s gradients and eq. (3)'s curvature, where the
    #: defaults differ from it: ``PerFedAvgPG(policy, env, **PerFedAvgPG.paper_settings)``
    paper_settings: ClassVar[dict[str, Any]] = {
        "step_size": 0.2, "m_in": 10, "m_h": 10, "m_out": 10, "adaptation_baseline": None, "outer_baseline": None,
        "curvature": "paper", "curvature_clip": None,
    }
    saved_attribute_renames: ClassVar[dict[str, str]] = {"beta": "step_size", "tau": "local_steps"}
    #: files saved before these options existed ran the paper's estimator
    attributes_of_older_files: ClassVar[dict[str, Any]] = {
        "adaptation_baseline": None, "outer_baseline": None, "curvature": "paper", "curvature_clip": None,
    }

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        alpha: float = 1.0,
        step_size: float = 0.1,
        local_steps: int = 5,
        m_in: int = 20,
        m_h: int = 20,
        m_out: int = 20,
        variant: str = "exact",
        gamma: float = 0.9,
        agents_per_round: int | None = None,
        control_variates: bool = False,
        hvp_chunk: int = 100,
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
        objective: str = "paper",
        adaptation_baseline: str | None = "loo",
        curvature: str = "auto",
        outer_baseline: str | None = "loo",
        curvature_clip: float | str | None = "auto",
        gae_lambda: float = 1.0,
        n_critic_epochs: int = 5,
        critic_learning_rate: float = 1e-3,
        critic_net_arch: Sequence[int] | None = None,
        critic_activation: str = "tanh",
        critic_aggregation: str = "local",
        critic_time_aware: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        if variant not in _VARIANTS:
            raise ValueError(f"variant must be one of {_VARIANTS}, got {variant!r}")
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective must be one of {_OBJECTIVES}, got {objective!r}")
        if objective == "debiased" and variant != "exact":
            raise ValueError(
                "objective='debiased' needs variant='exact' (its first-order estimator, ĝ_out alone, is the same "
                f"as the paper objective's variant='first_order'), got variant={variant!r}"
            )
        self.variant = variant
        self.objective = objective
        self.adaptation_baseline = check_adaptation_baseline(adaptation_baseline, allow_critic=True)
        self.outer_baseline = check_adaptation_baseline(outer_baseline, "outer_baseline", allow_critic=True)
        self._set_critic_options(self.uses_critic, gae_lambda, n_critic_epochs, critic_learning_rate, critic_net_arch,
                                 critic_activation, critic_aggregation, critic_time_aware)
        self.alpha = check_step_size("alpha", alpha)
        self.step_size = check_step_size("step_size", step_size)
        self.local_steps = check_int("local_steps", local_steps)
        self.m_in = check_int("m_in", m_in)
        self.m_h = check_int("m_h", m_h)
        self.m_out = check_int("m_out", m_out)
        self.hvp_chunk = check_int("hvp_chunk", hvp_chunk)
        has_curvature_term = variant == "exact" and objective == "paper"
        if curvature == "auto":
            curvature = "causal" if has_curvature_term else "paper"
        if isinstance(curvature_clip, str) and curvature_clip == "auto":
            curvature_clip = DEFAULT_CURVATURE_CLIP if has_curvature_term else None
        self.curvature = check_curvature(curvature)
        if curvature != "paper" and not has_curvature_term:
            raise ValueError(
                f"curvature={curvature!r} needs variant='exact' and objective='paper' (only that estimator has a "
                f"curvature batch), got variant={variant!r}, objective={objective!r}"
            )
        self.curvature_clip = check_curvature_clip(curvature_clip)
        if curvature_clip is not None and not has_curvature_term:
            raise ValueError(
                f"curvature_clip={curvature_clip!r} needs variant='exact' and objective='paper' (only that estimator has a "
                f"curvature term), got variant={variant!r}, objective={objective!r}"
            )
        self.eval_adapt_trajectories = check_int("eval_adapt_trajectories", eval_adapt_trajectories, 0)
        self.agents_per_round = agents_per_round
        self.control_variates = check_control_variates(control_variates)
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
        self.agents_per_round = check_agents_per_round(self.agents_per_round, self.n_agents)
        if check_control_variates(self.control_variates) and not self.step_size > 0:
            raise ValueError(f"control_variates=True needs step_size > 0 (the controls divide the local progress by it), got {self.step_size}")
        super()._setup_model()
        self._setup_agent_critic()
        self.estimator = self._make_estimator()
        self._setup_control_variates()

    def _make_estimator(self) -> GradientEstimator:
        # Files saved before these options existed hold neither attribute: the paper's defaults.
        baseline, outer = self.__dict__.get("adaptation_baseline"), self.__dict__.get("outer_baseline")
        critics = None
        if self.critic_network is not None:
            critics = CriticBaseline(self.gamma, self.critic_network, self._critic_setting("gae_lambda"),
                                     self._critic_setting("n_critic_epochs"), self._critic_setting("critic_learning_rate"))
        if self.__dict__.get("objective", "paper") == "debiased":
            return DebiasedMetaGradient(self.policy, self.gamma, self.alpha, self.m_in, self.m_out, inner_baseline=baseline,
                                        outer_baseline=outer, critics=critics)
        if self.variant == "exact":
            return ExactMetaGradient(self.policy, self.gamma, self.alpha, self.m_in, self.m_h, self.m_out, self.hvp_chunk,
                                     inner_baseline=baseline, curvature=self.__dict__.get("curvature", "paper"), outer_baseline=outer,
                                     curvature_clip=self.__dict__.get("curvature_clip"), critics=critics)
        return FirstOrderMetaGradient(self.policy, self.gamma, self.alpha, self.m_in, self.m_out, inner_baseline=baseline,
                                      outer_baseline=outer, critics=critics)

    #: the constructor arguments that choose the critic, as refusals name them
    critic_baseline_arguments: ClassVar[str] = "adaptation_baseline='critic' or outer_baseline='critic'"

    @property
    def uses_critic(self) -> bool:
        """Whether an adaptation or outer gradient is weighted by the learned critic."""
        return CRITIC_BASELINE in (self.__dict__.get("adaptation_baseline"), self.__dict__.get("outer_baseline"))

    def _baseline_description(self) -> str:
        return f"adaptation_baseline={self.__dict__.get('adaptation_baseline')!r}, outer_baseline={self.__dict__.get('outer_baseline')!r}"

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "estimator"]

    @property
    def trajectories_per_call(self) -> int:
        """``m_in``, the inner batch of every local step."""
        return self.m_in

    @property
    def trajectories_per_round(self) -> int:
        return self.local_steps * self.estimator.trajectories_per_step

    @property
    def updates_per_round(self) -> int:
        return self.local_steps

    @property
    def participating_agents(self) -> int:
        return self.agents_per_round or self.n_agents

    @property
    def adaptation_step_size(self) -> float:
        return self.alpha

    @property
    def default_adaptation_baseline(self) -> str | None:
        return self.__dict__.get("adaptation_baseline")

    def _train_round(self) -> None:
        theta = self.policy.theta.detach().unsqueeze(0)
        control = self.control_state
        critic = self._start_critic_round(self.estimator)
        rejected: list = []
        new_theta, mask = per_fedavg_pg_round(
            self.federation, theta, self.estimator, self.step_size, self.local_steps, self.agents_per_round,
            self._rejections_recorded(rejected), control,
        )
        self._end_critic_round(self.estimator, critic, self._critic_participants(mask, rejected))
        self._store_control_state(control)
        self.policy.theta.data.copy_(new_theta[0])

    def evaluate_round(self) -> dict[str, float]:
        """The server policy's returns before and after one adaptation step of size α, as the
        common protocol (:func:`~fedrl_algos.common.evaluation.personalization_metrics`)."""
        baseline = self.default_adaptation_baseline
        critic = self._frozen_critics(self.critic_state) if baseline == CRITIC_BASELINE else None
        return personalization_metrics(self, self.alpha, self.eval_adapt_trajectories, baseline, critic)
