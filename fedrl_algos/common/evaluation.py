"""The metrics federations log each round: personalized objectives, or the server policy's return."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["personalization_metrics", "server_policy_metrics"]


def personalization_metrics(model: Any, alpha: float, eval_adapt_trajectories: int, baseline: str | None = None) -> dict[str, float]:
    """Metrics of a shared initialization that one adaptation step of size α personalizes.

    Exact ``F`` (post-adaptation) and ``f`` (pre-adaptation) objectives for tabular families
    (``model.evaluator``); Monte Carlo pre/post-adaptation returns when ``model.eval_trajectories > 0``.

    :param model: a federation (its ``policy``, ``federation``, ``evaluator``, ``eval_trajectories``)
    :param alpha: the adaptation step size α
    :param eval_adapt_trajectories: trajectories of the Monte Carlo adaptation step
    :param baseline: baseline of that step's gradient (:mod:`fedrl_algos.core.adaptation`; ``None``: eq. (2))
    """
    theta = model.policy.theta.detach().unsqueeze(0)
    out: dict[str, float] = {}
    if model.evaluator is not None:
        big_f, small_f = model.evaluator.meta_objective(theta.to(torch.float64).cpu(), alpha)
        out["F"] = float(big_f.reshape(-1)[0])
        out["f"] = float(small_f.reshape(-1)[0])
    if model.eval_trajectories > 0:
        pre = model.federation.evaluate(theta, model.eval_trajectories)
        adapted = model.federation.adapted(theta, alpha, eval_adapt_trajectories, baseline)
        post = model.federation.evaluate(adapted, model.eval_trajectories)
        out["pre_adaptation_return"] = float(pre.mean())
        out["post_adaptation_return"] = float(post.mean())
    return out


def server_policy_metrics(model: Any) -> dict[str, float]:
    """Metrics of a model whose learned policy is the server's θ (MFPO, FedPG-BR): the average over
    agents of the exact discounted return (tabular families, ``exact_return``) and of Monte Carlo
    undiscounted (``return``) and discounted (``discounted_return``) returns.

    :param model: a federation (its ``policy``, ``federation``, ``evaluator``, ``eval_trajectories``, ``gamma``)
    """
    theta = model.policy.theta.detach().unsqueeze(0)
    out: dict[str, float] = {}
    if model.evaluator is not None:
        out["exact_return"] = float(model.evaluator.returns(theta[0].to(torch.float64).cpu()).mean())
    if model.eval_trajectories > 0:
        traj = model.federation.eval_sampler(model.federation.broadcast(theta), model.eval_trajectories)
        out["return"] = float(traj.returns(1.0).mean())
        out["discounted_return"] = float(traj.returns(model.gamma).mean())
    return out
