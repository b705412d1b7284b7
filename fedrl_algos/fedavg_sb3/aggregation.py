"""FedAvgSB3's server step: which tensors of the agents' SB3 models take part, and their average.

The update is FedAvg's weighted parameter average (McMahan et al., 2017,
https://arxiv.org/abs/1602.05629, Algorithm 1, server line ``w_{t+1} ← Σ_k (n_k / n) w^k_{t+1}``),
written here as ``θ̄ = Σ_i w_i θ_i / Σ_i w_i`` over the agents' selected tensors:

* :func:`parameter_average` is the pure update on flat parameters ``[n_agents, d] → [d]``;
* :class:`PrefixSelector` and :class:`PolicySelector` pick the tensors that take part (by name in
  ``model.policy``), :func:`default_selector` holds the documented choice per ``aggregate=`` mode;
* :class:`ParameterAverage` is the server rule (a strategy object) that stacks the selected
  tensors, applies :func:`parameter_average` and copies the result back in place;
  :func:`broadcast` is the server's initialization (one agent's tensors to all).

Nothing is pickled or sent anywhere; replay buffers, rollout buffers and optimizer states are
never touched. Every agent's tensors are validated before they are averaged (same names, shapes and
dtypes as at set-up, finite values: :func:`fedrl_algos.core.aggregation.validate_updates`); a
rejected agent is left out of the average with a logged reason, and when no agent is left the
round changes nothing. See ``docs/algorithms/fedavg_sb3.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy

from fedrl_algos.core.aggregation import OnReject, UpdateCheck, validate_updates, warn_rejected
from fedrl_algos.core.aggregation import aggregate as server_average
from fedrl_envs.validation import check_real

#: A selector maps an SB3 model to the tensors of it that take part, by name.
Selector = Callable[[BaseAlgorithm], dict[str, torch.Tensor]]


# --------------------------------------------------------------------------------------------------
# Which tensors are averaged
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixSelector:
    """Select an SB3 model's tensors by name: ``model.policy``'s parameters and floating buffers.

    Names are those of ``model.policy.named_parameters()`` (shared modules appear once, under
    their first name) and ``named_buffers()``; ``attributes`` adds tensors the algorithm holds
    outside its policy (SAC's ``log_ent_coef``), under their attribute name, where present.

    :param include: keep names starting with one of these prefixes (``None``: every name)
    :param exclude: then drop names starting with one of these prefixes
    :param attributes: names of tensor attributes of the algorithm to add when they exist
    """

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("include", "exclude", "attributes"):
            value = getattr(self, field)
            if value is None and field == "include":
                continue
            value = (value,) if isinstance(value, str) else value
            if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{field} must be a tuple of name prefixes (str), got {value!r}")
            object.__setattr__(self, field, tuple(value))

    def __call__(self, model: BaseAlgorithm) -> dict[str, torch.Tensor]:
        policy = model.policy
        named: dict[str, torch.Tensor] = dict(policy.named_parameters())
        for name, buf in policy.named_buffers():
            if torch.is_floating_point(buf):
                named.setdefault(name, buf)
        out = {
            name: t
            for name, t in named.items()
            if (self.include is None or name.startswith(self.include)) and not (self.exclude and name.startswith(self.exclude))
        }
        for attr in self.attributes:
            value = getattr(model, attr, None)
            if isinstance(value, torch.Tensor) and torch.is_floating_point(value):
                out[attr] = value
        return out


# Value-only parts of SB3's ActorCriticPolicy (PPO, A2C); everything else shapes the action distribution.
_VALUE_ONLY = ("value_net.", "mlp_extractor.value_net.", "vf_features_extractor.")


@dataclass(frozen=True)
class PolicySelector:
    """The policy network of an SB3 model, found from its policy's structure at call time.

    * an ``ActorCriticPolicy`` (PPO, A2C): every tensor but the value-only parts (``value_net``,
      ``mlp_extractor.value_net``, a separate ``vf_features_extractor``) — the features
      extractor, policy MLP, ``action_net`` and ``log_std`` shape the action distribution;
    * a policy with a ``q_net`` (DQN): ``q_net`` (not ``q_net_target``);
    * a policy with an ``actor`` (SAC, TD3, DDPG): ``actor`` (not ``actor_target``, not the critics).
    """

    def prefixes(self, model: BaseAlgorithm) -> PrefixSelector:
        """The :class:`PrefixSelector` this selector amounts to for ``model``.

        :param model: an SB3 model
        """
        policy = model.policy
        if isinstance(policy, ActorCriticPolicy):
            return PrefixSelector(None, _VALUE_ONLY)
        if isinstance(getattr(policy, "q_net", None), torch.nn.Module):
            return PrefixSelector(("q_net.",))
        if isinstance(getattr(policy, "actor", None), torch.nn.Module):
            return PrefixSelector(("actor.",))
        raise ValueError(
            f"aggregate='policy' has no default for {type(model).__name__} (its policy has no actor, q_net or "
            "actor-critic structure): pass aggregate='all' or aggregate=ParameterAverage(PrefixSelector(include=(...,)))"
        )

    def __call__(self, model: BaseAlgorithm) -> dict[str, torch.Tensor]:
        return self.prefixes(model)(model)


def default_selector(mode: str) -> PolicySelector | PrefixSelector:
    """The documented tensors averaged for ``aggregate=mode`` (see ``docs/algorithms/fedavg_sb3.md``).

    ``"policy"``: :class:`PolicySelector` — DQN's ``q_net``; SAC's, TD3's and DDPG's ``actor``;
    PPO's and A2C's policy without its value-only parts. ``"all"``: every parameter and floating
    buffer of the SB3 policy (online and target networks, actor and critics) and SAC's learned
    entropy coefficient ``log_ent_coef``.

    :param mode: ``"policy"`` or ``"all"``
    """
    if mode == "policy":
        return PolicySelector()
    if mode == "all":
        return PrefixSelector(None, (), ("log_ent_coef",))
    raise ValueError(f"aggregate must be 'policy', 'all' or a ParameterAverage, got {mode!r}")


# --------------------------------------------------------------------------------------------------
# The update and the server rule
# --------------------------------------------------------------------------------------------------
def parameter_average(flat: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FedAvg's server update on flat parameters: ``θ̄ = Σ_i w_i θ_i / Σ_i w_i``, and the client drift.

    McMahan et al. (2017), Algorithm 1, server line ``w_{t+1} ← Σ_k (n_k / n) w^k_{t+1}`` (their
    weights ``n_k`` are the clients' data sizes; here any non-negative ``w_i``, the plain mean by
    default). The average itself is :func:`fedrl_algos.core.aggregation.aggregate`, the server average
    every federation of fedrl shares.

    >>> mean, dispersion = parameter_average(torch.tensor([[0.0, 0.0], [3.0, 4.0]]))
    >>> mean.tolist(), float(dispersion)
    ([1.5, 2.0], 2.5)

    :param flat: every agent's selected parameters, one row per agent: ``[n_agents, d]``
    :param weights: optional non-negative per-agent weights ``[n_agents]`` (normalized to sum to one)
    :return: the average ``[d]`` and the dispersion, the mean over agents of ``‖θ_i − θ̄‖`` (a scalar)
    """
    mean = server_average(flat, weights)
    return mean, (flat - mean).norm(dim=1).mean()


class Aggregator(Protocol):
    """A server rule: updates the agents' models in place, returns metrics to log."""

    def __call__(self, models: Sequence[BaseAlgorithm]) -> dict[str, float]: ...


class ParameterAverage:
    """FedAvg's server step on the selected tensors: ``θ ← Σ_i w_i θ_i / Σ_i w_i`` for every agent.

    The selected tensors of each agent are flattened into one row of ``[n_agents, d]``, averaged
    by :func:`parameter_average` and copied back into every agent's tensors in place under
    ``torch.no_grad`` (so optimizers keep their references, and their states — like every
    unselected tensor, replay buffer and rollout buffer — are left as they are).

    :param selector: which tensors (default: :class:`PrefixSelector` of everything in the policy)
    :param weights: optional per-agent weights (default: the plain mean): a 1-d list, NumPy array or tensor
        of finite real numbers ``>= 0`` (not bools), at least one ``> 0``
    """

    def __init__(self, selector: Selector | None = None, weights: Sequence[float] | torch.Tensor | None = None) -> None:
        if selector is not None and not callable(selector):
            raise ValueError(f"selector must be callable (model -> dict of tensors), got {selector!r}")
        self.selector = selector if selector is not None else PrefixSelector()
        self.weights = None if weights is None else _check_weights(weights)

    def __repr__(self) -> str:
        weights = None if self.weights is None else self.weights.tolist()
        return f"ParameterAverage({self.selector!r}, weights={weights})"

    def select(self, models: Sequence[BaseAlgorithm]) -> list[dict[str, torch.Tensor]]:
        """Each agent's selected tensors, checked to have the same names and shapes.

        :param models: the agents' SB3 models
        """
        named = [self.selector(m) for m in models]
        ref = {k: tuple(v.shape) for k, v in named[0].items()}
        if not ref:
            raise ValueError(f"the selector {self.selector!r} selects no tensor of {type(models[0]).__name__}")
        for i, d in enumerate(named[1:], start=1):
            if {k: tuple(v.shape) for k, v in d.items()} != ref:
                raise ValueError(f"agent {i} has other tensors than agent 0 under {self.selector!r}")
        self._structure = _structure(named[0])  # what __call__ validates the agents against
        return named

    def __call__(self, models: Sequence[BaseAlgorithm], on_reject: OnReject | None = None) -> dict[str, float]:
        """Average the valid agents' selected tensors and copy the average into every agent.

        An agent whose selected tensors differ in names, shapes or dtypes from the structure
        recorded by :meth:`select` (at set-up; without one, the most common structure) or hold a
        non-finite value is rejected: left out of the average (a non-finite agent still receives
        it; a structurally different one is left as it is). With no valid agent nothing changes.

        :param models: the agents' SB3 models
        :param on_reject: called with the :class:`~fedrl_algos.core.aggregation.UpdateCheck` when
            an agent is rejected (default: a ``RejectedUpdateWarning``)
        :return: ``dispersion``, ``n_averaged`` (numbers averaged), ``rejected_updates`` and
            ``skipped_round`` (1 when no agent was valid)
        """
        if len(models) == 0:
            raise ValueError("models must be a non-empty list of SB3 models")
        if self.weights is not None and len(self.weights) != len(models):
            raise ValueError(f"weights has {len(self.weights)} entries for {len(models)} agents")
        named = [self.selector(m) for m in models]
        structure = self.__dict__.get("_structure") or Counter(_structure(d) for d in named).most_common(1)[0][0]
        names = [name for name, _, _ in structure]
        if not names:
            raise ValueError(f"the selector {self.selector!r} selects no tensor of {type(models[0]).__name__}")
        fits = [_structure(d) == structure for d in named]
        with torch.no_grad():
            flats = [torch.cat([d[k].detach().reshape(-1) for k in names]) if ok else None for d, ok in zip(named, fits, strict=True)]
            like = next((f for f in flats if f is not None), None)
            reasons: list[str] = [f"agent {i}: selected tensors {_describe(_structure(d))} differ from {_describe(structure)}"
                                  for i, (d, ok) in enumerate(zip(named, fits, strict=True)) if not ok]
            valid = torch.tensor(fits, dtype=torch.bool)
            if like is not None:
                # Structurally different agents are already rejected: a zero placeholder stands in for them.
                placeholder = torch.zeros_like(like)
                values = validate_updates([f if f is not None else placeholder for f in flats], like, "parameters")
                valid = valid & values.valid.cpu()
                reasons += values.reasons
            check = UpdateCheck(valid, tuple(reasons))
            if not check.all_valid:
                if on_reject is None:
                    warn_rejected(check, "FedAvgSB3 server")
                else:
                    on_reject(check)
            if not bool(valid.any()):
                return {"dispersion": float("nan"), "n_averaged": 0.0, "rejected_updates": float(check.n_rejected), "skipped_round": 1.0}
            keep = [i for i in range(len(models)) if bool(valid[i])]
            flat = torch.stack([flats[i] for i in keep])  # [n_valid, d]
            weights = None if self.weights is None else self.weights[keep].to(flat.device)
            if weights is not None and not bool(weights.sum() > 0):
                return {"dispersion": float("nan"), "n_averaged": 0.0, "rejected_updates": float(check.n_rejected), "skipped_round": 1.0}
            mean, dispersion = parameter_average(flat, weights)  # [d], []
            for d, ok in zip(named, fits, strict=True):
                if not ok:
                    continue
                offset = 0
                for k in names:
                    t = d[k]
                    t.copy_(mean[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
        return {"dispersion": float(dispersion), "n_averaged": float(mean.numel()), "rejected_updates": float(check.n_rejected),
                "skipped_round": 0.0}


_WEIGHTS = "weights must be a 1-d list (or array, or tensor) of finite real numbers >= 0, not all 0"


def _check_weights(weights: Any) -> torch.Tensor:
    """``ParameterAverage``'s ``weights`` as a float64 CPU tensor ``[n]``; ``TypeError``/``ValueError`` naming them."""
    if isinstance(weights, torch.Tensor):
        if weights.dtype == torch.bool or weights.is_complex():
            raise TypeError(f"{_WEIGHTS}, got a tensor of dtype {weights.dtype}")
        w = weights.detach().to("cpu", torch.float64)
    elif isinstance(weights, np.ndarray):
        if weights.dtype.kind not in "iuf":
            raise TypeError(f"{_WEIGHTS}, got an array of dtype {weights.dtype}")
        w = torch.as_tensor(weights.astype(np.float64))
    elif isinstance(weights, Sequence) and not isinstance(weights, str | bytes):
        w = torch.tensor([check_real(f"weights[{i}]", v, 0) for i, v in enumerate(weights)], dtype=torch.float64)
    else:
        raise TypeError(f"{_WEIGHTS}, got {type(weights).__name__} {weights!r}")
    if w.dim() != 1 or w.numel() == 0:
        raise ValueError(f"{_WEIGHTS}, got shape {tuple(w.shape)}")
    total = w.sum()
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or not (bool(total > 0) and bool(torch.isfinite(total))):
        raise ValueError(f"{_WEIGHTS}, got {w.tolist()}")
    return w


def _structure(named: dict[str, torch.Tensor]) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
    """Names, shapes and dtypes of selected tensors (what must agree across agents)."""
    return tuple((k, tuple(v.shape), v.dtype) for k, v in named.items())


def _describe(structure: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]) -> str:
    return "{" + ", ".join(f"{k}: {list(shape)} {str(dtype).removeprefix('torch.')}" for k, shape, dtype in structure) + "}"


def broadcast(models: Sequence[BaseAlgorithm], selector: Selector, source: int = 0) -> None:
    """Copy the selected tensors of ``models[source]`` into every other model, in place.

    :param models: the agents' SB3 models
    :param selector: which tensors (names and shapes must agree across the models)
    :param source: index of the model whose tensors are copied
    """
    named = ParameterAverage(selector).select(models)
    with torch.no_grad():
        for i, d in enumerate(named):
            if i != source:
                for k, t in d.items():
                    t.copy_(named[source][k])
