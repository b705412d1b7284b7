"""Action heads shared by the network policies: categorical logits or a diagonal Gaussian.

A network policy (:class:`~fedrl_algos.policies.mlp.MlpPolicy`, :class:`~fedrl_algos.policies.cnn.CnnPolicy`)
computes one output per action dimension with :meth:`head`; :class:`ActionHeadMixin` turns that output
into a distribution — softmax logits for ``Discrete`` actions, the mean of a diagonal Gaussian for
``Box`` actions — so the distribution math is written once for every architecture.

The Gaussian (:class:`GaussianHead`) has a state-independent log standard deviation, the last
``action_dim`` entries of θ, clamped to ``log_std_bounds``; with ``squash="tanh"`` (the MFPO paper's
"Tanh Gaussian outputs") an action is

    a = c + h · tanh(u),   u ~ N(μ(s), σ²),   c = (high + low) / 2,   h = (high − low) / 2

(equal to ``low + (high − low)(tanh(u) + 1)/2``), and by the change of variables

    log π(a|s) = log N(u; μ, σ²) − Σ_k log(1 − tanh²(u_k)) − Σ_k log h_k.

In floating point ``tanh(u)`` reaches ±1 at a finite ``|u|``, so the sampler clips it to ``±(1 − ε)``
(``ε`` the dtype's machine epsilon): every ``u ≥ b`` gives the same action ``a_max`` (and every
``u ≤ −b`` the same ``a_min``), where ``b = atanh(1 − 5ε/4)`` is where ``tanh(u)`` starts to round
to ``1 − ε`` or above (≈ 8.2 in float32, ≈ 18.3 in float64). The action's distribution therefore has an atom
at each end, and its log-probability there is the log of the tail mass (a censored Gaussian),

    log π(a_max|s)_k = log Φ((μ_k − b)/σ_k),   log π(a_min|s)_k = log Φ((−b − μ_k)/σ_k),

summed with the other dimensions' density terms. Its score tends to 0 as ``μ_k → ∞`` (the action no
longer depends on μ), where the density at the clipped ``u = b`` would give the unbounded
``(b − μ_k)/σ_k²``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from gymnasium import spaces

from fedrl_envs.rng import RandomStreams

__all__ = [
    "SQUASHES",
    "ActionHeadMixin",
    "GaussianHead",
    "action_head_for",
    "check_log_std_bounds",
    "log1m_tanh_squared",
    "log_normal_cdf",
]

#: Values of the ``squash`` argument: ``None`` (an unbounded Gaussian) or ``"tanh"``.
SQUASHES = (None, "tanh")

_LOG2 = math.log(2.0)


def log1m_tanh_squared(u: torch.Tensor) -> torch.Tensor:
    """``log(1 − tanh²(u))`` computed stably as ``2 (log 2 − |u| − log1p(exp(−2|u|)))``.

    The direct formula is ``log(0) = −inf`` once ``tanh(u)`` rounds to ±1 (|u| ≳ 9 in float32,
    ≳ 19 in float64) and loses digits well before; this one (the identity ``1 − tanh² = 4 /
    (e^u + e^−u)²``, written for ``|u|`` so nothing overflows) is accurate for every finite ``u``.
    (``2 (log 2 − u − softplus(−2u))`` is the same function, but torch's ``softplus`` returns its
    argument unchanged above 20, an error of ~1e-9.)

    >>> import torch
    >>> u = torch.tensor([0.0, 1.0, -30.0], dtype=torch.float64)
    >>> log1m_tanh_squared(u)
    tensor([  0.0000,  -0.8676, -58.6137], dtype=torch.float64)
    """
    a = u.abs()
    return 2.0 * (_LOG2 - a - torch.log1p(torch.exp(-2.0 * a)))


_LOG_NDTR_CUT = -20.0


def log_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """``log Φ(x)`` (standard normal CDF) with an accurate, finite gradient for every finite ``x``.

    ``torch.special.log_ndtr``'s values are accurate, but its derivative ``φ(x)/Φ(x)`` is not for
    large negative ``x`` (``inf`` at x = −4.7e4 in float32, twice the true ``≈ −x`` at −1e8 in
    float64). Below x = −20 this uses the asymptotic series
    ``log Φ(x) = −x²/2 − log(−x) − ½ log 2π + log(1 − x⁻² + 3x⁻⁴ − 15x⁻⁶ + 105x⁻⁸)`` (relative error of
    the last factor below 1e-10 there), computed in float64 and returned in ``x``'s dtype. Both
    branches only ever see arguments of their own range, so neither leaks a NaN into the other's gradient.

    >>> import torch
    >>> x = torch.tensor([-1e4, -30.0, 0.0], dtype=torch.float64, requires_grad=True)
    >>> (grad,) = torch.autograd.grad(log_normal_cdf(x).sum(), x)
    >>> grad
    tensor([1.0000e+04, 3.0033e+01, 7.9788e-01], dtype=torch.float64)
    """
    x64 = x.to(torch.float64)
    left = x64 < _LOG_NDTR_CUT
    cut = torch.full_like(x64, _LOG_NDTR_CUT)
    mid = torch.special.log_ndtr(torch.where(left, cut, x64))
    xl = torch.where(left, x64, cut)
    r = 1.0 / (xl * xl)
    series = torch.log1p(r * (-1.0 + r * (3.0 + r * (-15.0 + r * 105.0))))
    asym = -0.5 * xl * xl - torch.log(-xl) - 0.5 * math.log(2 * math.pi) + series
    return torch.where(left, asym, mid).to(x.dtype)


def check_log_std_bounds(log_std_bounds: Sequence[float] | None, log_std_init: float) -> tuple[float, float] | None:
    """Validate ``log_std_bounds`` (a finite ``(low, high)`` with ``low < high``, or ``None``) and that
    ``log_std_init`` lies inside them (else its gradient would be zero from the start).

    :param log_std_bounds: the clamp of the log standard deviation, or ``None``
    :param log_std_init: the initial log standard deviation
    :return: the bounds as a pair of floats, or ``None``
    """
    if log_std_bounds is None:
        return None
    if not (
        isinstance(log_std_bounds, Sequence)
        and len(log_std_bounds) == 2
        and all(math.isfinite(float(b)) for b in log_std_bounds)
        and float(log_std_bounds[0]) < float(log_std_bounds[1])
    ):
        raise ValueError(f"log_std_bounds must be a pair of finite numbers (low, high) with low < high, or None, got {log_std_bounds!r}")
    bounds = (float(log_std_bounds[0]), float(log_std_bounds[1]))
    if not bounds[0] <= log_std_init <= bounds[1]:
        raise ValueError(f"log_std_init must lie in log_std_bounds {bounds}, got {log_std_init}")
    return bounds


class GaussianHead:
    """A diagonal Gaussian over a ``Box`` action space, optionally tanh-squashed into its bounds.

    Actions passed to :meth:`log_prob` are actions in the environment's space. Squashed actions are
    mapped back to ``u`` (rather than storing ``u`` beside the action: the trajectories an
    estimator sees hold only actions) by ``u = atanh(clip((a − c)/h, −1 + ε, 1 − ε))`` with
    ``ε = torch.finfo(dtype).eps`` (2.2e-16 in float64, 1.2e-7 in float32). :meth:`sample` applies
    the same clip to ``tanh(u)``, so an action the policy sampled never lies outside
    ``[a_min, a_max]`` (the images of ``∓(1 − ε)``), and every ``|u| ≥ b`` (≈ 18.3 in float64, ≈ 8.2
    in float32; module docstring) lands exactly on one of those two values. :meth:`log_prob` gives
    an action inside them the change-of-variables density (exact up to rounding) and an action on
    or beyond them the Gaussian's tail mass beyond ``±b`` (module docstring), so that log π is the
    log-likelihood of the actions the sampler can return: importance weights are likelihood ratios
    and the score has mean zero even when the pre-squash mean is far outside tanh's range. ``ε``
    and ``b`` are those of the dtype the actions are stored in (a float32 action of a float64
    policy saturates as float32 does).

    :param action_space: a flat ``Box`` (finite bounds with ``high > low`` when squashed)
    :param squash: ``None`` or ``"tanh"``
    :param policy_name: the policy's class name, for error messages
    """

    def __init__(self, action_space: spaces.Box, squash: str | None = None, policy_name: str = "policy") -> None:
        if squash not in SQUASHES:
            raise ValueError(f"squash must be one of {SQUASHES}, got {squash!r}")
        self.squash = squash
        self.action_dim = int(action_space.shape[0])
        if squash is not None:
            low, high = np.asarray(action_space.low, dtype=np.float64), np.asarray(action_space.high, dtype=np.float64)
            if not (np.isfinite(low).all() and np.isfinite(high).all() and (high > low).all()):
                raise ValueError(
                    f"squash={squash!r} maps actions into the action space's bounds, so {policy_name} needs finite bounds "
                    f"with high > low in every dimension; got {action_space} (use squash=None for unbounded actions)"
                )
            self._low, self._high = torch.from_numpy(low), torch.from_numpy(high)
            self._center, self._half = (self._high + self._low) / 2, (self._high - self._low) / 2

    def _bounds(self, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x.to(like) for x in (self._center, self._half, self._low, self._high))

    def squash_action(self, u: torch.Tensor) -> torch.Tensor:
        """``u`` (pre-squash) → the action ``c + h · clip(tanh(u), −1 + ε, 1 − ε)``, inside the bounds."""
        eps = torch.finfo(u.dtype).eps
        return self._scale(torch.tanh(u).clamp(-1.0 + eps, 1.0 - eps))

    def _scale(self, t: torch.Tensor) -> torch.Tensor:
        """``t ∈ [−1, 1]`` → the action ``c + h·t``, in the bounds."""
        center, half, low, high = self._bounds(t)
        # Rounding of c + h·t can step one ulp past a bound; the clamp keeps actions in the space.
        return torch.minimum(torch.maximum(center + half * t, low), high)

    def unsquash_action(self, actions: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`squash_action`: actions → ``u = atanh(clip((a − c)/h, −1 + ε, 1 − ε))``."""
        center, half, _, _ = self._bounds(actions)
        eps = torch.finfo(actions.dtype).eps
        return torch.atanh(((actions - center) / half).clamp(-1.0 + eps, 1.0 - eps))

    def log_prob(self, mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``log π(a|s)`` ``[...]`` for ``mean [..., A]``, ``log_std`` broadcastable to it, ``actions [..., A]``
        (squashed: a density inside the clipped ends, the tail mass on them; class docstring)."""
        stored = actions
        actions = actions.to(mean.dtype)
        if self.squash is None:
            z = (actions - mean) * torch.exp(-log_std)
            return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        upper, lower, b = self._saturated(stored)
        u = self.unsquash_action(actions)
        inv_std = torch.exp(-log_std)
        z = (u - mean) * inv_std
        _, half, _, _ = self._bounds(mean)
        density = -0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi) - log1m_tanh_squared(u) - torch.log(half)
        # Atoms: every u beyond ±b was returned as the same clipped action (class docstring).
        tail_upper = log_normal_cdf((mean - b) * inv_std)
        tail_lower = log_normal_cdf((-b - mean) * inv_std)
        return torch.where(upper, tail_upper, torch.where(lower, tail_lower, density)).sum(-1)

    def _saturated(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Which entries of ``actions`` sit on (or beyond) the clipped ends ``a_max``/``a_min`` of
        :meth:`squash_action` in the actions' own dtype, and the threshold ``b`` of that dtype."""
        dtype = actions.dtype if actions.is_floating_point() else torch.float64
        eps = torch.finfo(dtype).eps
        end = torch.tensor([1.0 - eps, -1.0 + eps], dtype=dtype, device=actions.device)
        a_max, a_min = self._scale(end.unsqueeze(-1).expand(2, self.action_dim))
        # The atom collects every u whose tanh rounds to 1 − ε or above: rounding to nearest, that is
        # tanh(u) ≥ 1 − ε − ε/4 (the next float below 1 − ε is 1 − 3ε/2), so b = atanh(1 − 5ε/4).
        x = 1.25 * eps
        return actions >= a_max, actions <= a_min, 0.5 * math.log((2.0 - x) / x)

    def sample(self, mean: torch.Tensor, log_std: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        """Actions ``[..., A]``: ``u = μ + σ·z`` with ``z`` from each row's stream, squashed if asked."""
        noise = streams.normal(mean.shape[streams.keys.dim() :], dtype=mean.dtype)
        u = mean + torch.exp(log_std) * noise
        return u if self.squash is None else self.squash_action(u)

    def mode(self, mean: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the mean, squashed if asked."""
        return mean if self.squash is None else self.squash_action(mean)


def action_head_for(action_space: spaces.Space, squash: str | None, policy_name: str) -> tuple[bool, int, GaussianHead | None]:
    """The head a network policy puts on ``action_space``: ``(gaussian, output size, Gaussian head or None)``.

    :param action_space: ``Discrete(A)`` (categorical, ``A`` logits) or a flat ``Box(k,)`` (Gaussian, ``k`` means)
    :param squash: ``None`` or ``"tanh"`` (``Box`` only)
    :param policy_name: the policy's class name, for error messages
    """
    if isinstance(action_space, spaces.Discrete):
        if squash is not None:
            raise ValueError(f"squash applies to Box action spaces only (a Gaussian head), got squash={squash!r} with {action_space}")
        return False, int(action_space.n), None
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        return True, int(action_space.shape[0]), GaussianHead(action_space, squash, policy_name)
    raise ValueError(f"policy {policy_name} needs a Discrete or flat Box action space, got {action_space}")


class ActionHeadMixin:
    """``log_prob``/``sample``/``mode`` of a network policy from its :meth:`head` output.

    Put it before :class:`~fedrl_algos.policies.base.CategoricalMixin` in the bases; the policy
    sets ``gaussian``, ``action_dim``, ``log_std_bounds`` and (Gaussian) ``action_head`` before
    ``FlatPolicy.__init__``, and its θ ends with the ``action_dim`` log standard deviations.
    """

    gaussian: bool
    action_dim: int
    log_std_bounds: tuple[float, float] | None
    action_head: GaussianHead | None

    def head(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Network output ``[*B, *M, out]`` (logits, or the Gaussian mean)."""
        raise NotImplementedError

    def logits(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return self.head(theta, obs)

    def log_std(self, theta: torch.Tensor) -> torch.Tensor:
        """The log standard deviation the Gaussian head acts with ``[*B, action_dim]`` (clamped to ``log_std_bounds``)."""
        raw = theta[..., theta.shape[-1] - self.action_dim :]
        return raw if self.log_std_bounds is None else raw.clamp(*self.log_std_bounds)

    def _mean_and_log_std(self, theta: torch.Tensor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.head(theta, obs)
        # log_std is per row of θ; give it singleton axes for the trajectory/time axes of obs.
        log_std = self.log_std(theta).reshape(*theta.shape[:-1], *([1] * (mean.dim() - theta.dim())), self.action_dim)
        return mean, log_std

    def log_prob(self, theta: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if not self.gaussian:
            return super().log_prob(theta, obs, actions)
        return self.action_head.log_prob(*self._mean_and_log_std(theta, obs), actions)

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        if not self.gaussian:
            return super().sample(theta, obs, streams)
        return self.action_head.sample(*self._mean_and_log_std(theta, obs), streams)

    def mode(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        if not self.gaussian:
            return super().mode(theta, obs)
        return self.action_head.mode(self.head(theta, obs))
