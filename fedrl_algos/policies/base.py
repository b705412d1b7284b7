"""Policies over flat parameter vectors with arbitrary leading batch dimensions.

Every policy is an SB3 ``BasePolicy`` (so ``predict`` works as in SB3, and its single parameter
``theta`` — the shared initialization, flat ``[d]`` — saves and loads with SB3 utilities), and its
math takes the parameters *explicitly*: ``log_prob(theta, obs, actions)`` accepts ``theta`` of shape
``[*B, d]`` and observations ``[*B, *M, *obs_shape]``, so one call evaluates a whole federation
(``B = (run, agent)``) on all of its trajectories (``M = (traj, time)``).

Parameter layouts (documented because experiments and tests index into them):

* :class:`TabularPolicy`: ``theta[s * A + a]`` is the logit of action ``a`` in state ``s`` (row-major
  ``[S, A]``), initialized to zero (the uniform policy).
* :class:`MlpPolicy`: per layer ``W`` (``[in, out]``, row-major) then ``b`` (``[out]``), layers in
  order. The paper's arc-navigation network 2 → 32 tanh → 8 has ``d = 2·32 + 32 + 32·8 + 8 = 360``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from torch import nn

from fedrl_algos.core.curvature import autograd_curvature_hvp
from fedrl_algos.core.estimators import autograd_hvp, autograd_score_gradient
from fedrl_algos.core.protocols import KernelRolloutPlan
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.rng import RandomStreams, derive_keys, seed_from_entropy
from fedrl_envs.validation import check_bool

__all__ = ["FlatPolicy", "CategoricalMixin", "sample_categorical", "orthogonal_matrix", "check_init_gains"]


def orthogonal_matrix(rows: int, cols: int, gain: float, streams: RandomStreams) -> torch.Tensor:
    """A ``[rows, cols]`` (semi-)orthogonal matrix times ``gain``, float64, from one draw of ``streams``.

    The same construction as ``torch.nn.init.orthogonal_`` (QR of a standard normal matrix, columns
    signed by ``diag(R)`` so the result is Haar-distributed), but the normals come from a counter-based
    stream instead of the global generator: the same seed gives the same matrix (QR runs in float64
    on the CPU; another LAPACK build may differ in the last bits).

    :param rows: number of rows
    :param cols: number of columns
    :param gain: scale of the result
    :param streams: a single stream (batch shape ``(1,)``); ``rows · cols`` normals are drawn from it
    """
    z = streams.normal((rows * cols,), dtype=torch.float64)[0].cpu().reshape(rows, cols)
    tall = z if rows >= cols else z.T  # QR orthonormalizes columns: work on the tall orientation
    q, r = torch.linalg.qr(tall)
    q = q * torch.where(torch.diagonal(r) >= 0, 1.0, -1.0)
    return gain * (q if rows >= cols else q.T)


def check_init_gains(init_gains: Any, meaning: str) -> tuple[float, float]:
    """``init_gains`` as a pair of floats, or a ``ValueError`` naming it (``meaning``: what the two gains scale)."""
    ok = (isinstance(init_gains, Sequence) and not isinstance(init_gains, str) and len(init_gains) == 2
          and all(isinstance(g, numbers.Real) and not isinstance(g, bool) for g in init_gains))
    gains = (float(init_gains[0]), float(init_gains[1])) if ok else None
    if gains is None or not all(math.isfinite(g) and g > 0 for g in gains):
        raise ValueError(f"init_gains must be a pair of positive numbers {meaning}, got {init_gains!r}")
    return gains


def sample_categorical(logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: ``uniform[...]`` in [0, 1) → action index ``[...]`` (int64)."""
    cdf = torch.softmax(logits, dim=-1).cumsum(-1)
    return (cdf < uniform.unsqueeze(-1).to(cdf.dtype)).sum(-1).clamp_(max=logits.shape[-1] - 1)


