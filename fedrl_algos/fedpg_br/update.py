"""FedPG-BR's update: the Byzantine filter (Algorithm 1.1) and one SCSG round (Algorithm 1).

Paper: "Fault-Tolerant Federated Reinforcement Learning with Theoretical Guarantee" (Fan et al.,
NeurIPS 2021). A batched functional core over runs ``[*R]`` and agents ``n``:
:func:`filter_threshold`, :func:`byzantine_filter`, :func:`filtered_mean`,
:func:`geometric_inner_steps` and :class:`FedPGBRUpdate` (one round).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from fedrl_algos.core.aggregation import OnReject, UpdateCheck, validate_updates, warn_rejected
from fedrl_algos.core.attacks import Attack, make_attack
from fedrl_algos.core.critic import CriticGradient, FlatCritic
from fedrl_algos.core.env_sampling import EnvSampler
from fedrl_algos.core.gpomdp import (
    ScoreFunctionGradient,
    check_max_importance_weight,
    check_normalize_returns,
    paired_gradients,
    score_gradient,
)
from fedrl_algos.core.optim import AdamState, adam_ascent, check_server_optimizer
from fedrl_algos.core.sampling import KernelSampler, Sampler
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.params import index_params
from fedrl_envs.rng import RandomStreams, derive_keys

__all__ = [
    "FedPGBRUpdate",
    "FilterResult",
    "filter_threshold",
    "byzantine_filter",
    "filtered_mean",
    "geometric_inner_steps",
    "server_trajectories",
    "make_server_sampler",
    "make_env_server_sampler",
    "server_task_indices",
]

# Stream index offset of the server's own trajectories (agents use 0..n-1).
_SERVER_TRAJ_STREAM = 1 << 43


# --- the filter (Algorithm 1.1) ---------------------------------------------------------------
def filter_threshold(sigma: Any, delta: float, n_agents: int, batch_size: Any) -> torch.Tensor:
    """``T_μ = 2σ √(V / B_t)`` with ``V = 2 log(2K/δ)`` (K agents, confidence 1 − δ).

    :param sigma: bound σ on the standard deviation of one trajectory's gradient estimate (a
        number or a tensor ``[*R]``)
    :param delta: failure probability δ in (0, 1)
    :param n_agents: K
    :param batch_size: B_t (a number or a tensor ``[*R]``)
    """
    v = 2.0 * math.log(2.0 * n_agents / delta)
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    batch_size = torch.as_tensor(batch_size, dtype=torch.float64)
    return 2.0 * sigma * torch.sqrt(v / batch_size)


class FilterResult(NamedTuple):
    """Decisions of :func:`byzantine_filter` for every run.

    :param kept: agents whose gradient is kept ``[*R, n]`` (bool)
    :param fallback: whether the wider radius 2σ was used ``[*R]`` (bool)
    :param threshold: the first radius ``T_μ`` ``[*R]``
    """

    kept: torch.Tensor
    fallback: torch.Tensor
    threshold: torch.Tensor


def _median_ball(grads: torch.Tensor, dist: torch.Tensor, radius: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Kept mask of one filtering pass with ``radius [*R]``.

    ``S`` = agents with more than K/2 gradients (themselves included) within ``radius``; the
    "median" ``μ_mom`` is the member of ``S`` closest to the mean of ``S``; the kept agents are
    those within ``radius`` of ``μ_mom`` (none when ``S`` is empty). With ``valid [*R, n]``, only
    valid agents count, K is their number, and invalid ones are never kept.
    """
    n = grads.shape[-2]
    r = radius.to(dist.dtype).reshape(*radius.shape, 1, 1)
    close = dist <= r
    if valid is None:
        in_s = close.sum(-1) > n / 2  # [*R, n]
    else:
        k = valid.sum(-1, keepdim=True).to(torch.float64)  # [*R, 1]
        in_s = (close & valid.unsqueeze(-2)).sum(-1) > k / 2
        in_s = in_s & valid
    count = in_s.sum(-1, keepdim=True)  # [*R, 1]
    w = in_s.to(grads.dtype).unsqueeze(-1)
    mean_s = (w * grads).sum(-2, keepdim=True) / count.clamp(min=1).unsqueeze(-1).to(grads.dtype)
    to_mean = (grads - mean_s).norm(dim=-1)
    to_mean = torch.where(in_s, to_mean, torch.full_like(to_mean, math.inf))
    mom = torch.gather(grads, -2, to_mean.argmin(-1, keepdim=True).unsqueeze(-1).expand(*grads.shape[:-2], 1, grads.shape[-1]))
    kept = (grads - mom).norm(dim=-1) <= radius.to(grads.dtype).unsqueeze(-1)
    kept = kept & (count > 0)
    return kept if valid is None else kept & valid


