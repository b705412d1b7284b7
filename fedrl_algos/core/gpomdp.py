"""GPOMDP and REINFORCE with baselines, importance weights and paired (current/previous) gradients.

Notation: a trajectory τ = (s_0, a_0, r_0, …, s_T−1, a_T−1, r_T−1) with a mask ``mask_h`` (1 while
the episode runs, 0 after it terminated); ``R^h = Σ_{t ≥ h} γ^t r_t`` is the reward-to-go with
absolute discounting (as :func:`~fedrl_algos.core.estimators.discounted_rewards_to_go`), so
``R^0 = R(τ)`` is the discounted return. Every estimator here is a *score-weighted sum*

    ĝ = (1/m) Σ_j c_j Σ_h ψ_{j,h} ∇log π(a_{j,h} | s_{j,h}; θ)

with per-step weights ψ and optional per-trajectory weights c (importance weights):

* GPOMDP (Baxter & Bartlett 2001): ``ψ_{j,h} = mask_{j,h} (R^h_j − b_h)``;
* REINFORCE (Williams 1992): ``ψ_{j,h} = mask_{j,h} (R(τ_j) − b)``.

Without a baseline GPOMDP *is* :func:`~fedrl_algos.core.estimators.policy_gradient` (same sum) and
has the same expectation ∇J as REINFORCE. The baselines, all computed over the trajectory axis of
each batch row and only over the trajectories still running at ``h``:

* ``"loo"`` (default) — leave-one-out mean of the *other* trajectories: independent of trajectory
  j, so the estimate stays unbiased;
* ``"mean"`` — the batch mean including j (biased by O(1/m), slightly lower variance);
* ``None`` — no baseline;
* ``"linear"`` — a state-dependent baseline ``b_{j,h} = φ(s_{j,h}, h)ᵀ w`` (garage's linear
  feature baseline, :mod:`fedrl_algos.core.baselines`), ``w`` fitted by ridge least squares on
  the *other* folds of the batch (cross-fitting), so it is independent of trajectory j and the
  estimate stays unbiased. GPOMDP fits the value ``G^h = Σ_{t ≥ h} γ^(t−h) r_t`` (a function of
  the state, as garage's) and subtracts ``γ^h φᵀw`` from ``R^h = γ^h G^h`` (``φᵀw`` itself with
  ``discounting="relative"``); REINFORCE fits the return ``R(τ)`` at every step.

``discounting="relative"`` replaces ``R^h`` in GPOMDP by ``G^h = Σ_{t ≥ h} γ^(t−h) r_t``
(:func:`~fedrl_algos.core.estimators.relative_rewards_to_go`), i.e. drops the factor ``γ^h`` of
step h. The estimate is then no longer the gradient of the discounted return J but the update
every actor-critic library makes (SB3's A2C/PPO, with a value function in place of ``b_h``;
Thomas 2014, Nota & Thomas 2020 on its bias): every step of a long episode carries weight,
where absolute discounting fades step h by ``γ^h`` (at γ = 0.95 the steps after the first ~60
contribute almost nothing). ``"absolute"`` (default) is the papers' estimator.

``normalize_returns=True`` (:func:`normalize_episode_returns`, :func:`normalized_return_rewards`) is
the classic REINFORCE practice of the MFPO authors' released code: every trajectory's own returns-to-go
``G^h`` are standardised over its running steps, ``Ĝ^h = (G^h − mean_h G)/(std_h G + eps)``, and the
estimators above use ``Ĝ`` in place of ``G`` (``γ^h Ĝ^h`` in place of ``R^h`` with absolute discounting;
the baselines are then baselines of ``Ĝ``). **This is not an unbiased estimate of ∇J**: the map is
affine per episode with a scale and offset that depend on the episode itself, so the estimate is the
gradient of no fixed objective (a short episode and a long one are weighted alike, and a good episode's
best steps count as much as a bad episode's). It is an option, off by default.

Every function is batched over leading dimensions ``[*B]`` (e.g. ``(run, agent)``) and makes one
autograd call for the whole batch; nothing loops over agents or trajectories.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedrl_algos.core.baselines import linear_baseline
from fedrl_algos.core.directions import GradientEstimator
from fedrl_algos.core.estimators import (
    autograd_score_gradient,
    discounted_rewards_to_go,
    masked_log_prob,
    relative_rewards_to_go,
)
from fedrl_algos.core.trajectories import Trajectories, fitted_to_batch
from fedrl_envs.validation import check_bool, is_real

__all__ = [
    "BASELINES",
    "ESTIMATORS",
    "DISCOUNTINGS",
    "check_discounting",
    "check_estimator_and_baseline",
    "time_baseline",
    "gpomdp_weights",
    "reinforce_weights",
    "step_weights",
    "normalize_step_weights",
    "normalize_episode_returns",
    "normalized_return_rewards",
    "check_normalize_returns",
    "masked_log_prob",
    "score_gradient",
    "gpomdp",
    "reinforce",
    "log_importance_weights",
    "importance_weights",
    "paired_gradients",
    "ScoreFunctionGradient",
]

#: accepted values of every ``baseline`` argument
BASELINES = ("loo", "mean", None, "linear")
#: accepted values of every ``estimator`` argument
ESTIMATORS = ("gpomdp", "reinforce")
#: accepted values of every ``discounting`` argument (see the module docstring)
DISCOUNTINGS = ("absolute", "relative")


def check_estimator_and_baseline(estimator: str, baseline: str | None) -> None:
    """``ValueError`` naming the argument unless ``estimator`` is in :data:`ESTIMATORS` and
    ``baseline`` in :data:`BASELINES`."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    _check_baseline(baseline)