class FlatPolicy(BasePolicy):
    """Base class: a stochastic policy whose parameters are one flat vector.

    :param observation_space: observation space of one environment
    :param action_space: action space of one environment
    :param dtype: floating dtype of the parameters (float32 is about 2× faster; float64 for checks)
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(observation_space, action_space)
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch dtype (torch.float32 or torch.float64), got {dtype!r}")
        self.param_dtype = dtype
        self.theta = nn.Parameter(self.initial_parameters(), requires_grad=False)

    # --- to implement --------------------------------------------------------------------------
    @property
    def n_params(self) -> int:
        """Number of parameters d."""
        raise NotImplementedError

    def initial_parameters(self) -> torch.Tensor:
        """The default initialization ``[d]``."""
        raise NotImplementedError

    def log_prob(self, theta: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``log π(a | s; θ)`` of shape ``[*B, *M]`` for ``theta [*B, d]``, ``obs [*B, *M, ...]``."""
        raise NotImplementedError

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        """Actions ``[*B, *M, ...]`` drawn from the policy with each row's own random stream."""
        raise NotImplementedError

    def mode(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The most likely action (deterministic prediction)."""
        raise NotImplementedError

    # --- calculus: autograd defaults, overridden by policies with closed forms ------------------
    def score_gradient(self, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor) -> torch.Tensor:
        """``(1/m) Σ_j Σ_h ψ_{j,h} ∇log π(a_{j,h} | s_{j,h}; θ)`` for every row: ``[*B, d]``.

        The default differentiates :meth:`log_prob` (one autograd call for the whole batch).

        :param theta: parameters ``[*B, d]``
        :param traj: trajectories ``[*B, m, T, ...]``
        :param weights: step weights ``ψ [*B, m, T]`` (0 after termination), treated as constants
        """
        return autograd_score_gradient(self, theta, traj, weights)

    def hvp(self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The curvature estimate ``(1/m) Σ_ξ [g(ξ) ∇log q(ξ)ᵀv + ∇²ν(ξ) v]`` applied to ``v``: ``[*B, d]``.

        ``ν(ξ) = Σ_h ψ_h log π(a_h|s_h)`` and ``g = ∇ν`` (Per-FedAvg-PG paper, eq. (3), with
        ``ψ_h = R^h``). The default uses autograd (a forward-mode JVP and a double backward).

        :param theta: parameters ``[*B, d]`` the trajectories were sampled with
        :param traj: trajectories ``[*B, m, T, ...]``
        :param v: direction ``[*B, d]``
        :param weights: step weights ``ψ [*B, m, T]``
        """
        return autograd_hvp(self, theta, traj, v, weights)

    def curvature_hvp(
        self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor, coupling: str
    ) -> torch.Tensor:
        """A curvature estimate ``(1/m) Σ_ξ [Σ_h ω_h ∇log π_h + Σ_h ψ_h ∇²log π_h v]`` applied to ``v``: ``[*B, d]``.

        ``ω`` couples the directional scores ``∇log π_hᵀv`` to the weights as ``coupling`` says
        (:func:`~fedrl_algos.core.curvature.coupled_score_weights`: ``"paper"`` is :meth:`hvp`,
        ``"causal"`` the causality-respecting estimator, ``"lvc"`` ProMP's biased one). The default
        uses autograd (:func:`~fedrl_algos.core.curvature.autograd_curvature_hvp`).

        :param theta: parameters ``[*B, d]`` the trajectories were sampled with
        :param traj: trajectories ``[*B, m, T, ...]``
        :param v: direction ``[*B, d]``
        :param weights: step weights ``ψ [*B, m, T]``
        :param coupling: ``"paper"``, ``"causal"`` or ``"lvc"``
        """
        return autograd_curvature_hvp(self, theta, traj, v, weights, coupling)

    def kernel_rollout_plan(self, family: Any, params: Any) -> KernelRolloutPlan | None:
        """A faster rollout of this policy through ``family``'s kernels on task rows ``params``.

        ``None`` (the default): the sampler steps the kernels with :meth:`sample`. A policy that
        overrides it must return exactly the trajectories and leave the random streams exactly as
        the generic rollout would (tests hold both equal).

        :param family: the task family
        :param params: task parameters stacked over the sampler's rows
        """
        return None

    # --- SB3 interface -------------------------------------------------------------------------
    def seed_predictions(self, seed: int) -> None:
        """Key the random stream of stochastic :meth:`predict` calls (algorithms derive it from their seed)."""
        self._predict_streams = RandomStreams(derive_keys(int(seed), torch.arange(1)), self.theta.device)

    def _check_observation(self, obs: torch.Tensor) -> None:
        space = self.observation_space
        if isinstance(space, spaces.Discrete):
            if obs.is_floating_point() and not bool((obs == obs.round()).all()):
                raise ValueError(f"observation must hold integer states of {space}, got non-integer values")
            if obs.numel() and (bool((obs < space.start).any()) or bool((obs >= space.start + space.n).any())):
                raise ValueError(f"observation must lie in [{space.start}, {space.start + space.n - 1}] ({space})")

    def _predict(self, observation: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        theta = self.theta.detach()
        obs = observation.to(self.theta.device)
        self._check_observation(obs)
        if deterministic:
            return self.mode(theta, obs)
        if getattr(self, "_predict_streams", None) is None:
            # A policy used on its own (not through an algorithm) draws its key from fresh entropy.
            self.seed_predictions(seed_from_entropy())
        return self.sample(theta, obs.unsqueeze(0), self._predict_streams)[0]

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self._predict(obs, deterministic)

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False) -> Any:
        """SB3's ``predict`` for one observation or a batch, as a NumPy array or a torch tensor.

        :param observation: observation(s) (a tensor is moved to NumPy first, as SB3 expects)
        :param state: unused (no recurrent state)
        :param episode_start: unused
        :param deterministic: the most likely action instead of a sample
        :return: ``(actions, None)`` as NumPy
        """
        if isinstance(observation, torch.Tensor):
            observation = observation.detach().cpu().numpy()
        values = np.asarray(observation) if not isinstance(observation, dict) else None
        if values is not None and values.dtype.kind in "fc" and not np.isfinite(values).all():
            raise ValueError(f"observation must be finite, got {int((~np.isfinite(values)).sum())} NaN or infinite values")
        return super().predict(observation, state, episode_start, check_bool("deterministic", deterministic))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        # SB3's BaseModel records normalize_images, which a flat policy does not take (a policy that
        # preprocesses images, CnnPolicy, records its own); without this, BasePolicy.load fails.
        data.pop("normalize_images", None)
        data.update(dtype=self.param_dtype)
        return data


class CategoricalMixin:
    """Shared pieces of policies with a ``Discrete`` action space."""

    def logits(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_prob(self, theta: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(self.logits(theta, obs), dim=-1)
        return torch.gather(logp, -1, actions.long().unsqueeze(-1)).squeeze(-1)

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        logits = self.logits(theta, obs)
        batch_dims = streams.keys.dim()
        u = streams.uniform(logits.shape[batch_dims:-1], dtype=logits.dtype)
        return sample_categorical(logits, u)

    def mode(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return self.logits(theta, obs).argmax(-1)