def byzantine_filter(
    grads: torch.Tensor, sigma: Any, delta: float, batch_size: Any, max_byzantine_fraction: float,
    valid: torch.Tensor | None = None,
) -> FilterResult:
    """FedPG-BR's aggregation filter (Algorithm 1.1) for every run.

    First pass with radius ``T_μ = 2σ√(V/B_t)`` (:func:`filter_threshold`). When it keeps fewer
    than ``(1 − α)K`` agents (α: the largest fraction of Byzantine agents tolerated), a second
    pass with the wider radius ``2σ`` decides instead.

    :param grads: the agents' reported gradients ``[*R, n, d]``
    :param sigma: σ (number or ``[*R]``)
    :param delta: δ
    :param batch_size: B_t (number or ``[*R]``)
    :param max_byzantine_fraction: α in [0, 0.5)
    :param valid: optional mask ``[*R, n]`` of usable reports (:func:`~fedrl_algos.core.aggregation.validate_updates`):
        the others are treated as absent — never kept, not counted in the majority ``> K/2`` nor in
        ``(1 − α)K`` (``V`` keeps the federation's K, a slightly wider radius) — and their values
        are never read
    """
    batch = grads.shape[:-2]
    n = grads.shape[-2]
    work = grads.to(torch.float64)
    if valid is not None:
        work = torch.where(valid.unsqueeze(-1), work, torch.zeros_like(work))
    dist = torch.cdist(work, work, compute_mode="donot_use_mm_for_euclid_dist")  # [*R, n, n], exact zeros
    sigma_t = torch.broadcast_to(torch.as_tensor(sigma, dtype=torch.float64, device=grads.device), batch)
    threshold = torch.broadcast_to(filter_threshold(sigma_t, delta, n, batch_size).to(grads.device), batch)
    kept = _median_ball(work, dist, threshold, valid)
    k = n if valid is None else valid.sum(-1).to(torch.float64)
    fallback = kept.sum(-1) < (1.0 - max_byzantine_fraction) * k
    wide = _median_ball(work, dist, 2.0 * sigma_t, valid)
    kept = torch.where(fallback.unsqueeze(-1), wide, kept)
    return FilterResult(kept, fallback, threshold)


