"""FedPG-BR: federated policy gradient with Byzantine resilience (Fan et al., NeurIPS 2021).

Paper: "Fault-Tolerant Federated Reinforcement Learning with Theoretical Guarantee", Algorithm 1
(the SCSG-style federated policy gradient) and Algorithm 1.1 (the Byzantine filter); the
fault-tolerant baseline of the MFPO paper (section VI-A2). Docs: ``docs/algorithms/fedpg_br.md``.

The math is a batched functional core over runs ``[*R]`` and agents ``n``:
:func:`filter_threshold`, :func:`byzantine_filter`, :func:`filtered_mean`,
:func:`geometric_inner_steps` and :class:`FedPGBRUpdate` (one round); :class:`FedPGBR` is the
SB3-style shell over one run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from fedrl_algos.attacks import Attack, attack_streams, make_attack
from fedrl_algos.base import FederatedAlgorithm
from fedrl_algos.core.gpomdp import BASELINES, ESTIMATORS, ScoreFunctionGradient, paired_gradients, score_gradient
from fedrl_algos.core.optim import AdamState, adam_ascent, check_server_optimizer
from fedrl_algos.core.rollout import Sampler, Trajectories
from fedrl_algos.mfpo import evaluate_server_policy
from fedrl_algos.policies import FlatPolicy
from fedrl_envs.core import check_int, index_params
from fedrl_envs.rng import RandomStreams, derive_keys

__all__ = [
    "FedPGBR",
    "FedPGBRUpdate",
    "FilterResult",
    "filter_threshold",
    "byzantine_filter",
    "filtered_mean",
    "geometric_inner_steps",
    "server_trajectories",
    "make_server_sampler",
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


def _median_ball(grads: torch.Tensor, dist: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Kept mask of one filtering pass with ``radius [*R]``.

    ``S`` = agents with more than K/2 gradients (themselves included) within ``radius``; the
    "median" ``μ_mom`` is the member of ``S`` closest to the mean of ``S``; the kept agents are
    those within ``radius`` of ``μ_mom`` (none when ``S`` is empty).
    """
    n = grads.shape[-2]
    r = radius.to(dist.dtype).reshape(*radius.shape, 1, 1)
    in_s = (dist <= r).sum(-1) > n / 2  # [*R, n]
    count = in_s.sum(-1, keepdim=True)  # [*R, 1]
    w = in_s.to(grads.dtype).unsqueeze(-1)
    mean_s = (w * grads).sum(-2, keepdim=True) / count.clamp(min=1).unsqueeze(-1).to(grads.dtype)
    to_mean = (grads - mean_s).norm(dim=-1)
    to_mean = torch.where(in_s, to_mean, torch.full_like(to_mean, math.inf))
    mom = torch.gather(grads, -2, to_mean.argmin(-1, keepdim=True).unsqueeze(-1).expand(*grads.shape[:-2], 1, grads.shape[-1]))
    kept = (grads - mom).norm(dim=-1) <= radius.to(grads.dtype).unsqueeze(-1)
    return kept & (count > 0)


