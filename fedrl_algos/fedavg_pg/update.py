"""FedAvg-PG's round: local policy-gradient steps on every agent, then the server's aggregation.

FedAvg (McMahan et al., 2017) applied to policy gradient: the baseline of the Per-FedAvg-PG paper
(its α → 0 limit, Proposition 3: "Per-FedAvg-PG coincides with FedAvg applied to policy gradient")
and of the MFPO paper's comparison (section VI). One function serves both: the local direction is
any estimator (the paper's eq. (2) estimate, GPOMDP with a baseline, an attacked one), the step
size a schedule ``α_t`` (a constant in the Per-FedAvg-PG paper, MFPO's ``α_t`` in its comparison),
and the server either adopts the average (FedAvg) or takes an Adam step along it (FedAdam, Reddi
et al., 2021; FedPG-BR's experimental protocol).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedrl_algos.core.aggregation import OnReject, aggregate_valid
from fedrl_algos.core.control_variates import ControlVariates, CorrectedDirection
from fedrl_algos.core.directions import GradientEstimator
from fedrl_algos.core.federation import Federation, participated
from fedrl_algos.core.optim import AdamState, adam_ascent

__all__ = ["fedavg_pg_round", "round_step_sizes", "fedavg_local_steps", "fedavg_server_step"]


def fedavg_pg_round(
    federation: Federation,
    theta: torch.Tensor,
    estimator: GradientEstimator,
    step_size: Callable[[int], float],
    step: int,
    local_steps: int,
    agents_per_round: int | None = None,
    server_state: AdamState | None = None,
    server_step_size: float = 1e-3,
    on_reject: OnReject | None = None,
    control: ControlVariates | None = None,
) -> tuple[torch.Tensor, AdamState | None, torch.Tensor | None]:
    """One FedAvg-PG round for every run, from server parameters ``theta [R, d]``.

    Every participating agent starts from θ and takes ``K`` local steps ``θ_k ← θ_k + α_t ĝ_k(θ_k)``
    (``t = step + 1, …, step + K``) on fresh batches. The server then either adopts the average
    ``θ ← mean_k θ_k`` (``server_state=None``) or takes an Adam step along the round's average local
    direction ``(mean_k θ_k − θ) / Σ_t α_t`` (divided by the local step sizes so that a growing α_t
    does not change what Adam sees; with K = 1 that is Adam on the averaged gradient).

    With ``agents_per_round = r < n`` only the sampled agents are computed
    (:meth:`~fedrl_algos.core.federation.Federation.local_round`; with an attacked estimator every
    agent is, and the mask leaves the others out). With ``control`` (SCAFFOLD) the local steps are
    ``θ_k ← θ_k + α_t (ĝ_k(θ_k) + c − c_k)`` and the controls are updated in place from
    ``(θ_k − θ) / Σ_t α_t`` (:mod:`fedrl_algos.core.control_variates`).

    :param federation: the batched federation (its agents' sampler, and the server streams that
        draw the participating agents)
    :param theta: server parameters ``[R, d]``
    :param estimator: each agent's local direction ĝ_k
    :param step_size: ``t -> α_t``
    :param step: local steps done before this round
    :param local_steps: K
    :param agents_per_round: agents sampled without replacement per run (``None``: all)
    :param server_state: Adam's state (``None``: plain averaging)
    :param server_step_size: Adam's step size
    :param on_reject: called with the check of the agents' parameters when one is rejected (not
        finite, wrong shape or dtype): the server aggregates the others; a run with none left
        keeps θ and Adam's state (the round is skipped). Default: a
        :class:`~fedrl_algos.core.aggregation.RejectedUpdateWarning`
    :param control: SCAFFOLD's control variates ``c [R, d]``, ``c_k [R, n, d]``, updated in place
        (``None``: none)
    :return: the new server parameters ``[R, d]``, Adam's new state (``None`` without Adam) and the
        participation mask ``[R, n]`` (``None``: every agent)
    """
    sizes, step_sum = round_step_sizes(step_size, step, local_steps)
    correction = None if control is None else control.correction()

    def steps(sampler, local: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        direction = estimator if correction is None else CorrectedDirection(estimator, gather(correction))
        return fedavg_local_steps(direction, sampler, local, sizes)

    if control is not None:
        control.check(theta, federation.n_agents, step_sum)
    local, mask = federation.local_round(theta, steps, agents_per_round, estimator.per_agent_state)
    average, check = aggregate_valid(local, theta, mask, on_reject=on_reject)
    if control is not None:
        control.update(local, theta, step_sum, participated(check, mask))
    new_theta, new_state = fedavg_server_step(theta, average, check, step_sum, server_state, server_step_size)
    return new_theta, new_state, mask


def round_step_sizes(step_size: Callable[[int], float], step: int, local_steps: int) -> tuple[list[float], float]:
    """The local step sizes ``α_t`` of a round (``t = step + 1, …, step + K``) and their sum."""
    sizes = [step_size(t) for t in range(step + 1, step + local_steps + 1)]
    step_sum = 0.0
    for size in sizes:
        step_sum += size
    return sizes, step_sum


def fedavg_local_steps(direction: GradientEstimator, sampler, local: torch.Tensor, sizes: list[float]) -> torch.Tensor:
    """An agent's side of a round: ``θ_k ← θ_k + α_t ĝ_k(θ_k)`` for each step size of ``sizes`` on fresh batches."""
    for size in sizes:
        local = local + size * direction(sampler, local)
    return local


def fedavg_server_step(
    theta: torch.Tensor, average: torch.Tensor, check, step_sum: float, server_state: AdamState | None, server_step_size: float
) -> tuple[torch.Tensor, AdamState | None]:
    """The server's side: adopt the average (``server_state=None``) or take Adam's step along the
    round's average local direction ``(average − θ) / Σ_t α_t``; runs whose updates were all
    rejected (``check.skipped``) keep θ and Adam's moments."""
    if server_state is None:
        return average, None
    active = None if check.all_valid else ~check.skipped
    return adam_ascent(theta, (average - theta) / step_sum, server_state, server_step_size, active=active)
