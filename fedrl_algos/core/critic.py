"""A learned value function V_φ(s) per agent with GAE(λ) advantages (``baseline="critic"``).

**The critic.** An MLP ``V_φ(s)`` (SB3's value network: hidden layers ``net_arch``, tanh by default,
a linear output) whose parameters are one flat tensor per agent, ``φ [*B, d_φ]`` (``B``: runs ×
agents), evaluated for every agent at once by batched matmuls over the leading axes (no loop over
agents or trajectories). Integer (``Discrete``) observations, such as the gridworld's state index,
are one-hot encoded; with ``net_arch=[]`` the critic is then a table. Image observations (a 3-D
``uint8`` ``Box``) get :class:`~fedrl_algos.policies.critics.CnnCritic` instead, SB3's Nature CNN with a linear value head, on the
same flat φ (:func:`~fedrl_algos.policies.critics.critic_for_space`). The output is
PopArt-normalised (van Hasselt et al., 2016): ``V(s) = μ + σ·f_φ(s)`` with per-agent target
statistics ``μ, σ`` set to the last fitted batch's, the output layer rescaled so that a change of
statistics leaves V unchanged; the network itself fits targets of order 1 whatever the reward
scale (Pendulum's values are near −500; a zero-initialised output moved by Adam steps of 1e-3
would need thousands of steps to get there).

**The advantages: GAE(λ)** (Schulman et al., 2016), per step, with the episode mask:
``δ_h = r_h + γ·mask_{h+1}·V(s_{h+1}) − V(s_h)`` and ``A_h = Σ_l (γλ)^l δ_{h+l}``. After termination
V is 0 (``mask_{h+1} = 0``). **At the fixed-horizon truncation (the last step ``T − 1``) nothing is
bootstrapped:** ``V(s_T) = 0``. The objective of every federation here is the finite-horizon
return ``J = E Σ_{h<T} γ^h r_h`` (GPOMDP's rewards-to-go stop at ``T − 1`` too), so a bootstrap
would add a term that is not in J (and a bias with λ = 1); the trajectories do not hold ``s_T``
either. With λ = 1 the sum telescopes: ``A_h = G^h − V(s_h)`` with ``G^h = Σ_{t≥h} γ^(t−h) r_t``.

**The step weights** of the papers' absolute-discounted estimator are ``ψ_h = γ^h A_h`` (``A_h`` with
``discounting="relative"``). With λ = 1 this is GPOMDP with the state-dependent baseline
``γ^h V(s_h)``: unbiased whenever V does not depend on the batch it weights. The library therefore
**fits the critic after the batch's weights are computed**: the critic that weights batch k was
fitted on batches < k only, and is independent of batch k. λ < 1 (SB3's 0.95) trades that
unbiasedness for less variance.

**The fit**: ``n_epochs`` full-batch Adam steps of size ``lr`` on the mean squared error between
``f_φ(s_h)`` and the normalised λ-returns ``(A_h + V(s_h) − μ)/σ`` over the running steps — each
agent on its own batch, all agents in one autograd call.

**In a federation**: :class:`CriticGradient` is the local direction (GPOMDP with these weights) of
the federations that take plain local policy-gradient steps (FedAvg-PG, independent PG); it holds
every agent's critic and fits it after each batch. The federated rule for φ
(``critic_aggregation``) is applied by :func:`federate_critics` once per round: ``"local"`` keeps
every agent's own critic (heterogeneous agents have different value functions), ``"average"``
brings the agents to common output statistics and averages φ (:func:`average_critics`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import torch

from fedrl_algos.core.directions import GradientEstimator
from fedrl_algos.core.gpomdp import (
    check_normalize_returns,
    normalize_step_weights,
    normalized_return_rewards,
    score_gradient,
)
from fedrl_algos.core.optim import AdamState, adam_ascent
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.validation import check_bool

__all__ = [
    "CRITIC_AGGREGATIONS",
    "CRITIC_ACTIVATIONS",
    "CriticBaseline",
    "CriticGradient",
    "CriticState",
    "MlpCritic",
    "FlatCritic",
    "average_critics",
    "federate_critics",
    "select_critics",
    "check_critic_settings",
    "gae",
    "critic_step_weights",
    "critic_batch_weights",
]

#: federated rules for φ: ``"local"`` (each agent keeps its own), ``"average"`` (the server averages φ with θ)
CRITIC_AGGREGATIONS = ("local", "average")
#: hidden activations of the critic
CRITIC_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}
#: the smallest target scale σ of the output normalisation
MIN_SCALE = 1e-3


class CriticState(NamedTuple):
    """Every agent's critic; batch ``[*B]``.

    :param phi: the network's parameters ``[*B, d_φ]``
    :param moments: the Adam state of the fit (batch ``[*B]``; ``step`` counts the fits' Adam steps)
    :param mean: μ of the output normalisation ``[*B]``
    :param scale: σ of the output normalisation ``[*B]``
    """

    phi: torch.Tensor
    moments: AdamState
    mean: torch.Tensor
    scale: torch.Tensor


def check_gae_lambda(gae_lambda: float, name: str = "gae_lambda") -> None:
    """``ValueError`` naming ``name`` unless ``gae_lambda`` is a number in [0, 1]."""
    if isinstance(gae_lambda, bool) or not isinstance(gae_lambda, int | float) or not 0.0 <= gae_lambda <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {gae_lambda!r}")


def check_critic_settings(gae_lambda: float, n_critic_epochs: int, critic_learning_rate: float, critic_aggregation: str) -> None:
    """``ValueError`` naming the argument unless every critic setting is valid."""
    check_gae_lambda(gae_lambda)
    if isinstance(n_critic_epochs, bool) or not isinstance(n_critic_epochs, int) or n_critic_epochs < 0:
        raise ValueError(f"n_critic_epochs must be an int >= 0, got {n_critic_epochs!r}")
    if isinstance(critic_learning_rate, bool) or not isinstance(critic_learning_rate, int | float) or not critic_learning_rate > 0:
        raise ValueError(f"critic_learning_rate must be a number > 0, got {critic_learning_rate!r}")
    if critic_aggregation not in CRITIC_AGGREGATIONS:
        raise ValueError(f"critic_aggregation must be one of {CRITIC_AGGREGATIONS}, got {critic_aggregation!r}")


class FlatCritic:
    """What every value network shares (:class:`MlpCritic`, :class:`~fedrl_algos.policies.critics.CnnCritic`): φ flat ``[*B, d_φ]``
    ending with a linear output layer of ``head_inputs`` weights and one bias (which PopArt
    rescales), the output normalisation and the fit. A subclass sets ``n_params`` and
    ``head_inputs`` and defines ``initial_phi`` and ``network``."""

    n_params: int
    #: inputs of the linear output layer: the last ``head_inputs + 1`` entries of φ are its weights and bias
    head_inputs: int

    def network(self, phi: torch.Tensor, obs: torch.Tensor, batch_dims: int) -> torch.Tensor:
        raise NotImplementedError

    def initial_state(self, phi: torch.Tensor) -> CriticState:
        """A fresh :class:`CriticState` from φ ``[*B, d_φ]`` (zero Adam state, μ = 0, σ = 1)."""
        batch = phi.shape[:-1]
        return CriticState(phi, AdamState.zeros_like(phi), phi.new_zeros(batch), phi.new_ones(batch))

    def values(self, state: CriticState, obs: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``V(s) = μ + σ f_φ(s)``: ``[*B, m, T]``."""
        f = self.network(state.phi, obs, batch_dims)
        return state.mean[(...,) + (None,) * 2] + state.scale[(...,) + (None,) * 2] * f

    def _renormalize(self, state: CriticState, mean: torch.Tensor, scale: torch.Tensor) -> CriticState:
        """New statistics ``(mean, scale)`` with the output layer rescaled so that V is unchanged (PopArt)."""
        i = self.head_inputs
        ratio = (state.scale / scale).unsqueeze(-1)
        phi = state.phi
        w, b = phi[..., -i - 1:-1], phi[..., -1:]
        new_b = (state.scale.unsqueeze(-1) * b + state.mean.unsqueeze(-1) - mean.unsqueeze(-1)) / scale.unsqueeze(-1)
        phi = torch.cat((phi[..., :-i - 1], w * ratio, new_b), -1)
        return CriticState(phi, state.moments, mean, scale)

    def loss(self, state: CriticState, obs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The regression loss of every row, in normalised units: the mean over running steps of
        ``(f_φ(s) − (y − μ)/σ)²``, ``[*B]``."""
        alive = (mask > 0).to(state.phi.dtype)
        batch_dims = targets.dim()
        y = (targets.to(state.phi.dtype) - state.mean[(...,) + (None,) * 2]) / state.scale[(...,) + (None,) * 2]
        err = torch.where(alive > 0, self.network(state.phi, obs, batch_dims) - y, torch.zeros_like(y))
        return (err**2).sum((-1, -2)) / alive.sum((-1, -2)).clamp(min=1)

    def normalized_to(self, state: CriticState, targets: torch.Tensor, mask: torch.Tensor) -> CriticState:
        """``state`` with the statistics μ, σ of ``targets [*B, m, T]`` over the running steps (rows
        without one keep theirs), the output layer rescaled so that V is unchanged (:meth:`_renormalize`)."""
        with torch.no_grad():
            alive = (mask > 0).to(state.phi.dtype)
            y = targets.to(state.phi.dtype)
            count = alive.sum((-1, -2)).clamp(min=1)
            mean = (y * alive).sum((-1, -2)) / count
            var = (((y - mean[(...,) + (None,) * 2]) * alive) ** 2).sum((-1, -2)) / count
            has = alive.sum((-1, -2)) > 0
            mean = torch.where(has, mean, state.mean)
            scale = torch.where(has, var.sqrt().clamp(min=MIN_SCALE), state.scale)
            return self._renormalize(state, mean, scale)

    def regress(self, state: CriticState, obs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, n_steps: int, lr: float
                ) -> CriticState:
        """``n_steps`` full-batch Adam steps of size ``lr`` on :meth:`loss` at the statistics ``state``
        holds (no renormalisation), every row on its own batch, all rows in one autograd call."""
        phi, moments = state.phi.detach(), state.moments
        for _ in range(n_steps):
            with torch.enable_grad():
                p = phi.requires_grad_(True)
                loss = self.loss(CriticState(p, moments, state.mean, state.scale), obs, targets, mask).sum()
                (grad,) = torch.autograd.grad(loss, p)
            phi, moments = adam_ascent(phi.detach(), -grad, moments, lr)
        return CriticState(phi.detach(), moments, state.mean, state.scale)

    def fit(self, state: CriticState, obs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, n_epochs: int, lr: float
            ) -> CriticState:
        """Regress V on ``targets [*B, m, T]`` over the running steps: first the statistics μ, σ
        become the batch's (the output layer rescaled, :meth:`normalized_to`), then ``n_epochs``
        full-batch Adam steps of size ``lr`` on :meth:`loss` (:meth:`regress`), every row on its own batch."""
        return self.regress(self.normalized_to(state, targets, mask), obs, targets, mask, n_epochs, lr)


class MlpCritic(FlatCritic):
    """The value network ``f_φ`` of every agent, φ flat ``[*B, d_φ]`` (see the module docstring).

    :param n_inputs: observation size (for ``discrete``: the number of states)
    :param net_arch: hidden layer sizes (default ``[64, 64]``, SB3's ``vf``)
    :param activation: ``"tanh"`` (default, SB3's) or ``"relu"``
    :param discrete: observations are integer state indices, one-hot encoded
    :param time_horizon: ``T``, the steps of the longest episode (``H + 1``), for one more input, the
        step's fraction of the horizon ``h/T`` (``None``: no time input). On a fixed horizon the value
        to go depends on the time left as well as on the state (Pardo et al., 2018, "Time limits in
        reinforcement learning"); V(s) alone cannot fit that, where the leave-one-out baseline, a
        mean per time step, does. ``T`` is fixed, never a batch's length: samplers trim a batch to
        its longest episode, and an input that depended on that would depend on the batch (the
        baseline would no longer be a function of the state and the step only)
    """

    def __init__(self, n_inputs: int, net_arch: Sequence[int] = (64, 64), activation: str = "tanh", discrete: bool = False,
                 time_horizon: int | None = None) -> None:
        if isinstance(net_arch, str | bytes) or not isinstance(net_arch, Sequence) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in net_arch):
            raise ValueError(f"critic_net_arch must be a list of hidden layer sizes (positive ints, e.g. [64, 64]), got {net_arch!r}")
        if activation not in CRITIC_ACTIVATIONS:
            raise ValueError(f"critic_activation must be one of {tuple(CRITIC_ACTIVATIONS)}, got {activation!r}")
        if time_horizon is not None and (isinstance(time_horizon, bool) or not isinstance(time_horizon, int) or time_horizon < 1):
            raise ValueError(f"time_horizon must be None or an int >= 1 (the steps of the longest episode), got {time_horizon!r}")
        self.n_inputs, self.net_arch, self.activation, self.discrete = int(n_inputs), [int(h) for h in net_arch], activation, bool(discrete)
        self.time_horizon = time_horizon
        self.sizes = [self.n_inputs + int(self.time_aware), *self.net_arch, 1]
        self.n_params = sum(i * o + o for i, o in zip(self.sizes[:-1], self.sizes[1:], strict=True))
        self.head_inputs = self.sizes[-2]

    def initial_phi(self, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """φ ``[d_φ]``: hidden weights N(0, 1/fan_in)·gain (SB3's orthogonal gain √2 in scale), zero
        biases and a zero output layer (V = μ at the start), drawn from ``seed``."""
        gen = torch.Generator().manual_seed(int(seed) % (2**63))
        parts = []
        for k, (i, o) in enumerate(zip(self.sizes[:-1], self.sizes[1:], strict=True)):
            last = k == len(self.sizes) - 2
            w = torch.zeros(i, o, dtype=torch.float64) if last else torch.randn(i, o, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / i)
            parts += [w.reshape(-1), torch.zeros(o, dtype=torch.float64)]
        return torch.cat(parts).to(dtype)

    def _inputs(self, obs: torch.Tensor, batch_dims: int, dtype: torch.dtype) -> torch.Tensor:
        lead = obs.shape[:batch_dims]
        if self.discrete:
            x = torch.nn.functional.one_hot(obs.long().clamp(0, self.n_inputs - 1), self.n_inputs).to(dtype).reshape(*lead, self.n_inputs)
        else:
            x = obs.reshape(*lead, -1).to(dtype)
        if self.time_horizon is None:
            return x
        steps = lead[-1]  # obs [*B, m, T, ...]: the last leading axis is time
        fraction = torch.arange(steps, device=x.device, dtype=dtype) / self.time_horizon
        return torch.cat((x, fraction.reshape(steps, 1).expand(*lead, 1)), -1)

    @property
    def time_aware(self) -> bool:
        """Whether the step's fraction of the horizon is an input (``time_horizon`` is set)."""
        return self.time_horizon is not None

    def network(self, phi: torch.Tensor, obs: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``f_φ(s)`` of every step: ``[*B, m, T]`` from ``obs [*B, m, T, *obs_shape]`` (``batch_dims``
        = 2 + len(B)), one batched matmul per hidden layer over the leading axes ``[*B]``; the output
        layer is an elementwise product and sum, so a row's values do not depend on how many rows
        ``[*B]`` holds (a one-agent Flower client computes what the whole federation does, bitwise)."""
        batch = phi.shape[:-1]
        lead = obs.shape[:batch_dims]
        x = self._inputs(obs, batch_dims, phi.dtype).reshape(*batch, -1, self.sizes[0])  # [*B, m·T, in]
        act = CRITIC_ACTIVATIONS[self.activation]
        offset = 0
        n_layers = len(self.sizes) - 1
        for k, (i, o) in enumerate(zip(self.sizes[:-1], self.sizes[1:], strict=True)):
            w = phi[..., offset:offset + i * o].reshape(*batch, i, o)
            b = phi[..., offset + i * o:offset + i * o + o].unsqueeze(-2)
            offset += i * o + o
            if o == 1:  # an elementwise product and sum: a row's V does not depend on how many rows the batch has
                x = (x * w.transpose(-1, -2)).sum(-1, keepdim=True) + b  # (a matrix-vector product may take another kernel for one row)
            else:
                x = x @ w + b
            if k < n_layers - 1:
                x = act(x)
        return x.reshape(lead)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, gae_lambda: float) -> torch.Tensor:
    """GAE(λ) advantages ``A_h = Σ_l (γλ)^l δ_{h+l}`` with ``δ_h = r_h + γ mask_{h+1} V(s_{h+1}) − V(s_h)``:
    ``[*B, m, T]``, 0 where ``mask`` is 0. V is 0 after termination and at the truncation after the
    last step (no bootstrap; see the module docstring). A loop over time steps only.

    :param rewards: ``[*B, m, T]``
    :param values: ``V(s_h)`` ``[*B, m, T]``
    :param mask: ``[*B, m, T]``
    :param gamma: γ
    :param gae_lambda: λ in [0, 1]
    """
    alive = (mask > 0).to(values.dtype)
    v = torch.where(alive > 0, values, torch.zeros_like(values))
    r = torch.where(alive > 0, rewards.to(values.dtype), torch.zeros_like(v))
    next_v = torch.cat((v[..., 1:], torch.zeros_like(v[..., :1])), -1)
    delta = (r + gamma * next_v - v) * alive
    adv = torch.zeros_like(v)
    running = torch.zeros_like(v[..., 0])
    for h in range(v.shape[-1] - 1, -1, -1):
        running = delta[..., h] + gamma * gae_lambda * running * (alive[..., h + 1] if h + 1 < v.shape[-1] else 0.0)
        adv[..., h] = running
    return adv * alive


def critic_step_weights(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float, gae_lambda: float, discounting: str = "absolute"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step weights ψ of GPOMDP with the critic and the critic's regression targets.

    :return: ``ψ_h = γ^h A_h`` (``A_h`` with ``discounting="relative"``) ``[*B, m, T]`` and the
        λ-returns ``A_h + V(s_h)`` ``[*B, m, T]``
    """
    adv = gae(rewards, values, mask, gamma, gae_lambda)
    targets = (adv + values) * (mask > 0).to(values.dtype)
    if discounting == "relative":
        return adv, targets
    discount = gamma ** torch.arange(adv.shape[-1], device=adv.device, dtype=adv.dtype)
    return adv * discount, targets


def critic_batch_weights(
    critic: FlatCritic,
    state: CriticState,
    traj: Trajectories,
    gamma: float,
    gae_lambda: float,
    discounting: str = "absolute",
    normalize_returns: bool = False,
    normalize_advantage: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step weights ψ ``[*B, m, T]`` of a batch under the critics ``state`` (batch ``[*B]``) and
    the targets of their fit (:func:`critic_step_weights`; nothing is fitted, no gradient).

    With ``normalize_returns`` the rewards are first swapped for ones whose returns-to-go are the
    episode-normalised ones (:func:`~fedrl_algos.core.gpomdp.normalized_return_rewards`), so GAE and
    the targets are in normalised units: V estimates what it is subtracted from.
    ``normalize_advantage`` divides ψ by its standard deviation afterwards.
    """
    with torch.no_grad():
        values = critic.values(state, traj.obs, traj.rewards.dim()).to(traj.rewards.dtype)
        rewards = normalized_return_rewards(traj.rewards, traj.mask, gamma) if normalize_returns else traj.rewards
        psi, targets = critic_step_weights(values, rewards, traj.mask, gamma, gae_lambda, discounting)
    return (normalize_step_weights(psi, traj.mask) if normalize_advantage else psi), targets


def select_critics(keep: torch.Tensor, new: CriticState, old: CriticState) -> CriticState:
    """``new`` where ``keep [*B]`` (bool) is true, ``old`` elsewhere (batch ``[*B]``)."""
    def pick(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(keep.reshape(*keep.shape, *([1] * (a.dim() - keep.dim()))), a, b)

    return CriticState(pick(new.phi, old.phi), AdamState(*(pick(a, b) for a, b in zip(new.moments, old.moments, strict=True))),
                       pick(new.mean, old.mean), pick(new.scale, old.scale))


def average_critics(critic: FlatCritic, state: CriticState, weights: torch.Tensor | None = None) -> CriticState:
    """The server's rule ``critic_aggregation="average"`` over the agent axis (the last batch axis):
    every agent's output layer is brought to the agents' mean statistics (μ̄, σ̄; its V unchanged,
    PopArt), then φ and the fit's Adam moments are averaged and broadcast to every agent (batch
    ``[*R, n]``; the Adam step count is the largest).

    :param critic: the value network
    :param state: every agent's critic, batch ``[*R, n]``
    :param weights: optional ``[*R, n]`` (e.g. the participation mask): a weighted mean over the
        agents of positive weight (the step count their largest); a run whose weights are all 0
        keeps ``state``
    """
    if weights is None:
        mean = state.mean.mean(-1, keepdim=True).expand_as(state.mean)
        scale = state.scale.mean(-1, keepdim=True).expand_as(state.scale)
        common = critic._renormalize(state, mean, scale)

        def avg(x: torch.Tensor) -> torch.Tensor:
            return x.mean(-2, keepdim=True).expand_as(x).clone()

        m = common.moments
        step = m.step.amax(-1, keepdim=True).expand_as(m.step).clone()
        return CriticState(avg(common.phi), AdamState(step, avg(m.first), avg(m.second)), mean.clone(), scale.clone())
    w = weights.to(state.phi.dtype)
    total = w.sum(-1, keepdim=True)
    has = total > 0
    safe = total.clamp(min=torch.finfo(w.dtype).tiny)
    mean = torch.where(has, (w * state.mean).sum(-1, keepdim=True) / safe, state.mean.mean(-1, keepdim=True)).expand_as(state.mean)
    scale = torch.where(has, (w * state.scale).sum(-1, keepdim=True) / safe, state.scale.mean(-1, keepdim=True)).expand_as(state.scale)
    common = critic._renormalize(state, mean, scale)
    wx = w.unsqueeze(-1)

    def wavg(x: torch.Tensor) -> torch.Tensor:
        x = torch.where(wx > 0, x, torch.zeros_like(x))  # an agent of weight 0 never leaks a NaN
        return ((wx * x).sum(-2, keepdim=True) / safe.unsqueeze(-1)).expand_as(x).clone()

    m = common.moments
    step = torch.where(w > 0, m.step, torch.full_like(m.step, -math.inf)).amax(-1, keepdim=True).expand_as(m.step).clone()
    averaged = CriticState(wavg(common.phi), AdamState(step, wavg(m.first), wavg(m.second)), mean.clone(), scale.clone())
    return select_critics(has.expand_as(w), averaged, state)


def federate_critics(
    critic: FlatCritic, fitted: CriticState, start: CriticState, aggregation: str, participating: torch.Tensor | None = None
) -> CriticState:
    """Every agent's critic after a round, batch ``[*R, n]``: the agents that took part in the
    round (``participating [*R, n]``, bool; ``None``: every agent) keep what they fitted, the
    others their critic of the round's start (they may have been computed, with an attack or a
    per-agent estimator, but did not take part); with ``aggregation="average"`` the server then
    averages the participants' critics (:func:`average_critics`) and broadcasts the average to
    every agent (a run without a participant keeps its critics).

    :param critic: the value network
    :param fitted: the critics after the round's fits
    :param start: the critics at the round's start
    :param aggregation: ``"local"`` or ``"average"`` (:data:`CRITIC_AGGREGATIONS`)
    :param participating: the agents of the round (``None``: all)
    """
    if aggregation not in CRITIC_AGGREGATIONS:
        raise ValueError(f"critic_aggregation must be one of {CRITIC_AGGREGATIONS}, got {aggregation!r}")
    kept = fitted if participating is None else select_critics(participating, fitted, start)
    if aggregation == "local":
        return kept
    return average_critics(critic, kept, None if participating is None else participating)


class CriticBaseline:
    """Every agent's critic as the baseline of a policy-gradient estimate: the GAE(λ) step weights
    of a batch under the critics held in :attr:`state` (batch ``[*B]``: runs × agents), and their
    fit on that batch. A stateful strategy object: the estimator that holds it computes a batch's
    weights first (:meth:`step_weights`) and fits afterwards (:meth:`fit`), so the critic that
    weights batch k saw batches < k only (with λ = 1 the estimate stays unbiased).

    :param gamma: discount
    :param critic: the value network
    :param gae_lambda: λ of GAE (1: unbiased)
    :param n_epochs: full-batch Adam steps of the fit per batch
    :param lr: their step size
    :param state: every agent's critic (batch the rows of θ), or ``None`` until the caller sets :attr:`state`
    :param normalize_advantage: divide the step weights by their standard deviation over each row
    :param discounting: ``"absolute"`` (``ψ_h = γ^h A_h``, the gradient of J) or ``"relative"`` (``A_h``)
    :param normalize_returns: standardise every trajectory's returns-to-go over its own running steps
        before GAE (:func:`~fedrl_algos.core.gpomdp.normalized_return_rewards`, as MFPO's critic path):
        the advantages and the critic's regression targets are then in normalised units (at λ = 1
        ``A_h = Ĝ^h − V(s_h)``, targets ``Ĝ^h``). Not an unbiased estimate of ∇J
        (:mod:`fedrl_algos.core.gpomdp`); default ``False``; applied before ``normalize_advantage``
    """

    def __init__(
        self,
        gamma: float,
        critic: FlatCritic,
        gae_lambda: float = 1.0,
        n_epochs: int = 5,
        lr: float = 1e-3,
        state: CriticState | None = None,
        normalize_advantage: bool = False,
        discounting: str = "absolute",
        normalize_returns: bool = False,
    ) -> None:
        check_critic_settings(gae_lambda, n_epochs, lr, "local")
        self.normalize_returns = check_normalize_returns(normalize_returns)
        self.gamma, self.critic, self.state = float(gamma), critic, state
        self.gae_lambda, self.n_epochs, self.lr = float(gae_lambda), int(n_epochs), float(lr)
        self.normalize_advantage, self.discounting = check_bool("normalize_advantage", normalize_advantage), discounting

    def _state_for(self, batch: torch.Size) -> CriticState:
        if self.state is None:
            raise ValueError(f"{type(self).__name__}.state must hold every agent's critic before a call, got None")
        if tuple(self.state.phi.shape[:-1]) != tuple(batch):
            raise ValueError(f"{type(self).__name__}.state must have the batch shape {tuple(batch)} of theta's rows, "
                             f"got {tuple(self.state.phi.shape[:-1])}")
        return self.state

    def step_weights(self, traj: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
        """ψ of ``traj [*B, m, T]`` with the current critics and the fit's targets (nothing is fitted)."""
        return critic_batch_weights(self.critic, self._state_for(traj.rewards.shape[:-2]), traj, self.gamma, self.gae_lambda,
                                    self.discounting, self.normalize_returns, self.normalize_advantage)

    def fit(self, traj: Trajectories, targets: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Fit every row's critic on ``traj`` (its targets from :meth:`step_weights`); rows where
        ``active [*B]`` is false keep theirs."""
        state = self._state_for(traj.rewards.shape[:-2])
        fitted = self.critic.fit(state, traj.obs, targets, traj.mask, self.n_epochs, self.lr)
        self.state = fitted if active is None else select_critics(active, fitted, state)

    def weights_then_fit(self, traj: Trajectories) -> torch.Tensor:
        """ψ of ``traj`` under the current critics, which are then fitted on ``traj`` (the order
        that keeps the estimate unbiased)."""
        psi, targets = self.step_weights(traj)
        self.fit(traj, targets)
        return psi


class CriticGradient(CriticBaseline, GradientEstimator):
    """GPOMDP with the critic's GAE(λ) step weights from ``m`` fresh trajectories at θ, fitting
    every agent's critic after each batch (a stateful strategy object, ``baseline="critic"``).

    A call samples a batch at ``theta [*B, d]``, weights it with the critic held in :attr:`state`
    (batch ``[*B]``: runs × agents; :func:`critic_step_weights`), computes the score gradient
    ``(1/m) Σ_j Σ_h ψ_{j,h} ∇log π`` (:func:`~fedrl_algos.core.gpomdp.score_gradient`) and only
    then fits every row's critic on the batch (:meth:`MlpCritic.fit`), so the critic that
    weights batch k saw batches < k only: with λ = 1 the estimate is unbiased. Rows are agents
    of the whole federation (``per_agent_state``): client sampling computes every agent, and the
    round keeps the fits of the participating agents only (:func:`federate_critics`).

    :param policy: the flat policy
    :param gamma: discount
    :param m: trajectories per estimate
    :param critic: the value network
    :param gae_lambda: λ of GAE (1: unbiased)
    :param n_epochs: full-batch Adam steps of the fit per batch
    :param lr: their step size
    :param state: every agent's critic (batch the rows of θ), or ``None`` until the caller sets :attr:`state`
    :param normalize_advantage: divide the step weights by their standard deviation over each row
    :param discounting: ``"absolute"`` (``ψ_h = γ^h A_h``, the gradient of J) or ``"relative"`` (``A_h``)
    :param normalize_returns: as :class:`CriticBaseline`'s (not an unbiased estimate of ∇J)
    """

    #: the critics are per agent of the federation ``[R, n]``
    per_agent_state: ClassVar[bool] = True

    def __init__(
        self,
        policy,
        gamma: float,
        m: int,
        critic: FlatCritic,
        gae_lambda: float = 1.0,
        n_epochs: int = 5,
        lr: float = 1e-3,
        state: CriticState | None = None,
        normalize_advantage: bool = False,
        discounting: str = "absolute",
        normalize_returns: bool = False,
    ) -> None:
        GradientEstimator.__init__(self, policy, gamma)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m must be an int >= 1, got {m!r}")
        CriticBaseline.__init__(self, gamma, critic, gae_lambda, n_epochs, lr, state, normalize_advantage, discounting,
                                normalize_returns)
        self.m = m
        self.name = "gpomdp"

    @property
    def trajectories_per_step(self) -> int:
        return self.m

    def __call__(self, sampler, theta: torch.Tensor) -> torch.Tensor:
        traj = sampler(theta, self.m)
        psi, targets = self.step_weights(traj)
        direction = score_gradient(self.policy, theta, traj, psi)
        self.fit(traj, targets)  # after the weights: batch k's critic saw batches < k only
        return direction
