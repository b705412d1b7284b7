"""Per-FedAvg-PG, FedAvg-PG and independent policy gradient.

Paper: "Personalized Federated Policy Gradient" (Per-FedAvg-PG), sections 3 and 5, Algorithm 1.
Docs: ``docs/algorithms/per_fedavg_pg.md``, ``docs/algorithms/fedavg_pg.md``,
``docs/algorithms/independent_pg.md``.
"""

from __future__ import annotations

from typing import Any

import torch

from fedrl_algos.base import FederatedAlgorithm
from fedrl_algos.core.meta import ExactMetaGradient, FirstOrderMetaGradient, GradientEstimator, PolicyGradient
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.core import check_int

__all__ = ["PerFedAvgPG", "FedAvgPG", "IndependentPG"]

_VARIANTS = ("exact", "first_order")


class PerFedAvgPG(FederatedAlgorithm):
    """Personalized federated policy gradient by MAML (Per-FedAvg-PG).

    Each round the server broadcasts θ; every participating agent takes ``tau`` local ascent
    steps ``θ ← θ + β ∇̂F_i(θ)`` on fresh trajectories of its own MDP, and the server averages the
    results. ``∇̂F_i`` is the exact-variant estimator ``(I + αĤ) ĝ_out`` (``variant="exact"``; m_in
    + m_h + m_out trajectories per step) or the Hessian-free ``ĝ_out`` (``variant="first_order"``;
    m_in + m_out). The learned θ is an initialization that one policy-gradient step of size α
    personalizes to any task of the family (:meth:`adapt`). Docs: ``docs/algorithms/per_fedavg_pg.md``.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a :class:`~fedrl_algos.policies.FlatPolicy` class
    :param env: a registered fedrl id (its family's training tasks), a task family, or a
        ``FederatedVecEnv`` on a fedrl family
    :param alpha: adaptation step size α (inner step); default 1.0 (the paper's neural setting,
        the tabular experiments use 2.0)
    :param beta: local (outer) step size β; default 0.2 (neural; tabular: 0.3)
    :param tau: local steps per round τ
    :param m_in: inner-batch trajectories (ĝ_in)
    :param m_h: Hessian-batch trajectories (exact variant only)
    :param m_out: outer-batch trajectories (ĝ_out, sampled at the adapted parameters)
    :param variant: ``"exact"`` or ``"first_order"``
    :param gamma: discount γ
    :param agents_per_round: agents sampled without replacement each round (default: all)
    :param hvp_chunk: trajectories per chunk of the Hessian-vector product (memory/cache trade-off)
    :param eval_trajectories: Monte Carlo rollouts per agent for the logged pre/post-adaptation
        returns; default ``None``: 0 for families with an exact model (they log the exact F and f)
        and 32 otherwise (0 turns it off; the paper's evaluation uses 512). Evaluation runs only when
        the logger has an output (``verbose=1``, a CSV/TensorBoard logger), on separate streams.
    :param eval_adapt_trajectories: trajectories of the logged evaluation adaptation step
        (default ``None``: 64; the paper's evaluation uses 256)
    :param policy_kwargs: keyword arguments of the policy (e.g. ``dtype``, ``net_arch``, ``init_seed``)
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run (drawn at random when ``None``)
    :param device: torch device (``"auto"``: CUDA when available)
    :param verbose: 0 silent, 1 logger output to stdout

    >>> from fedrl_algos import PerFedAvgPG
    >>> model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", alpha=2.0, beta=0.3, seed=0, device="cpu")
    >>> model = model.learn(total_rounds=2)
    >>> model.theta.shape
    torch.Size([100])
    """

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        alpha: float = 1.0,
        beta: float = 0.2,
        tau: int = 5,
        m_in: int = 10,
        m_h: int = 10,
        m_out: int = 10,
        variant: str = "exact",
        gamma: float = 0.9,
        agents_per_round: int | None = None,
        hvp_chunk: int = 100,
        eval_trajectories: int | None = None,
        eval_adapt_trajectories: int | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        _init_setup_model: bool = True,
    ) -> None:
        if variant not in _VARIANTS:
            raise ValueError(f"variant must be one of {_VARIANTS}, got {variant!r}")
        self.variant = variant
        self.m_in = check_int("m_in", m_in)
        self.m_h = check_int("m_h", m_h)
        self.m_out = check_int("m_out", m_out)
        self.hvp_chunk = check_int("hvp_chunk", hvp_chunk)
        super().__init__(
            policy,
            env,
            beta=beta,
            tau=tau,
            alpha=alpha,
            gamma=gamma,
            agents_per_round=agents_per_round,
            eval_trajectories=eval_trajectories,
            eval_adapt_trajectories=eval_adapt_trajectories,
            policy_kwargs=policy_kwargs,
            tensorboard_log=tensorboard_log,
            seed=seed,
            device=device,
            verbose=verbose,
            _init_setup_model=_init_setup_model,
        )

    def _make_estimator(self) -> GradientEstimator:
        if self.variant == "exact":
            return ExactMetaGradient(self.policy, self.gamma, self.alpha, self.m_in, self.m_h, self.m_out, self.hvp_chunk)
        return FirstOrderMetaGradient(self.policy, self.gamma, self.alpha, self.m_in, self.m_out)


