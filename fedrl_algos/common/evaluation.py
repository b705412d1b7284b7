"""One evaluation protocol for every federation: the metrics ``evaluate_round`` returns and the
logger writes under ``eval/`` each round.

Every policy-gradient federation reports the same keys, so two algorithms trained on one task
compare by reading one column (``docs/evaluation.md``):

* ``return`` / ``discounted_return`` — Monte Carlo undiscounted / discounted (γ of the model)
  return of the policy each agent deploys without adaptation (the server's θ; each agent's own θ_i
  for :class:`~fedrl_algos.IndependentPG`), averaged over ``eval_trajectories`` rollouts per agent
  and over agents; ``agent_<i>/return`` and ``agent_<i>/discounted_return`` per agent;
* ``adapted_return`` / ``adapted_discounted_return`` (and ``agent_<i>/adapted_…``) — the same after
  the one policy-gradient adaptation step of size α from ``eval_adapt_trajectories`` trajectories
  of each agent, for the algorithms that learn an initialization to adapt (Per-FedAvg-PG, FedAvg-PG);
* ``exact_return`` (and ``exact_adapted_return``) — for tabular families, the exact discounted
  return by dynamic programming, averaged over agents (``exact_adapted_return`` is eq. (5)'s F(θ)).

The rollouts come from the federation's evaluation streams, separate from training's, so
evaluating never changes a training run.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "DEFAULT_EVAL_TRAJECTORIES",
    "PER_AGENT_PREFIX", "return_metrics", "personalization_metrics", "server_policy_metrics", "own_policy_metrics",
]

#: Monte Carlo rollouts per agent of each evaluation unless a model says otherwise
DEFAULT_EVAL_TRAJECTORIES = 32
#: keys of per-agent metrics start with this (``agent_3/return``); the logger keeps them out of stdout
PER_AGENT_PREFIX = "agent_"


def return_metrics(model: Any, theta: torch.Tensor, prefix: str = "") -> dict[str, float]:
    """Monte Carlo undiscounted and discounted returns of per-agent parameters, mean and per agent.

    :param model: a federation (its ``federation``, ``eval_trajectories``, ``gamma``)
    :param theta: parameters ``[n, d]``, row i deployed on agent i
    :param prefix: put before each metric's name (``"adapted_"``)
    :return: ``{prefix}return``, ``{prefix}discounted_return`` and their ``agent_<i>/`` forms
        (nothing when ``model.eval_trajectories`` is 0)
    """
    if model.eval_trajectories == 0:
        return {}
    traj = model.federation.eval_sampler(theta.unsqueeze(0), model.eval_trajectories)
    per_agent = {"return": traj.returns(1.0).mean(-1)[0], "discounted_return": traj.returns(model.gamma).mean(-1)[0]}  # [n] each
    out = {f"{prefix}{name}": float(values.mean()) for name, values in per_agent.items()}
    for name, values in per_agent.items():
        out.update({f"{PER_AGENT_PREFIX}{i}/{prefix}{name}": float(v) for i, v in enumerate(values.tolist())})
    return out


def _shared(model: Any) -> torch.Tensor:
    """The server's θ deployed on every agent: ``[n, d]``."""
    theta = model.policy.theta.detach()
    return theta.unsqueeze(0).expand(model.federation.n_agents, -1)


def server_policy_metrics(model: Any) -> dict[str, float]:
    """The metrics of a federation whose learned policy is the server's θ (MFPO, FedPG-BR): the
    returns of :func:`return_metrics` and, for tabular families, the exact ``exact_return``.

    :param model: a federation (its ``policy``, ``federation``, ``evaluator``, ``eval_trajectories``, ``gamma``)
    """
    out: dict[str, float] = {}
    if model.evaluator is not None:
        out["exact_return"] = float(model.evaluator.returns(model.policy.theta.detach().to(torch.float64).cpu()).mean())
    out.update(return_metrics(model, _shared(model)))
    return out


def own_policy_metrics(model: Any, agent_theta: torch.Tensor) -> dict[str, float]:
    """The metrics of a federation whose agents keep their own parameters (independent learners):
    agent i's returns under its own θ_i, and the exact ``exact_return`` for tabular families.

    :param model: a federation (its ``federation``, ``evaluator``, ``eval_trajectories``, ``gamma``)
    :param agent_theta: the agents' parameters ``[n, d]``
    """
    out: dict[str, float] = {}
    if model.evaluator is not None:
        own = model.evaluator.returns(agent_theta.detach().to(torch.float64).cpu())  # [n (theta), n (task)]
        out["exact_return"] = float(torch.diagonal(own).mean())
    out.update(return_metrics(model, agent_theta.detach()))
    return out


def personalization_metrics(model: Any, alpha: float, eval_adapt_trajectories: int, baseline: str | None = None,
                            critic: Any = None) -> dict[str, float]:
    """The metrics of a shared initialization that one adaptation step of size α personalizes:
    :func:`server_policy_metrics` before adaptation, and the ``adapted_`` ones after one step per
    agent from ``eval_adapt_trajectories`` trajectories of the evaluation streams (tabular families:
    also the exact ``exact_adapted_return`` = F(θ) of eq. (5), the exact step).

    :param model: a federation (its ``policy``, ``federation``, ``evaluator``, ``eval_trajectories``)
    :param alpha: the adaptation step size α
    :param eval_adapt_trajectories: trajectories of the Monte Carlo adaptation step
    :param baseline: baseline of that step's gradient (:mod:`fedrl_algos.core.adaptation`; ``None``: eq. (2))
    :param critic: with ``baseline="critic"``, every agent's critic (a
        :class:`~fedrl_algos.core.critic.CriticBaseline` of batch ``[1, n]``, not fitted)
    """
    theta = model.policy.theta.detach()
    out: dict[str, float] = {}
    if model.evaluator is not None:
        adapted_exact, before_exact = model.evaluator.meta_objective(theta.unsqueeze(0).to(torch.float64).cpu(), alpha)
        out["exact_return"] = float(before_exact.reshape(-1)[0])
        out["exact_adapted_return"] = float(adapted_exact.reshape(-1)[0])
    if model.eval_trajectories == 0:
        return out
    out.update(return_metrics(model, _shared(model)))
    adapted = model.federation.adapted(theta.unsqueeze(0), alpha, eval_adapt_trajectories, baseline, critic)[0]  # [n, d]
    out.update(return_metrics(model, adapted, prefix="adapted_"))
    return out