def filtered_mean(grads: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Mean of the kept gradients ``[*R, d]`` (zero where none is kept)."""
    w = kept.to(grads.dtype).unsqueeze(-1)
    grads = torch.where(kept.unsqueeze(-1), grads, torch.zeros_like(grads))  # a rejected NaN must not leak through 0·NaN
    return (w * grads).sum(-2) / w.sum(-2).clamp(min=1.0)


def geometric_inner_steps(uniform: torch.Tensor, batch_size: Any, inner_batch_size: int) -> torch.Tensor:
    """``N_t ~ Geom(B_t / (B_t + b_t))`` on {1, 2, …} by inversion of ``uniform`` in [0, 1).

    ``P(N = k) = γ^(k−1)(1 − γ)`` with ``γ = B/(B + b)``: mean ``(B + b)/b`` inner steps, so the
    server samples about as many trajectories in the inner loop as each agent does per round.
    """
    gamma = torch.as_tensor(batch_size, dtype=torch.float64) / (torch.as_tensor(batch_size, dtype=torch.float64) + inner_batch_size)
    k = torch.floor(torch.log1p(-uniform.to(torch.float64)) / torch.log(gamma))
    return (1 + k).to(torch.int64)


def make_server_sampler(
    family: Any, agent_params: Any, policy: Any, seeds: torch.Tensor, inner_batch_size: int,
    server_task: int | None = None, device: torch.device | str = "cpu",
) -> KernelSampler:
    """The server's sampler for runs seeded ``seeds [R]``: rows ``[R, b]``, one stream per trajectory.

    Server trajectory ``j`` runs agent ``j mod n``'s task (``server_task=None``) or agent
    ``server_task``'s; its stream is keyed by the run's seed and ``2**43 + j``.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
    n = int(next(v for v in vars(agent_params).values() if isinstance(v, torch.Tensor)).shape[0])
    b = inner_batch_size
    tasks = torch.tensor(server_task_indices(n, b, server_task))
    params = index_params(agent_params, tasks.repeat(seeds.numel()).to(device))
    streams = RandomStreams(derive_keys(seeds.reshape(-1, 1), torch.arange(b).reshape(1, -1) + _SERVER_TRAJ_STREAM), device)
    return KernelSampler(family, params, policy, streams, stop_when_done=True)


def server_task_indices(n_agents: int, inner_batch_size: int, server_task: int | None = None) -> list[int]:
    """The task of each of the server's ``b`` trajectories: agent ``j mod n``'s, or ``server_task``'s."""
    if server_task is not None:
        return [int(server_task)] * inner_batch_size
    return [j % n_agents for j in range(inner_batch_size)]


def make_env_server_sampler(
    env: Any, policy: Any, seed: int | Sequence[int], inner_batch_size: int, server_task: int | None = None, horizon: int | None = None
) -> EnvSampler:
    """The server's sampler of a federation over a Gymnasium env: one environment per server trajectory.

    ``env`` is the server's own :class:`~fedrl_wrappers.FederatedVecEnv` with one agent per server
    trajectory (``agent_kwargs`` of the tasks of :func:`server_task_indices`, one env each; for
    several runs, every run's ``b`` agents run-major, each seeded by its stream id); the action
    streams are keyed as in :func:`make_server_sampler`.

    :param seed: the run's seed (its envs' first reset is derived from it), or one seed per run
    """
    many = not isinstance(seed, int)
    seeds = torch.as_tensor(seed if many else [seed], dtype=torch.int64).reshape(-1, 1)
    streams = RandomStreams(derive_keys(seeds, torch.arange(inner_batch_size).reshape(1, -1) + _SERVER_TRAJ_STREAM), policy.theta.device)
    return EnvSampler(env, policy, streams, horizon, env_seed=None if many else int(seed) ^ _SERVER_TRAJ_STREAM,
                      stop_when_done=True)


def server_trajectories(sampler: Sampler, theta: torch.Tensor, n_trajectories: int) -> Trajectories:
    """``b`` server trajectories per run with ``theta [*R, d]``: ``[*R, b, T, ...]``.

    The sampler's rows are ``[*R, b]`` (one stream and one task per server trajectory).
    """
    th = theta.unsqueeze(-2).expand(*theta.shape[:-1], n_trajectories, theta.shape[-1])
    traj = sampler(th, 1)
    axis = theta.dim()  # the m = 1 axis
    return Trajectories(*(x.squeeze(axis) for x in traj))


# --- one round (Algorithm 1) ------------------------------------------------------------------
class FedPGBRUpdate:
    """One FedPG-BR round for every run (a strategy object).

    1. Draw ``B_t`` uniform in ``[B_min, B_max]``; every agent samples trajectories with the
       server's θ̃ and reports ``μ_k = (1/B_t) Σ g(τ; θ̃)`` (Byzantine agents: what their attack
       makes of it) together with the spread of its per-trajectory estimates.
    2. The server filters (:func:`byzantine_filter`) and averages the kept gradients: ``μ_t``.
    3. SCSG inner loop: ``N_t ~ Geom(B_t/(B_t + b))`` steps, each from ``b`` fresh server
       trajectories at θ_n: ``v_n = (1/b) Σ [g(τ; θ_n) − ω(τ) g(τ; θ̃)] + μ_t`` with
       ``ω = p(τ|θ̃)/p(τ|θ_n)``, and ``θ_{n+1} = θ_n + η v_n``. The new server θ̃ is ``θ_{N_t}``.

    Agents always sample ``B_max`` trajectories and use the first ``B_t`` (so the batched runs
    stay independent and every stream advances the same way); only used ones are counted.

    :param policy: the flat policy
    :param gamma: discount
    :param batch_range: ``(B_min, B_max)``
    :param inner_batch_size: b
    :param step_size: η
    :param sigma: σ for the filter, or ``"auto"``/``"auto_bound"``: per run and round,
        :meth:`estimate_sigma` of the agents' reported spreads
    :param delta: δ
    :param max_byzantine_fraction: α
    :param estimator: ``"gpomdp"`` or ``"reinforce"``
    :param baseline: ``"loo"``, ``"mean"``, ``None`` or ``"linear"`` (:data:`~fedrl_algos.core.gpomdp.BASELINES`),
        or ``"critic"`` (with ``critic``, below)
    :param max_importance_weight: truncation of ω (``None``: only the overflow guard)
    :param use_filter: ``False`` keeps every agent (the unprotected baseline)
    :param attack: what the Byzantine agents do
    :param optimizer: the server's inner-loop step: ``"sgd"`` (``θ ← θ + η v``) or ``"adam"``
        (Adam with step size η along ``v``, its state carried across rounds: the optimizer of
        FedPG-BR's experiments)
    :param discounting: ``"absolute"`` or ``"relative"`` reward-to-go (:mod:`fedrl_algos.core.gpomdp`)
    :param critic: with ``baseline="critic"``: the value network (:class:`~fedrl_algos.core.critic.MlpCritic` or, for images, :class:`~fedrl_algos.policies.critics.CnnCritic`).
        Every agent weights its report with its own critic and fits it afterwards on the ``B_t``
        trajectories it used (:attr:`agent_critic`, a :class:`~fedrl_algos.core.critic.CriticGradient`
        whose ``state`` holds the agents' critics, batch ``[*R, n]``); the server weights each
        inner-loop batch with **its own critic** and fits it afterwards on that batch
        (:attr:`server_critic`, batch ``[*R]``). The server never uses an agent's φ: FedPG-BR's agents
        send only gradients, and a Byzantine agent's φ would set the server's baseline. Both stay
        independent of the batch they weight, so the estimates stay unbiased with λ = 1
    :param gae_lambda: λ of GAE (1: unbiased)
    :param n_critic_epochs: full-batch Adam steps of each fit
    :param critic_learning_rate: their step size
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running steps
        before the baseline (:func:`~fedrl_algos.core.gpomdp.normalized_return_rewards`): the agents'
        reports, the server's inner-loop estimates and both critics' GAE and targets use the
        normalised returns. Not an unbiased estimate of ∇J; GPOMDP only; default ``False``
    """

    def __init__(
        self,
        policy,
        gamma: float,
        batch_range: tuple[int, int],
        inner_batch_size: int,
        step_size: float,
        sigma: float | str,
        delta: float,
        max_byzantine_fraction: float,
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        max_importance_weight: float | None = None,
        use_filter: bool = True,
        attack: Attack | str | None = None,
        optimizer: str = "sgd",
        discounting: str = "absolute",
        critic: FlatCritic | None = None,
        gae_lambda: float = 1.0,
        n_critic_epochs: int = 5,
        critic_learning_rate: float = 1e-3,
        normalize_returns: bool = False,
    ) -> None:
        self.policy = policy
        self.normalize_returns = check_normalize_returns(normalize_returns, estimator)
        self.agent_critic: CriticGradient | None = None
        self.server_critic: CriticGradient | None = None
        if baseline == "critic":
            if critic is None:
                raise ValueError("baseline='critic' needs critic (an MlpCritic or CnnCritic), got None")
            if estimator != "gpomdp":
                raise ValueError(f"baseline='critic' needs estimator='gpomdp' (GAE weights each step), got estimator={estimator!r}")
            settings = (critic, gae_lambda, n_critic_epochs, critic_learning_rate)
            self.agent_critic = CriticGradient(policy, gamma, batch_range[1], *settings, discounting=discounting,
                                               normalize_returns=normalize_returns)
            self.server_critic = CriticGradient(policy, gamma, inner_batch_size, *settings, discounting=discounting,
                                                normalize_returns=normalize_returns)
            baseline = None  # the estimator below is not used for weights; the critics give them
        self.b_min, self.b_max = batch_range
        self.inner_batch_size = inner_batch_size
        self.step_size = step_size
        self.sigma = sigma
        self.delta = delta
        self.max_byzantine_fraction = max_byzantine_fraction
        self.estimator = ScoreFunctionGradient(policy, gamma, self.b_max, estimator, baseline, discounting=discounting,
                                               normalize_returns=normalize_returns)
        self.max_importance_weight = check_max_importance_weight(max_importance_weight)
        self.use_filter = use_filter
        self.attack = make_attack(attack)
        self.optimizer = check_server_optimizer("optimizer", optimizer)

    def agent_gradients(
        self, sampler: Sampler, theta: torch.Tensor, batch_size: torch.Tensor, byzantine: torch.Tensor, noise: RandomStreams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step 1 for every run and agent.

        :param sampler: the agents' sampler (rows ``[*R, n]``)
        :param theta: server parameters ``[*R, d]``
        :param batch_size: B_t ``[*R]``
        :param byzantine: Byzantine agents ``[n]`` (bool)
        :param noise: streams ``[*R, n]`` for the attacks' random numbers
        :return: reported gradients ``[*R, n, d]``, reported spreads ``[*R, n]`` (see :meth:`estimate_sigma`),
            undiscounted returns ``[*R, n]`` and env steps ``[*R, n]`` of the used trajectories
        """
        n = byzantine.shape[-1]
        local = theta.unsqueeze(-2).expand(*theta.shape[:-1], n, theta.shape[-1])
        rows = byzantine.reshape(*([1] * (local.dim() - 2)), n, 1)
        acting = sampler.with_policy(self.attack.policy(sampler.policy, rows))
        traj = self.attack.trajectories(acting(local, self.b_max), byzantine, noise)
        used = (torch.arange(self.b_max, device=theta.device) < batch_size.unsqueeze(-1)).to(traj.mask.dtype)  # [*R, Bmax]
        used = used.unsqueeze(-2).unsqueeze(-1)  # [*R, 1, Bmax, 1]
        traj = traj._replace(mask=traj.mask * used, rewards=traj.rewards * used)
        if self.agent_critic is None:
            psi = self.estimator.weights(traj)
        else:  # each agent's own critic, fitted on the used trajectories after it weighted them
            psi, targets = self.agent_critic.step_weights(traj)
            self.agent_critic.fit(traj, targets)
        per_traj = score_gradient(self.policy, local, traj, psi, per_trajectory=True)
        count = batch_size.to(per_traj.dtype).reshape(*batch_size.shape, 1, 1)
        mu = per_traj.sum(-2) / count
        deviation = (per_traj - mu.unsqueeze(-2)).norm(dim=-1) * used.squeeze(-1)
        if self.sigma == "auto_bound":  # the largest deviation: an empirical bound
            spread = deviation.amax(-1)
        else:  # the per-trajectory standard deviation
            spread = torch.sqrt((deviation**2).sum(-1) / (count.squeeze(-1) - 1).clamp(min=1))
        rows_b = torch.broadcast_to(byzantine, mu.shape[:-1])
        reported = self.attack.gradient(mu, rows_b, noise)
        spread = self.attack.spread(spread, rows_b, noise)  # what the agent says about its spread
        returns = traj.rewards.sum(-1).sum(-1) / count.squeeze(-1)
        return reported, spread, returns, traj.mask.sum((-1, -2))

    def check_reports(self, grads: torch.Tensor, spread: torch.Tensor, theta: torch.Tensor, uses_spread: bool = True) -> UpdateCheck:
        """Which agents' reports the server may use: a finite gradient of θ's shape and dtype and,
        where σ is estimated from them (``uses_spread``), a finite non-negative spread.

        :param grads: reported gradients ``[*R, n, d]``
        :param spread: reported spreads ``[*R, n]``
        :param theta: the server's parameters ``[*R, d]``
        :param uses_spread: also check the spreads
        """
        check = validate_updates(grads, theta, "gradient")
        if not uses_spread:
            return check
        spreads = validate_updates(spread, theta[..., 0], "spread", extra_dims=0)
        if spreads.valid.shape == check.valid.shape:
            negative = spreads.valid & (spread < 0)
            if bool(negative.any()):
                where = [f"agent {i[-1]}" if len(i) == 1 else f"run {', '.join(map(str, i[:-1]))}, agent {i[-1]}" for i in negative.nonzero().tolist()]
                spreads = UpdateCheck(spreads.valid & ~negative, spreads.reasons + tuple(f"{w}: spread is negative" for w in where))
        elif spreads.all_valid:
            spreads = UpdateCheck(torch.zeros_like(check.valid), ("every agent: spread tensor has the wrong shape",))
        else:
            spreads = UpdateCheck(torch.zeros_like(check.valid), spreads.reasons)
        return check.merge(spreads)

    def estimate_sigma(self, spread: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``σ = "auto"``/``"auto_bound"``: the ``(1 − α)``-quantile over agents of the reported spreads ``[*R, n]``.

        Each agent reports the spread of its per-trajectory estimates around its mean μ_k: the
        standard deviation ``sqrt(Σ_j ||g(τ_j) − μ_k||² / (B_t − 1))`` (``"auto"``) or the largest
        deviation ``max_j ||g(τ_j) − μ_k||`` (``"auto_bound"``, an empirical version of the bound
        ``||g(τ) − ∇J|| ≤ σ`` behind FedPG-BR's concentration argument; about 3× wider). A
        Byzantine agent may report anything (:meth:`~fedrl_algos.core.attacks.Attack.spread`):
        with at most a fraction α of Byzantine agents the ``(1 − α)``-quantile is never above the
        largest honest report however large the forged ones are, but forged *small* reports can
        pull it down to a smaller honest one.

        :param spread: the reported spreads ``[*R, n]``
        :param valid: optional mask ``[*R, n]``: the quantile over the valid reports only (the
            ``"lower"`` order statistic of index ``⌊(1 − α)(k − 1)⌋`` of the ``k`` valid ones)
        """
        q = 1.0 - self.max_byzantine_fraction
        if valid is None:
            return torch.quantile(spread.to(torch.float64), q, dim=-1, interpolation="lower").to(spread.dtype)
        keyed = torch.where(valid, spread.to(torch.float64), torch.full_like(spread, math.inf, dtype=torch.float64))
        ordered = keyed.sort(-1).values
        k = valid.sum(-1, keepdim=True).clamp(min=1)
        index = torch.floor(q * (k - 1).to(torch.float64)).long()
        return torch.gather(ordered, -1, index).squeeze(-1).to(spread.dtype)

    def round(
        self,
        theta: torch.Tensor,
        agent_sampler: Sampler,
        server_sampler: Sampler,
        server_uniform: torch.Tensor,
        byzantine: torch.Tensor,
        noise: RandomStreams,
        optimizer_state: AdamState | None = None,
        on_reject: OnReject | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One round of Algorithm 1 (SCSG): ``theta [*R, d]`` → new server parameters ``[*R, d]`` and diagnostics.

        Reports that are unusable (:meth:`check_reports`) are rejected before the filter, which
        then treats those agents as absent; with no usable report in a run its server skips the
        round (θ and Adam's state unchanged).

        :param server_uniform: two uniform numbers per run ``[*R, 2]`` (for B_t and N_t)
        :param byzantine: Byzantine agents ``[n]`` (bool)
        :param optimizer_state: Adam's state after the previous round (``optimizer="adam"``;
            ``None``: a fresh state)
        :param on_reject: called with the :class:`~fedrl_algos.core.aggregation.UpdateCheck` when
            a report is rejected (default: a ``RejectedUpdateWarning``)
        :return: new θ̃ and ``kept`` ``[*R, n]``, ``fallback`` ``[*R]``, ``threshold`` ``[*R]``,
            ``sigma`` ``[*R]``, ``batch_size`` ``[*R]``, ``inner_steps`` ``[*R]``, ``return``
            ``[*R, n]``, ``env_steps`` ``[*R, n]`` (agents), ``server_env_steps`` ``[*R]``,
            ``optimizer_state`` (Adam's state; ``None`` for ``"sgd"``), ``valid`` ``[*R, n]`` (the
            reports that passed :meth:`check_reports`)
        """
        batch_size = self.batch_size(server_uniform)
        grads, spread, returns, env_steps = self.agent_gradients(agent_sampler, theta, batch_size, byzantine, noise)
        return self.server_phase(theta, grads, spread, returns, env_steps, batch_size, server_uniform, server_sampler, optimizer_state, on_reject)

    def batch_size(self, server_uniform: torch.Tensor) -> torch.Tensor:
        """``B_t`` uniform in ``[B_min, B_max]`` ``[*R]`` from the first of the round's two server uniforms ``[*R, 2]``."""
        span = self.b_max - self.b_min + 1
        return self.b_min + torch.clamp((server_uniform[..., 0].to(torch.float64) * span).long(), max=span - 1)

    def server_phase(
        self,
        theta: torch.Tensor,
        grads: torch.Tensor,
        spread: torch.Tensor,
        returns: torch.Tensor,
        env_steps: torch.Tensor,
        batch_size: torch.Tensor,
        server_uniform: torch.Tensor,
        server_sampler: Sampler,
        optimizer_state: AdamState | None = None,
        on_reject: OnReject | None = None,
        aggregate: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Steps 2–3 of :meth:`round` (the server's side, a Flower strategy's aggregation): check the
        reports ``grads [*R, n, d]``/``spread [*R, n]`` the agents sent for ``theta [*R, d]``, filter,
        average and run the SCSG loop on the server's own trajectories.

        :param returns: the agents' reported returns ``[*R, n]`` (diagnostics only)
        :param env_steps: the agents' env steps ``[*R, n]`` (diagnostics only)
        :param batch_size: ``B_t`` of the round (:meth:`batch_size`)
        :param aggregate: another robust aggregation instead of FedPG-BR's filter (for comparisons,
            e.g. Flower's Krum): ``aggregate(grads [*R, n, d], usable [*R, n]) -> (μ_t [*R, d], kept [*R, n])``
        :return: as :meth:`round`
        """
        auto = self.sigma in ("auto", "auto_bound")
        check = self.check_reports(grads, spread, theta, auto)
        if not check.all_valid:
            (on_reject or warn_rejected)(check)
        valid = None if check.all_valid else check.valid
        if valid is not None and grads.shape[:-1] != check.valid.shape:  # the whole report tensor is unusable
            grads = torch.zeros(*check.valid.shape, theta.shape[-1], dtype=theta.dtype, device=theta.device)
        if valid is not None and spread.shape != check.valid.shape:
            spread = torch.ones(check.valid.shape, dtype=theta.dtype, device=theta.device)
        sigma = self.estimate_sigma(spread, valid) if auto else torch.full_like(spread[..., 0], float(self.sigma))
        usable = torch.ones(grads.shape[:-1], dtype=torch.bool, device=grads.device) if valid is None else valid
        if aggregate is not None:
            mu, kept = aggregate(grads, usable)
            decision = FilterResult(kept, torch.zeros_like(kept[..., 0]), torch.full_like(sigma, math.inf, dtype=torch.float64))
        else:
            if self.use_filter:
                decision = byzantine_filter(grads, sigma, self.delta, batch_size, self.max_byzantine_fraction, valid)
            else:
                decision = FilterResult(usable, torch.zeros_like(usable[..., 0]), torch.full_like(sigma, math.inf, dtype=torch.float64))
            mu = filtered_mean(grads, decision.kept)
        inner_steps = geometric_inner_steps(server_uniform[..., 1], batch_size, self.inner_batch_size)
        inner_steps = torch.where(decision.kept.any(-1), inner_steps, torch.zeros_like(inner_steps))
        anchor, current = theta, theta.clone()
        server_steps = torch.zeros_like(sigma)
        if self.optimizer == "adam" and optimizer_state is None:
            optimizer_state = AdamState.zeros_like(theta)
        streams = server_sampler.streams
        for step in range(int(inner_steps.max()) if inner_steps.numel() else 0):
            active = step < inner_steps  # [*R]
            before = streams.counters
            traj = server_trajectories(server_sampler, current, self.inner_batch_size)
            # Runs whose loop has ended draw nothing: their streams do not depend on other runs.
            streams.counters = torch.where(active.reshape(*active.shape, *([1] * (before.dim() - active.dim()))), streams.counters, before)
            if self.server_critic is None:
                psi = self.estimator.weights(traj)
            else:  # the server's own critic, fitted on this batch after weighting it (inactive runs keep theirs)
                psi, targets = self.server_critic.step_weights(traj)
                self.server_critic.fit(traj, targets, active)
            g, g_anchor, _, _ = paired_gradients(self.policy, current, anchor, traj, psi, self.max_importance_weight)
            v = g - g_anchor + mu
            if self.optimizer == "adam":
                current, optimizer_state = adam_ascent(current, v, optimizer_state, self.step_size, active=active)
            else:
                current = torch.where(active.unsqueeze(-1), current + self.step_size * v, current)
            server_steps = server_steps + active.to(server_steps.dtype) * traj.mask.sum((-1, -2))
        info = {
            "kept": decision.kept,
            "fallback": decision.fallback,
            "threshold": decision.threshold,
            "sigma": sigma,
            "batch_size": batch_size,
            "inner_steps": inner_steps,
            "return": returns,
            "env_steps": env_steps,
            "server_env_steps": server_steps,
            "optimizer_state": optimizer_state if self.optimizer == "adam" else None,
            "valid": check.valid,
        }
        return current, info