def check_discounting(estimator: str, discounting: str) -> str:
    """``discounting`` if it is one of :data:`DISCOUNTINGS` and fits ``estimator``, else a ``ValueError``."""
    if discounting not in DISCOUNTINGS:
        raise ValueError(f"discounting must be one of {DISCOUNTINGS}, got {discounting!r}")
    if discounting == "relative" and estimator != "gpomdp":
        raise ValueError(f"discounting='relative' needs estimator='gpomdp' (REINFORCE weights every step by the return from step 0), "
                         f"got estimator={estimator!r}")
    return discounting


def _check_baseline(baseline: str | None) -> None:
    if baseline == "critic":
        raise ValueError(f"baseline must be one of {BASELINES}, got 'critic': baseline='critic' (a learned value function "
                         "with GAE, fedrl_algos.core.critic) is not supported here yet; it is an option of MFPO, FedAvgPG, "
                         "IndependentPG and FedPGBR")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")


def time_baseline(values: torch.Tensor, mask: torch.Tensor, baseline: str | None = "loo") -> torch.Tensor:
    """Per-trajectory baseline ``b_{j,h}`` of ``values [*B, m, T]`` over the trajectory axis (−2).

    Only trajectories running at ``h`` (``mask > 0``) enter the average; a row with no other
    running trajectory gets 0. For ``"loo"`` trajectory j's baseline excludes j itself.

    :param values: the values averaged (e.g. rewards-to-go) ``[*B, m, T]``
    :param mask: ``[*B, m, T]``
    :param baseline: ``"loo"``, ``"mean"`` or ``None`` (``"linear"`` needs the observations:
        :func:`gpomdp_weights`, :func:`~fedrl_algos.core.baselines.linear_baseline`)
    :return: ``[*B, m, T]``
    """
    _check_baseline(baseline)
    if baseline == "linear":
        raise ValueError("baseline='linear' is a function of the observations, not of the values alone: "
                         "use gpomdp_weights/reinforce_weights/step_weights or fedrl_algos.core.baselines.linear_baseline")
    if baseline is None:
        return torch.zeros_like(values)
    alive = (mask > 0).to(values.dtype)
    total = (values * alive).sum(-2, keepdim=True)
    count = alive.sum(-2, keepdim=True)
    if baseline == "loo":
        total = total - values * alive
        count = count - alive
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total)).expand_as(values)