def byzantine_filter(
    grads: torch.Tensor, sigma: Any, delta: float, batch_size: Any, max_byzantine_fraction: float
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
    """
    batch = grads.shape[:-2]
    n = grads.shape[-2]
    work = grads.to(torch.float64)
    dist = torch.cdist(work, work, compute_mode="donot_use_mm_for_euclid_dist")  # [*R, n, n], exact zeros
    sigma_t = torch.broadcast_to(torch.as_tensor(sigma, dtype=torch.float64, device=grads.device), batch)
    threshold = torch.broadcast_to(filter_threshold(sigma_t, delta, n, batch_size).to(grads.device), batch)
    kept = _median_ball(work, dist, threshold)
    fallback = kept.sum(-1) < (1.0 - max_byzantine_fraction) * n
    wide = _median_ball(work, dist, 2.0 * sigma_t)
    kept = torch.where(fallback.unsqueeze(-1), wide, kept)
    return FilterResult(kept, fallback, threshold)


def filtered_mean(grads: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Mean of the kept gradients ``[*R, d]`` (zero where none is kept)."""
    w = kept.to(grads.dtype).unsqueeze(-1)
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
) -> Sampler:
    """The server's sampler for runs seeded ``seeds [R]``: rows ``[R, b]``, one stream per trajectory.

    Server trajectory ``j`` runs agent ``j mod n``'s task (``server_task=None``) or agent
    ``server_task``'s; its stream is keyed by the run's seed and ``2**43 + j``.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
    n = int(next(v for v in vars(agent_params).values() if isinstance(v, torch.Tensor)).shape[0])
    b = inner_batch_size
    tasks = torch.arange(b) % n if server_task is None else torch.full((b,), int(server_task))
    params = index_params(agent_params, tasks.repeat(seeds.numel()).to(device))
    streams = RandomStreams(derive_keys(seeds.reshape(-1, 1), torch.arange(b).reshape(1, -1) + _SERVER_TRAJ_STREAM), device)
    return Sampler(family, params, policy, streams, stop_when_done=True)


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
    :param baseline: ``"loo"``, ``"mean"`` or ``None``
    :param max_importance_weight: truncation of ω (``None``: only the overflow guard)
    :param use_filter: ``False`` keeps every agent (the unprotected baseline)
    :param attack: what the Byzantine agents do
    :param optimizer: the server's inner-loop step: ``"sgd"`` (``θ ← θ + η v``) or ``"adam"``
        (Adam with step size η along ``v``, its state carried across rounds: the optimizer of
        FedPG-BR's experiments)
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
    ) -> None:
        self.policy = policy
        self.b_min, self.b_max = batch_range
        self.inner_batch_size = inner_batch_size
        self.step_size = step_size
        self.sigma = sigma
        self.delta = delta
        self.max_byzantine_fraction = max_byzantine_fraction
        self.estimator = ScoreFunctionGradient(policy, gamma, self.b_max, estimator, baseline)
        self.max_importance_weight = max_importance_weight
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
        :return: reported gradients ``[*R, n, d]``, spreads ``max_j ||g(τ_j) − μ_k||`` ``[*R, n]``,
            undiscounted returns ``[*R, n]`` and env steps ``[*R, n]`` of the used trajectories
        """
        n = byzantine.shape[-1]
        local = theta.unsqueeze(-2).expand(*theta.shape[:-1], n, theta.shape[-1])
        rows = byzantine.reshape(*([1] * (local.dim() - 2)), n, 1)
        acting = dataclasses.replace(sampler, policy=self.attack.policy(sampler.policy, rows))
        traj = self.attack.trajectories(acting(local, self.b_max), byzantine)
        used = (torch.arange(self.b_max, device=theta.device) < batch_size.unsqueeze(-1)).to(traj.mask.dtype)  # [*R, Bmax]
        used = used.unsqueeze(-2).unsqueeze(-1)  # [*R, 1, Bmax, 1]
        traj = traj._replace(mask=traj.mask * used, rewards=traj.rewards * used)
        per_traj = score_gradient(self.policy, local, traj, self.estimator.weights(traj), per_trajectory=True)
        count = batch_size.to(per_traj.dtype).reshape(*batch_size.shape, 1, 1)
        mu = per_traj.sum(-2) / count
        deviation = (per_traj - mu.unsqueeze(-2)).norm(dim=-1) * used.squeeze(-1)
        if self.sigma == "auto_bound":  # the largest deviation: an empirical bound
            spread = deviation.amax(-1)
        else:  # the per-trajectory standard deviation
            spread = torch.sqrt((deviation**2).sum(-1) / (count.squeeze(-1) - 1).clamp(min=1))
        reported = self.attack.gradient(mu, torch.broadcast_to(byzantine, mu.shape[:-1]), noise)
        returns = traj.rewards.sum(-1).sum(-1) / count.squeeze(-1)
        return reported, spread, returns, traj.mask.sum((-1, -2))

    def estimate_sigma(self, spread: torch.Tensor) -> torch.Tensor:
        """``σ = "auto"``/``"auto_bound"``: the ``(1 − α)``-quantile over agents of the reported spreads ``[*R, n]``.

        Each agent reports the spread of its per-trajectory estimates around its mean μ_k: the
        standard deviation ``sqrt(Σ_j ||g(τ_j) − μ_k||² / (B_t − 1))`` (``"auto"``) or the largest
        deviation ``max_j ||g(τ_j) − μ_k||`` (``"auto_bound"``, an empirical version of the bound
        ``||g(τ) − ∇J|| ≤ σ`` behind FedPG-BR's concentration argument; about 3× wider). With at most
        a fraction α of Byzantine agents the ``(1 − α)``-quantile is never above the largest honest
        report, however large the Byzantine ones are.
        """
        return torch.quantile(spread.to(torch.float64), 1.0 - self.max_byzantine_fraction, dim=-1, interpolation="lower").to(spread.dtype)

    def round(
        self,
        theta: torch.Tensor,
        agent_sampler: Sampler,
        server_sampler: Sampler,
        server_uniform: torch.Tensor,
        byzantine: torch.Tensor,
        noise: RandomStreams,
        optimizer_state: AdamState | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One round: ``theta [*R, d]`` → new server parameters ``[*R, d]`` and diagnostics.

        :param server_uniform: two uniform numbers per run ``[*R, 2]`` (for B_t and N_t)
        :param byzantine: Byzantine agents ``[n]`` (bool)
        :param optimizer_state: Adam's state after the previous round (``optimizer="adam"``;
            ``None``: a fresh state)
        :return: new θ̃ and ``kept`` ``[*R, n]``, ``fallback`` ``[*R]``, ``threshold`` ``[*R]``,
            ``sigma`` ``[*R]``, ``batch_size`` ``[*R]``, ``inner_steps`` ``[*R]``, ``return``
            ``[*R, n]``, ``env_steps`` ``[*R, n]`` (agents), ``server_env_steps`` ``[*R]``,
            ``optimizer_state`` (Adam's state; ``None`` for ``"sgd"``)
        """
        span = self.b_max - self.b_min + 1
        batch_size = self.b_min + torch.clamp((server_uniform[..., 0].to(torch.float64) * span).long(), max=span - 1)
        grads, spread, returns, env_steps = self.agent_gradients(agent_sampler, theta, batch_size, byzantine, noise)
        auto = self.sigma in ("auto", "auto_bound")
        sigma = self.estimate_sigma(spread) if auto else torch.full_like(spread[..., 0], float(self.sigma))
        if self.use_filter:
            decision = byzantine_filter(grads, sigma, self.delta, batch_size, self.max_byzantine_fraction)
        else:
            keep_all = torch.ones(grads.shape[:-1], dtype=torch.bool, device=grads.device)
            decision = FilterResult(keep_all, torch.zeros_like(keep_all[..., 0]), torch.full_like(sigma, math.inf, dtype=torch.float64))
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
            psi = self.estimator.weights(traj)
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
        }
        return current, info


# --- the SB3 shell ----------------------------------------------------------------------------
class FedPGBR(FederatedAlgorithm):
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
    :param env: a registered fedrl id, a task family or a ``FederatedVecEnv`` on a fedrl family
    :param learning_rate: η, the server's inner-loop step size
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
    :param baseline: ``"loo"``, ``"mean"`` or ``None``
    :param max_importance_weight: truncation of the inner-loop importance weights (``None``: none
        but the overflow guard)
    :param use_filter: ``False``: average every agent's gradient (no protection)
    :param server_task: the task of the server's own environment: an agent index, or ``None``
        (server trajectory j runs agent ``j mod n``'s task, so the inner loop estimates the
        gradient of the agents' average objective)
    :param attack: what Byzantine agents do: an :class:`~fedrl_algos.attacks.Attack` or its name
        (``random_noise``, ``sign_flip``, ``zero_gradient``, ``random_action``, ``reward_flip``)
    :param byzantine_agents: indices of the Byzantine agents
    :param gamma: discount γ
    :param eval_trajectories: Monte Carlo rollouts per agent for the logged evaluation return
    :param policy_kwargs: keyword arguments of the policy
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run
    :param device: torch device
    :param verbose: 0 silent, 1 logger output to stdout
    :param server_optimizer: the inner-loop step: ``"sgd"`` (plain ascent with step η) or
        ``"adam"`` (Adam with step size η along the variance-reduced direction, state kept across
        rounds in :attr:`optimizer_state`; FedPG-BR's own experiments use Adam)

    >>> from fedrl_algos import FedPGBR
    >>> model = FedPGBR("TabularPolicy", "fedrl/GridWorld-v0", learning_rate=0.5, batch_range=(4, 6),
    ...                 inner_batch_size=2, attack="sign_flip", byzantine_agents=[0], seed=0, device="cpu")
    >>> model = model.learn(total_rounds=3)
    >>> len(model.filter_history), len(model.filter_history[0])
    (3, 8)
    """

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        learning_rate: float = 1e-3,
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
        eval_trajectories: int = 0,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        server_optimizer: str = "sgd",
        _init_setup_model: bool = True,
    ) -> None:
        if not (isinstance(learning_rate, int | float) and not isinstance(learning_rate, bool) and learning_rate >= 0):
            raise ValueError(f"learning_rate must be a number >= 0, got {learning_rate!r}")
        self.server_learning_rate = float(learning_rate)
        if not (isinstance(batch_range, Sequence) and len(batch_range) == 2):
            raise ValueError(f"batch_range must be a pair (B_min, B_max), got {batch_range!r}")
        b_min = check_int("batch_range[0]", batch_range[0], 2)
        b_max = check_int("batch_range[1]", batch_range[1], b_min)
        self.batch_range = (b_min, b_max)
        self.inner_batch_size = check_int("inner_batch_size", inner_batch_size)
        if not (sigma in ("auto", "auto_bound") or (isinstance(sigma, int | float) and not isinstance(sigma, bool) and sigma > 0)):
            raise ValueError(f"sigma must be a number > 0, 'auto' or 'auto_bound', got {sigma!r}")
        self.sigma = sigma
        if not (isinstance(delta, int | float) and 0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.delta = float(delta)
        if not (isinstance(max_byzantine_fraction, int | float) and 0 <= max_byzantine_fraction < 0.5):
            raise ValueError(f"max_byzantine_fraction must be in [0, 0.5), got {max_byzantine_fraction!r}")
        self.max_byzantine_fraction = float(max_byzantine_fraction)
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        self.estimator_name, self.baseline = estimator, baseline
        if max_importance_weight is not None and not (isinstance(max_importance_weight, int | float) and max_importance_weight >= 1):
            raise ValueError(f"max_importance_weight must be a number >= 1 or None, got {max_importance_weight!r}")
        self.max_importance_weight = max_importance_weight
        self.use_filter = bool(use_filter)
        self.server_task = server_task
        self.attack = make_attack(attack)
        self.byzantine_agents = [int(k) for k in byzantine_agents]
        self.server_optimizer = check_server_optimizer("server_optimizer", server_optimizer)
        self.filter_history: list[list[bool]] = []
        self.env_steps_per_agent = 0.0
        self.server_env_steps = 0.0
        self._extra_rng_state: dict[str, Any] | None = None
        super().__init__(
            policy,
            env,
            beta=0.0,
            tau=1,
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

    # --- set-up --------------------------------------------------------------------------------
    def _make_estimator(self) -> ScoreFunctionGradient:
        # Nominal per-round cost: agents sample B_max trajectories (and use B_t of them).
        return ScoreFunctionGradient(self.policy, self.gamma, self.batch_range[1], self.estimator_name, self.baseline)

    def _setup_model(self) -> None:
        super()._setup_model()
        self.update = FedPGBRUpdate(
            self.policy,
            self.gamma,
            self.batch_range,
            self.inner_batch_size,
            self.server_learning_rate,
            self.sigma,
            self.delta,
            self.max_byzantine_fraction,
            self.estimator_name,
            self.baseline,
            self.max_importance_weight,
            self.use_filter,
            self.attack,
            self.server_optimizer,
        )
        # Adam's state as tensors [1], [1, d] that SB3 saves with the parameters (and maps to the
        # device on load); kept for "sgd" too, where it stays zero.
        d, dtype = self.policy.n_params, self.policy.theta.dtype
        if getattr(self, "adam_step", None) is None:
            self.adam_step = torch.zeros(1, dtype=dtype)
            self.adam_first = torch.zeros(1, d, dtype=dtype)
            self.adam_second = torch.zeros(1, d, dtype=dtype)
        self.adam_step, self.adam_first, self.adam_second = (x.to(self.device) for x in (self.adam_step, self.adam_first, self.adam_second))
        self._make_server_sampler()
        if self._extra_rng_state is not None:
            self.server_sampler.streams.load_state_dict(self._extra_rng_state["server_traj"])
            self.noise_streams.load_state_dict(self._extra_rng_state["noise"])

    def _check_agents(self) -> None:
        if any(not 0 <= k < self.n_agents for k in self.byzantine_agents):
            raise ValueError(f"byzantine_agents must be agent indices in [0, {self.n_agents - 1}], got {self.byzantine_agents}")
        if self.server_task is not None:
            check_int("server_task", self.server_task, 0)
            if self.server_task >= self.n_agents:
                raise ValueError(f"server_task must be an agent index in [0, {self.n_agents - 1}], got {self.server_task}")

    def _make_server_sampler(self) -> None:
        self._check_agents()
        self.federation.sampler.stop_when_done = True
        self.federation.eval_sampler.stop_when_done = True
        self.server_sampler = make_server_sampler(
            self.family, self.federation.agent_params, self.policy, torch.tensor([self.seed]), self.inner_batch_size,
            self.server_task, self.device,
        )
        self.noise_streams = attack_streams(self.federation.streams)
        self.byzantine_mask = torch.zeros(self.n_agents, dtype=torch.bool, device=self.device)
        if self.byzantine_agents:
            self.byzantine_mask[torch.tensor(self.byzantine_agents)] = True

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        n_before = self.n_agents
        super().set_env(env, force_reset)
        if self.n_agents != n_before:
            raise ValueError(f"env must have the model's {n_before} agents, got {self.n_agents}")
        self._make_server_sampler()

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "update", "server_sampler", "noise_streams", "byzantine_mask"]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()
        return state_dicts, [*variables, "adam_step", "adam_first", "adam_second"]

    @property
    def optimizer_state(self) -> AdamState | None:
        """The server's Adam state (``server_optimizer="adam"``), batch shape ``[1]``; ``None`` for ``"sgd"``."""
        if self.server_optimizer != "adam":
            return None
        return AdamState(self.adam_step, self.adam_first, self.adam_second)

    def save(self, path: Any, exclude: Sequence[str] | None = None, include: Sequence[str] | None = None) -> None:
        """Save parameters, configuration and every random-stream state (SB3 zip format)."""
        self._extra_rng_state = {"server_traj": self.server_sampler.streams.state_dict(), "noise": self.noise_streams.state_dict()}
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
    def _train_round(self) -> None:
        theta = self.policy.theta.detach().unsqueeze(0)
        uniform = self.federation.server_streams.uniform((2,), dtype=torch.float64)
        new_theta, info = self.update.round(
            theta, self.federation.sampler, self.server_sampler, uniform, self.byzantine_mask, self.noise_streams,
            self.optimizer_state,
        )
        if info["optimizer_state"] is not None:
            self.adam_step, self.adam_first, self.adam_second = info["optimizer_state"]
        self.policy.theta.data.copy_(new_theta[0])
        self.filter_history.append([bool(k) for k in info["kept"][0].tolist()])
        self.env_steps_per_agent += float(info["env_steps"].mean())
        self.server_env_steps += float(info["server_env_steps"].sum())
        self._last_info = info

    def _log_round(self) -> None:
        info = getattr(self, "_last_info", None)
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
        return evaluate_server_policy(self)