class FedAvgPG(FederatedAlgorithm):
    """Non-personalized federated policy gradient (FedAvg applied to REINFORCE).

    Each local step forms one policy-gradient estimate from ``m_in + m_h + m_out`` trajectories
    (the exact variant's per-step budget, as in the paper). Training does not depend on α; α is
    used only to evaluate the post-adaptation objective F and as :meth:`adapt`'s default step.
    Docs: ``docs/algorithms/fedavg_pg.md``.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a FlatPolicy class
    :param env: a registered fedrl id, a task family, or a ``FederatedVecEnv`` on a fedrl family
    :param beta: local step size
    :param alpha: adaptation step size used for evaluation and :meth:`adapt` only
    :param tau: local steps per round
    :param m_in: first part of the per-step batch
    :param m_h: second part of the per-step batch
    :param m_out: third part of the per-step batch (the batch is ``m_in + m_h + m_out``)
    :param gamma: discount
    :param agents_per_round: agents sampled per round (default: all)
    :param eval_trajectories: see :class:`PerFedAvgPG`
    :param eval_adapt_trajectories: see :class:`PerFedAvgPG`
    :param policy_kwargs: policy keyword arguments
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream
    :param device: torch device
    :param verbose: verbosity
    """

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        beta: float = 0.2,
        alpha: float = 0.0,
        tau: int = 5,
        m_in: int = 10,
        m_h: int = 10,
        m_out: int = 10,
        gamma: float = 0.9,
        agents_per_round: int | None = None,
        eval_trajectories: int | None = None,
        eval_adapt_trajectories: int | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        _init_setup_model: bool = True,
    ) -> None:
        self.m_in = check_int("m_in", m_in)
        self.m_h = check_int("m_h", m_h, 0)
        self.m_out = check_int("m_out", m_out, 0)
        super().__init__(
            policy,
            env,
            beta=beta,
            tau=tau,
            alpha=alpha,
            gamma=gamma,
            agents_per_round=agents_per_round,
            eval_trajectories=eval_trajectories,
            eval_adapt_trajectories=eval_adapt_trajectories,
            policy_kwargs=policy_kwargs,
            tensorboard_log=tensorboard_log,
            seed=seed,
            device=device,
            verbose=verbose,
            _init_setup_model=_init_setup_model,
        )

    def _make_estimator(self) -> GradientEstimator:
        return PolicyGradient(self.policy, self.gamma, self.m_in + self.m_h + self.m_out, name="fedavg")


class IndependentPG(FederatedAlgorithm):
    """Every agent trains its own policy from the shared initialization, without communication.

    The paper's from-scratch baseline. A "round" is ``tau`` local policy-gradient steps of
    ``m`` trajectories on every agent; the agents' parameters are :attr:`agent_theta` ``[n, d]``
    and :meth:`predict` uses ``agent``'s own parameters. Docs: ``docs/algorithms/independent_pg.md``.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a FlatPolicy class
    :param env: a registered fedrl id, a task family, or a ``FederatedVecEnv`` on a fedrl family
    :param beta: step size
    :param m: trajectories per policy-gradient step
    :param tau: steps per round
    :param gamma: discount
    :param eval_trajectories: Monte Carlo rollouts per agent for ``eval/mc_return`` (default: 0
        with an exact model, else 32)
    :param policy_kwargs: policy keyword arguments
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream
    :param device: torch device
    :param verbose: verbosity
    """

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        beta: float = 0.2,
        m: int = 20,
        tau: int = 1,
        gamma: float = 0.9,
        eval_trajectories: int | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        _init_setup_model: bool = True,
    ) -> None:
        self.m = check_int("m", m)
        super().__init__(
            policy,
            env,
            beta=beta,
            tau=tau,
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

    def _setup_model(self) -> None:
        super()._setup_model()
        if getattr(self, "agent_theta", None) is None:
            self.agent_theta = self.policy.theta.detach().expand(self.n_agents, -1).clone()
        self.agent_theta = self.agent_theta.to(self.device)

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()
        return state_dicts, [*variables, "agent_theta"]

    def _make_estimator(self) -> GradientEstimator:
        return PolicyGradient(self.policy, self.gamma, self.m, name="independent")

    def _train_round(self) -> None:
        theta = self.agent_theta.unsqueeze(0)
        self.agent_theta = self.federation.independent_steps(theta, self.estimator, self.beta, self.tau)[0]

    def evaluate_round(self) -> dict[str, float]:
        """Each agent's own return: exact for tabular families, Monte Carlo when ``eval_trajectories > 0``."""
        out: dict[str, float] = {}
        if self.evaluator is not None:
            own = self.evaluator.returns(self.agent_theta.to(torch.float64).cpu())  # [n (theta), n (task)]
            out["return"] = float(torch.diagonal(own).mean())
        if self.eval_trajectories > 0:
            out["mc_return"] = float(self.federation.evaluate(self.agent_theta.unsqueeze(0), self.eval_trajectories).mean())
        return out

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
            return self.policy.predict(observation, state, episode_start, deterministic)
        finally:
            self.policy.theta.data.copy_(saved)