def gpomdp_weights(traj: Trajectories, gamma: float, baseline: str | None = "loo", discounting: str = "absolute") -> torch.Tensor:
    """GPOMDP step weights ``ψ_{j,h} = mask (R^h_j − b_{j,h})``: ``[*B, m, T]`` (``G^h`` in place of
    ``R^h`` with ``discounting="relative"``).

    :param traj: trajectories ``[*B, m, T, ...]``
    :param gamma: discount γ
    :param baseline: one of :data:`BASELINES` (see the module docstring)
    :param discounting: ``"absolute"`` or ``"relative"``
    """
    relative = check_discounting("gpomdp", discounting) == "relative"
    _check_baseline(baseline)
    rewards = traj.rewards * traj.mask
    if baseline == "linear":
        value_to_go = relative_rewards_to_go(rewards, gamma)
        b = linear_baseline(traj, value_to_go)
        if relative:
            return (value_to_go - b) * traj.mask
        discount = gamma ** torch.arange(rewards.shape[-1], device=rewards.device, dtype=rewards.dtype)
        return (discounted_rewards_to_go(rewards, gamma) - discount * b) * traj.mask
    reward_to_go = (relative_rewards_to_go if relative else discounted_rewards_to_go)(rewards, gamma)
    return (reward_to_go - time_baseline(reward_to_go, traj.mask, baseline)) * traj.mask


def reinforce_weights(traj: Trajectories, gamma: float, baseline: str | None = "loo") -> torch.Tensor:
    """REINFORCE step weights ``ψ_{j,h} = mask (R(τ_j) − b)``: ``[*B, m, T]``.

    The baseline averages the other trajectories' returns (every trajectory runs at h = 0); with
    ``"linear"`` it is the cross-fitted linear fit of the return on the features of each step's
    state and time (:mod:`fedrl_algos.core.baselines`), a per-step ``b_{j,h}``.

    :param traj: trajectories ``[*B, m, T, ...]``
    :param gamma: discount γ
    :param baseline: one of :data:`BASELINES`
    """
    ret = discounted_rewards_to_go(traj.rewards * traj.mask, gamma)[..., :1]  # [*B, m, 1]
    _check_baseline(baseline)
    if baseline == "linear":
        returns = ret.expand_as(traj.rewards)
        return (returns - linear_baseline(traj, returns)) * traj.mask
    ones = torch.ones_like(ret)
    return (ret - time_baseline(ret, ones, baseline)) * traj.mask


