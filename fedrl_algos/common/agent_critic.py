"""Every agent's learned value function (``baseline="critic"``) kept with a federation's model.

One mixin for every policy-gradient federation that offers the critic (MFPO, FedAvg-PG,
independent PG, FedPG-BR, Per-FedAvg-PG): the constructor's checks and settings, the value network
for the model's observations, every agent's critic as saved fields, files saved without them, and
the critics of an adaptation step (:meth:`AgentCriticMixin._adaptation_critics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from fedrl_algos.common.learn import check_optional_dict
from fedrl_algos.core.critic import (
    CRITIC_AGGREGATIONS,
    CriticBaseline,
    CriticState,
    FlatCritic,
    MlpCritic,
    average_critics,
    check_critic_settings,
    federate_critics,
)
from fedrl_algos.core.gpomdp import check_estimator_and_baseline
from fedrl_algos.core.optim import AdamState
from fedrl_algos.policies.critics import critic_for_space
from fedrl_envs.validation import check_bool

__all__ = ["AgentCriticMixin", "CRITIC_FIELDS", "CRITIC_SETTINGS", "critic_fields"]



def critic_fields(owner: str = "agent") -> tuple[str, ...]:
    """The model's fields of ``owner``'s critics (``"agent"``: every agent's, ``[n, ...]``;
    ``"server"``: a server's own, ``[1, ...]``): φ, the fit's Adam state, μ and σ."""
    return tuple(f"{owner}_critic_{part}" for part in ("phi", "adam_step", "adam_first", "adam_second", "mean", "scale"))


#: the model's fields of every agent's critic (``baseline="critic"``), saved with it, each ``[n, ...]``
CRITIC_FIELDS = critic_fields("agent")
#: the critic's settings and their defaults (what files saved before them hold)
CRITIC_SETTINGS: dict[str, Any] = {"gae_lambda": 1.0, "n_critic_epochs": 5, "critic_learning_rate": 1e-3, "critic_net_arch": None,
                                   "critic_activation": "tanh", "critic_aggregation": "local", "critic_time_aware": False}


class AgentCriticMixin:
    """Keeps every agent's critic (``baseline="critic"``, :mod:`fedrl_algos.core.critic`) in the
    model's saved fields :data:`CRITIC_FIELDS` (``[n, ...]``, mapped to the load device; only with the
    critic, so other files keep their fields).

    The class using it calls :meth:`_set_critic_settings` from its constructor (instead of
    :func:`~fedrl_algos.core.gpomdp.check_estimator_and_baseline`) and :meth:`_setup_agent_critic`
    from ``_setup_model`` once the policy exists. Each agent's critic starts from the same φ drawn
    from the model's seed, with a zero output layer (V = 0).
    """

    #: the federated rules for φ this algorithm accepts (:data:`~fedrl_algos.core.critic.CRITIC_AGGREGATIONS`)
    critic_aggregations: ClassVar[tuple[str, ...]] = CRITIC_AGGREGATIONS
    #: whose critics the model keeps: ``"agent"`` (every agent's) and, for a server that samples
    #: trajectories of its own (FedPG-BR), ``"server"``
    critic_owners: ClassVar[tuple[str, ...]] = ("agent",)
    #: the constructor argument(s) that choose the critic, as refusals name them
    critic_baseline_arguments: ClassVar[str] = "baseline='critic'"

    def __init__(self, *args: Any, policy_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, policy_kwargs=self._split_net_arch(policy_kwargs), **kwargs)  # type: ignore[call-arg]

    def _split_net_arch(self, policy_kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        """SB3's ``policy_kwargs=dict(net_arch=dict(pi=[...], vf=[...]))``: ``pi`` is the policy's
        ``net_arch``, ``vf`` the critic's hidden layers (``critic_net_arch``; ``baseline="critic"``
        only). The policy keeps a plain list, so the saved ``policy_kwargs`` are the policy's own."""
        check_optional_dict("policy_kwargs", policy_kwargs)
        if not policy_kwargs or not isinstance(policy_kwargs.get("net_arch"), dict):
            return policy_kwargs
        arch = policy_kwargs["net_arch"]
        unknown = sorted(set(arch) - {"pi", "vf"})
        if unknown:
            raise ValueError(f"policy_kwargs['net_arch'] as a dict takes SB3's keys 'pi' (the policy) and 'vf' (the critic), got {unknown}")
        if "vf" in arch:
            if not self.uses_critic:
                raise ValueError(f"policy_kwargs['net_arch']['vf'] sizes the critic, which needs {self.critic_baseline_arguments}, "
                                 f"got {self._baseline_description()}")
            vf = arch["vf"]
            MlpCritic(1, vf, self.critic_activation)  # checks the sizes (ValueError naming critic_net_arch)
            if self.critic_net_arch is not None and list(vf) != self.critic_net_arch:
                raise ValueError(f"policy_kwargs['net_arch']['vf'] = {vf!r} and critic_net_arch = {self.critic_net_arch!r} "
                                 f"both size the critic: give one")
            self.critic_net_arch = list(vf)
        rest = {key: value for key, value in policy_kwargs.items() if key != "net_arch"}
        if "pi" in arch:
            rest["net_arch"] = arch["pi"]
        return rest

    def _set_critic_settings(
        self,
        estimator: str,
        baseline: str | None,
        gae_lambda: float,
        n_critic_epochs: int,
        critic_learning_rate: float,
        critic_net_arch: Sequence[int] | None,
        critic_activation: str,
        critic_aggregation: str,
        critic_time_aware: bool = False,
    ) -> None:
        """Check ``estimator`` and ``baseline`` (and, with ``baseline="critic"``, every critic
        setting: GPOMDP only, ``ValueError`` naming the argument) and keep them on the model."""
        if baseline == "critic":
            if estimator != "gpomdp":
                raise ValueError(f"baseline='critic' needs estimator='gpomdp' (GAE weights each step), got estimator={estimator!r}")
        else:
            check_estimator_and_baseline(estimator, baseline)
        self.baseline = baseline
        self._set_critic_options(baseline == "critic", gae_lambda, n_critic_epochs, critic_learning_rate, critic_net_arch,
                                 critic_activation, critic_aggregation, critic_time_aware)

    def _set_critic_options(
        self,
        checked: bool,
        gae_lambda: float,
        n_critic_epochs: int,
        critic_learning_rate: float,
        critic_net_arch: Sequence[int] | None,
        critic_activation: str,
        critic_aggregation: str,
        critic_time_aware: bool = False,
    ) -> None:
        """Keep the critic's settings on the model; ``checked`` (the model uses the critic): check
        each first (``ValueError`` naming the argument)."""
        critic_time_aware = check_bool("critic_time_aware", critic_time_aware)
        if critic_time_aware and not checked:
            raise ValueError(f"critic_time_aware=True gives the critic a time input, which needs {self.critic_baseline_arguments}, "
                             f"got {self._baseline_description()}")
        if checked:
            check_critic_settings(gae_lambda, n_critic_epochs, critic_learning_rate, critic_aggregation)
            if critic_aggregation not in self.critic_aggregations:
                raise ValueError(f"critic_aggregation must be one of {self.critic_aggregations} for {type(self).__name__}, "
                                 f"got {critic_aggregation!r}")
            # checks the architecture's arguments (None: the network's default, [64, 64] or, for
            # image observations, the CNN critic's [512]; critic_for_space checks the image case)
            MlpCritic(1, [64, 64] if critic_net_arch is None else critic_net_arch, critic_activation)
            critic_net_arch = None if critic_net_arch is None else list(critic_net_arch)
        self.gae_lambda, self.n_critic_epochs, self.critic_learning_rate = float(gae_lambda), n_critic_epochs, float(critic_learning_rate)
        self.critic_net_arch, self.critic_activation, self.critic_aggregation = critic_net_arch, critic_activation, critic_aggregation
        self.critic_time_aware = critic_time_aware

    def _baseline_description(self) -> str:
        """The model's baseline argument(s) as a refusal quotes them."""
        return f"baseline={self.__dict__.get('baseline')!r}"

    def _critic_setting(self, name: str) -> Any:
        """A critic setting (its default for files saved before it existed)."""
        return self.__dict__.get(name, CRITIC_SETTINGS[name])

    @property
    def uses_critic(self) -> bool:
        """Whether the model's baseline is the learned critic."""
        return self.__dict__.get("baseline") == "critic"

    def _make_critic(self) -> FlatCritic | None:
        """The value network of ``baseline="critic"`` for this model's observations, else ``None``."""
        if not self.uses_critic:
            return None
        # the time input's T is the federation's horizon (H + 1 steps), fixed for every batch
        time_horizon = self.federation.horizon + 1 if self._critic_setting("critic_time_aware") else None
        return critic_for_space(self.observation_space, self._critic_setting("critic_net_arch"), self._critic_setting("critic_activation"),
                                time_horizon)

    def _setup_agent_critic(self) -> FlatCritic | None:
        """The value network (``None`` without the critic), also kept as :attr:`critic_network`;
        the critic fields of every owner (:attr:`critic_owners`) are made (from the seed) where the
        model holds none, and moved to the model's device."""
        critic = self.critic_network = self._make_critic()
        if critic is None:
            return None
        for owner in self.critic_owners:
            if self.__dict__.get(f"{owner}_critic_phi") is None:
                rows = self.n_agents if owner == "agent" else 1
                phi = critic.initial_phi(self.seed, self.policy.theta.dtype).expand(rows, -1).clone()
                self._keep_critic(critic.initial_state(phi), owner)
            for name in critic_fields(owner):
                setattr(self, name, getattr(self, name).to(self.device))
        return critic

    def _keep_critic(self, critic: CriticState, owner: str = "agent") -> None:
        """Store ``owner``'s critics in the model's saved fields: every agent's (batch ``[1, n]`` or
        ``[n]``) or the server's (batch ``[1]``)."""
        rows = self.n_agents if owner == "agent" else 1
        phi, moments, mean, scale = critic
        values = (phi, moments.step, moments.first, moments.second, mean, scale)
        for name, value in zip(critic_fields(owner), values, strict=True):
            setattr(self, name, value.reshape(rows, *value.shape[phi.dim() - 1:]).clone())

    def _critic_of(self, owner: str) -> CriticState | None:
        """``owner``'s critics from the saved fields (``None`` without the critic): the agents'
        with batch ``[1, n]``, the server's ``[1]``."""
        if not self.uses_critic:
            return None
        phi, step, first, second, mean, scale = (getattr(self, name) for name in critic_fields(owner))
        if owner == "agent":
            phi, step, first, second, mean, scale = (x.unsqueeze(0) for x in (phi, step, first, second, mean, scale))
        return CriticState(phi, AdamState(step, first, second), mean, scale)

    @property
    def critic_state(self) -> CriticState | None:
        """Every agent's critic (batch ``[1, n]``) with ``baseline="critic"``, else ``None``."""
        return self._critic_of("agent")

    # --- a round with a CriticBaseline in the local direction -------------------------------------
    @staticmethod
    def _critic_gradient(estimator: Any) -> CriticBaseline | None:
        """The :class:`~fedrl_algos.core.critic.CriticBaseline` of ``estimator``: the estimator itself
        (a :class:`~fedrl_algos.core.critic.CriticGradient`), the one a wrapper such as an attack holds
        as ``inner``, or the ``critics`` a meta-gradient weights its batches with; else ``None``."""
        while estimator is not None and not isinstance(estimator, CriticBaseline):
            inner = getattr(estimator, "inner", None)
            estimator = inner if inner is not None else getattr(estimator, "critics", None)
        return estimator

    def _start_critic_round(self, estimator: Any) -> CriticState | None:
        """Hand every agent's critic to the round's :class:`~fedrl_algos.core.critic.CriticBaseline`
        (none: ``None``); returns the critics of the round's start for :meth:`_end_critic_round`."""
        gradient = self._critic_gradient(estimator)
        if gradient is None:
            return None
        start = self.critic_state
        gradient.state = start
        return start

    def _rejections_recorded(self, rejected: list[Any]) -> Any:
        """An ``on_reject`` callback for the round: the model's own (:meth:`_reject_updates`), and the
        check kept in ``rejected`` so that :meth:`_critic_participants` can leave those agents out."""
        def on_reject(check: Any) -> None:
            rejected.append(check)
            self._reject_updates(check)  # type: ignore[attr-defined]

        return on_reject

    @staticmethod
    def _critic_participants(mask: torch.Tensor | None, rejected: list[Any]) -> torch.Tensor | None:
        """The agents ``[1, n]`` whose fitted critics the round keeps: sampled (``mask``; ``None``:
        all) and not rejected by the server (a rejected agent keeps its critic of the round's start,
        as Flower's server does with a rejected reply)."""
        participating = None if mask is None else mask > 0
        for check in rejected:
            participating = check.valid if participating is None else participating & check.valid
        return participating

    def _end_critic_round(self, estimator: Any, start: CriticState | None, participating: torch.Tensor | None = None) -> None:
        """Keep the critics the round fitted under the federated rule ``critic_aggregation``
        (:func:`~fedrl_algos.core.critic.federate_critics`; ``participating [1, n]``: the agents of
        the round, the others keep their critic of the round's start)."""
        if start is None:
            return
        fitted = self._critic_gradient(estimator).state
        self._keep_critic(federate_critics(self.critic_network, fitted, start, self._critic_setting("critic_aggregation"), participating))

    # --- the critics of an adaptation step (baseline="critic" in adapt and the logged evaluation) ---
    def _frozen_critics(self, state: CriticState) -> CriticBaseline:
        """A :class:`~fedrl_algos.core.critic.CriticBaseline` holding ``state`` with the model's λ,
        for weights only (the adaptation step never fits it: evaluation and :meth:`adapt` leave the
        model's critics as they are). Its weights are ``γ^h A_h`` whatever the model's
        ``discounting``: every adaptation baseline weights eq. (2)'s absolute-discounted steps."""
        return CriticBaseline(self.gamma, self.critic_network, self._critic_setting("gae_lambda"), 0,
                              self._critic_setting("critic_learning_rate"), state)

    def _adaptation_critics(self, tasks: Sequence[Any]) -> CriticBaseline:
        """The critics of an adaptation step on ``tasks`` (as given to :meth:`adapt`), batch
        ``[len(tasks)]``: a training agent's index takes that agent's critic; any other task (a new
        agent) takes the agents' critics averaged by the server's rule (each brought to common output
        statistics, then φ averaged: :func:`~fedrl_algos.core.critic.average_critics`) — what the
        federation knows of the family's values. Used as they are (not fitted): with λ = 1 the
        step stays unbiased, since no critic saw its trajectories."""
        if not self.uses_critic:
            raise ValueError(f"baseline='critic' needs a model trained with the critic ({self.critic_baseline_arguments}), "
                             f"got {self._baseline_description()}")
        if self.__dict__.get("normalize_returns", False):
            raise ValueError("baseline='critic' cannot adapt with the critics of a model trained with normalize_returns=True: they "
                             "predict per-episode normalised returns, not the returns an adaptation step weights; use another baseline")
        state = self.critic_state  # [1, n]
        average = average_critics(self.critic_network, state)
        n = int(self.n_agents)
        rows = [int(t) if isinstance(t, int | np.integer) and not isinstance(t, bool) else n for t in tasks]
        index = torch.tensor(rows, device=state.phi.device)

        def pick(own: torch.Tensor, common: torch.Tensor) -> torch.Tensor:
            return torch.cat((own[0], common[0, :1]), 0).index_select(0, index)

        moments = type(state.moments)(*(pick(a, b) for a, b in zip(state.moments, average.moments, strict=True)))
        return self._frozen_critics(CriticState(pick(state.phi, average.phi), moments, pick(state.mean, average.mean),
                                                pick(state.scale, average.scale)))

    def _check_new_federation(self, federation: Any) -> None:
        """A time-aware critic reads the step's fraction ``h / T`` of its episode length ``T``: an env
        with other episode lengths would give its fitted values another meaning (``set_env`` refuses it)."""
        super()._check_new_federation(federation)  # type: ignore[misc]
        critic = self.__dict__.get("critic_network")
        time_horizon = getattr(critic, "time_horizon", None)
        if time_horizon is not None and federation.horizon + 1 != time_horizon:
            raise ValueError(f"env must have episodes of the model's {time_horizon} steps (critic_time_aware=True: the critic's "
                             f"time input is h / {time_horizon}), got {federation.horizon + 1}; build a new model for it")

    @property
    def allows_new_agent_count(self) -> bool:  # type: ignore[override]
        """A model with the critic keeps one per agent: :meth:`set_env` needs the same agents."""
        return not self.uses_critic and super().allows_new_agent_count  # type: ignore[misc]

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "critic_network"]  # type: ignore[misc]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()  # type: ignore[misc]
        if self.uses_critic:  # only then: other files keep their fields
            variables = [*variables, *(name for owner in self.critic_owners for name in critic_fields(owner))]
        return state_dicts, variables

    observation_space: Any
    gamma: float
    policy: Any
    seed: Any
    n_agents: int
    device: Any