def normalize_episode_returns(returns: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Standardise every trajectory's values over its own running steps: ``(G^h − μ_j)/(σ_j + eps)``
    with ``μ_j, σ_j`` the mean and (population) standard deviation of ``returns[..., j, :]`` over the
    steps where ``mask > 0``; 0 where ``mask`` is 0.

    The per-episode normalisation of REINFORCE implementations (and of the MFPO authors' code, which
    divides by the sample standard deviation, ``n − 1``; the two differ by ``√((n−1)/n)``, under 0.3 %
    for a 200-step episode). An episode of one running step, or of constant returns, becomes 0.
    A per-episode affine map whose offset and scale depend on the episode: an estimator weighted
    with it is not an unbiased estimate of ∇J (see the module docstring).

    :param returns: e.g. returns-to-go ``G^h`` ``[*B, m, T]``
    :param mask: ``[*B, m, T]``
    :param eps: added to the standard deviation
    :return: ``[*B, m, T]``
    """
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    alive = (mask > 0).to(returns.dtype)
    count = alive.sum(-1, keepdim=True).clamp(min=1)
    values = returns * alive
    mean = values.sum(-1, keepdim=True) / count
    var = (((returns - mean) * alive) ** 2).sum(-1, keepdim=True) / count
    return (returns - mean) / (var.sqrt() + eps) * alive


def normalized_return_rewards(rewards: torch.Tensor, mask: torch.Tensor, gamma: float, eps: float = 1e-8) -> torch.Tensor:
    """Rewards ``r̂`` whose returns-to-go ``Σ_{t≥h} γ^(t−h) r̂_t`` are the episode-normalised returns-to-go
    :func:`normalize_episode_returns` of ``G^h = Σ_{t≥h} γ^(t−h) r_t``: ``r̂_h = Ĝ^h − γ mask_{h+1} Ĝ^{h+1}``.

    Swapping a batch's rewards for these makes every estimator here (GPOMDP's ``R^h = γ^h Ĝ^h`` or
    ``Ĝ^h``, its baselines, the linear baseline's fit) and the critic's GAE(λ) and regression targets
    (:func:`~fedrl_algos.core.critic.critic_step_weights`: ``A_h = Ĝ^h − V(s_h)`` at λ = 1) use the
    normalised returns, with no other change.

    :param rewards: ``[*B, m, T]``
    :param mask: ``[*B, m, T]``
    :param gamma: γ
    :param eps: see :func:`normalize_episode_returns`
    :return: ``[*B, m, T]`` (0 where ``mask`` is 0)
    """
    alive = (mask > 0).to(rewards.dtype)
    normalized = normalize_episode_returns(relative_rewards_to_go(rewards * alive, gamma), mask, eps)
    following = torch.cat((normalized[..., 1:], torch.zeros_like(normalized[..., :1])), -1)
    return (normalized - gamma * following) * alive


def check_max_importance_weight(value: Any) -> float | None:
    """The truncation of importance weights: ``None`` (untruncated) or a real number ≥ 1 (a cap below
    1 would clip the weight of the very policy that sampled the batch). ``TypeError`` for a non-number
    (a bool included), ``ValueError`` for a number below 1 or NaN; the value comes back as a ``float``."""
    if value is None:
        return None
    if not is_real(value):
        raise TypeError(f"max_importance_weight must be a number >= 1 or None, got {value!r}")
    if not value >= 1:
        raise ValueError(f"max_importance_weight must be a number >= 1 or None, got {value!r}")
    return float(value)


def check_normalize_returns(normalize_returns: bool, estimator: str = "gpomdp") -> bool:
    """``normalize_returns`` if it is a bool that fits ``estimator``: ``TypeError`` for a non-bool,
    ``ValueError`` with REINFORCE (its weight is the return from step 0 at every step, which per-episode
    standardisation makes 0)."""
    normalize_returns = check_bool("normalize_returns", normalize_returns)
    if normalize_returns and estimator != "gpomdp":
        raise ValueError(f"normalize_returns=True needs estimator='gpomdp' (REINFORCE weights every step of an episode by "
                         f"the same return, which per-episode standardisation makes 0), got estimator={estimator!r}")
    return normalize_returns


def step_weights(
    traj: Trajectories, gamma: float, estimator: str = "gpomdp", baseline: str | None = "loo", discounting: str = "absolute",
    normalize_returns: bool = False,
) -> torch.Tensor:
    """``ψ`` of ``estimator`` (``"gpomdp"`` or ``"reinforce"``): ``[*B, m, T]``; with ``normalize_returns``
    on the episode-normalised returns (:func:`normalized_return_rewards`; GPOMDP only)."""
    check_discounting(estimator, discounting)
    if check_normalize_returns(normalize_returns, estimator):
        traj = traj._replace(rewards=normalized_return_rewards(traj.rewards, traj.mask, gamma))
    if estimator == "gpomdp":
        return gpomdp_weights(traj, gamma, baseline, discounting)
    if estimator == "reinforce":
        return reinforce_weights(traj, gamma, baseline)
    raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")


def normalize_step_weights(psi: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``ψ / (std(ψ) + eps)`` per batch row, the standard deviation over the row's running steps
    (``mask > 0``) of all its trajectories: SB3's ``normalize_advantage`` without the centring
    (the baseline already centres ψ at every step).

    Dividing a row's estimate by one positive number leaves its direction unchanged and makes its
    scale independent of the reward scale, so a fixed step size moves the policy by a comparable
    amount whether returns are −1500 or −150. The estimate is no longer ∇J itself but a
    batch-dependent positive multiple of it (a ratio estimator, biased by O(1/m)).

    :param psi: step weights ``[*B, m, T]`` (e.g. :func:`gpomdp_weights`)
    :param mask: ``[*B, m, T]``
    :param eps: added to the standard deviation (a row whose weights are all 0 stays 0)
    :return: ``[*B, m, T]``
    """
    alive = (mask > 0).to(psi.dtype)
    count = alive.sum((-1, -2), keepdim=True).clamp(min=1)
    mean = (psi * alive).sum((-1, -2), keepdim=True) / count
    var = (((psi - mean) * alive) ** 2).sum((-1, -2), keepdim=True) / count
    return psi / (var.sqrt() + eps)


@fitted_to_batch
def score_gradient(
    policy,
    theta: torch.Tensor,
    traj: Trajectories,
    psi: torch.Tensor,
    traj_weights: torch.Tensor | None = None,
    per_trajectory: bool = False,
) -> torch.Tensor:
    """``(1/m) Σ_j c_j Σ_h ψ_{j,h} ∇log π(a_{j,h}|s_{j,h}; θ)`` for every row: ``[*B, d]``.

    The policy computes the sum (:meth:`~fedrl_algos.core.protocols.FlatPolicyProtocol.score_gradient`:
    its closed form where it has one, autograd otherwise); the per-trajectory terms always come
    from :func:`~fedrl_algos.core.estimators.autograd_score_gradient`.

    :param policy: a flat policy
    :param theta: parameters ``[*B, d]``
    :param traj: trajectories ``[*B, m, T, ...]``
    :param psi: step weights ``[*B, m, T]`` (e.g. :func:`gpomdp_weights`), treated as constants
    :param traj_weights: per-trajectory weights ``c [*B, m]`` (default 1), treated as constants
    :param per_trajectory: return the un-averaged per-trajectory terms ``c_j Σ_h ψ ∇log π``
        ``[*B, m, d]`` instead
    """
    if per_trajectory:
        return autograd_score_gradient(policy, theta, traj, psi, traj_weights, per_trajectory=True)
    psi = psi.detach()
    if traj_weights is not None:
        psi = psi * traj_weights.detach().unsqueeze(-1)
    return policy.score_gradient(theta, traj, psi)


def gpomdp(policy, theta: torch.Tensor, traj: Trajectories, gamma: float, baseline: str | None = "loo") -> torch.Tensor:
    """GPOMDP estimate of ∇J for every row: ``[*B, d]``."""
    return score_gradient(policy, theta, traj, gpomdp_weights(traj, gamma, baseline))


def reinforce(policy, theta: torch.Tensor, traj: Trajectories, gamma: float, baseline: str | None = "loo") -> torch.Tensor:
    """REINFORCE estimate of ∇J for every row: ``[*B, d]``."""
    return score_gradient(policy, theta, traj, reinforce_weights(traj, gamma, baseline))


@fitted_to_batch
def log_importance_weights(policy, theta_target: torch.Tensor, theta_behaviour: torch.Tensor, traj: Trajectories) -> torch.Tensor:
    """``log w_j = Σ_h mask (log π_target(a_h|s_h) − log π_behaviour(a_h|s_h))``: ``[*B, m]`` (MFPO's eq. (4)
    in log form, ``w = Π π_{θ_{t−1}} / Π π_{θ_t}`` with the target θ_{t−1} and the behaviour θ_t).

    ``w_j = p(τ_j | θ_target) / p(τ_j | θ_behaviour)`` (the transition terms cancel) for trajectories
    drawn with ``θ_behaviour``.
    """
    with torch.no_grad():
        return (masked_log_prob(policy, theta_target, traj) - masked_log_prob(policy, theta_behaviour, traj)).sum(-1)


def importance_weights(
    log_w: torch.Tensor, max_weight: float | None = None, self_normalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights from log weights ``[*B, m]``, computed without overflow.

    * ``max_weight`` (truncation): ``w = exp(min(log w, log max_weight))``. With ``None`` the log
      weight is still clamped at the log of the dtype's largest value, so ``w`` is finite; below
      the cap the weights are exact.
    * ``self_normalize``: ``w_j = m·softmax(log w)_j`` over the trajectory axis (the weights of a
      row average to 1); computed with the max-shift of softmax, so it never overflows, and
      applied after truncation when both are given.

    :return: ``(weights, clipped)`` — the weights ``[*B, m]`` and a boolean mask of the truncated ones
    """
    log_w = log_w.detach()
    cap = math.log(max_weight) if max_weight is not None else math.log(torch.finfo(log_w.dtype).max) - 1.0
    clipped = log_w > cap
    log_w = log_w.clamp(max=cap)
    if self_normalize:
        return torch.softmax(log_w, dim=-1) * log_w.shape[-1], clipped
    return torch.exp(log_w), clipped


@fitted_to_batch
def paired_gradients(
    policy,
    theta: torch.Tensor,
    theta_prev: torch.Tensor,
    traj: Trajectories,
    psi: torch.Tensor,
    max_weight: float | None = None,
    self_normalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The current estimate and the importance-weighted previous one from the same trajectories.

    For trajectories drawn with ``theta`` this returns, for every row,

    * ``g = (1/m) Σ_j Σ_h ψ_{j,h} ∇log π(a|s; θ)``,
    * ``g_prev = (1/m) Σ_j w_j Σ_h ψ_{j,h} ∇log π(a|s; θ_prev)`` with
      ``w_j = p(τ_j|θ_prev) / p(τ_j|θ)`` (:func:`importance_weights`),

    the two estimates of MFPO's eq. (3) and of the SCSG inner loop of FedPG-BR, in one forward
    and one backward pass (θ and θ_prev stacked on a new leading axis).

    :return: ``(g [*B, d], g_prev [*B, d], w [*B, m], clipped [*B, m])``
    """
    psi = psi.detach()
    m = traj.n_trajectories
    pair = torch.stack((theta.detach(), theta_prev.detach().to(theta.dtype).expand_as(theta)))
    with torch.enable_grad():
        th = pair.requires_grad_(True)
        obs = traj.obs.unsqueeze(0).expand(2, *traj.obs.shape)
        actions = traj.actions.unsqueeze(0).expand(2, *traj.actions.shape)
        logp = policy.log_prob(th, obs, actions)
        logp = torch.where(traj.mask > 0, logp, torch.zeros_like(logp))
        log_w = (logp[1] - logp[0]).detach().sum(-1)
        w, clipped = importance_weights(log_w, max_weight, self_normalize)
        surrogate = (logp[0] * psi).sum() + (logp[1] * psi * w.unsqueeze(-1)).sum()
        (grad,) = torch.autograd.grad(surrogate, th)
    return grad[0] / m, grad[1] / m, w, clipped


class ScoreFunctionGradient(GradientEstimator):
    """GPOMDP or REINFORCE with a baseline from ``m`` fresh trajectories at θ (a strategy object).

    :param policy: the flat policy
    :param gamma: discount
    :param m: trajectories per estimate
    :param estimator: ``"gpomdp"`` or ``"reinforce"``
    :param baseline: ``"loo"``, ``"mean"``, ``None`` or ``"linear"`` (see the module docstring)
    :param normalize_advantage: divide the step weights by their standard deviation over each
        batch row (:func:`normalize_step_weights`)
    :param discounting: ``"absolute"`` (``R^h``, the gradient of J) or ``"relative"`` (``G^h``;
        GPOMDP only, see the module docstring)
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running
        steps before the baseline (:func:`normalized_return_rewards`; GPOMDP only; not an unbiased
        estimate of ∇J, see the module docstring); applied before ``normalize_advantage``
    """

    def __init__(
        self,
        policy,
        gamma: float,
        m: int,
        estimator: str = "gpomdp",
        baseline: str | None = "loo",
        normalize_advantage: bool = False,
        discounting: str = "absolute",
        normalize_returns: bool = False,
    ) -> None:
        super().__init__(policy, gamma)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m must be an int >= 1, got {m!r}")
        check_estimator_and_baseline(estimator, baseline)
        normalize_advantage = check_bool("normalize_advantage", normalize_advantage)
        self.m, self.estimator, self.baseline = m, estimator, baseline
        self.discounting = check_discounting(estimator, discounting)
        self.normalize_advantage = normalize_advantage
        self.normalize_returns = check_normalize_returns(normalize_returns, estimator)
        self.name = estimator

    @property
    def trajectories_per_step(self) -> int:
        return self.m

    def weights(self, traj: Trajectories) -> torch.Tensor:
        """The step weights ψ of this estimator for ``traj`` (normalized if asked)."""
        psi = step_weights(traj, self.gamma, self.estimator, self.baseline, self.discounting, self.normalize_returns)
        return normalize_step_weights(psi, traj.mask) if self.normalize_advantage else psi

    def __call__(self, sampler, theta: torch.Tensor) -> torch.Tensor:
        traj = sampler(theta, self.m)
        return score_gradient(self.policy, theta, traj, self.weights(traj))
