"""Per-FedAvg-PG's update: the meta-gradient estimators and the round of Algorithm 1.

Paper: "Personalized Federated Policy Gradient" (Per-FedAvg-PG). Every agent i ascends the
meta-objective ``F_i(θ) = J_i(θ + α∇J_i(θ))`` (eq. (5)); its gradient is eq. (6),
``∇F_i(θ) = (I + α∇²J_i(θ)) ∇J_i(θ + α∇J_i(θ))``, estimated by

* :class:`ExactMetaGradient` — eq. (7), ``(I + αĤ) ĝ_out`` (``Ĥ``: eq. (3), or the causal or LVC
  estimator of :mod:`fedrl_algos.core.curvature`);
* :class:`FirstOrderMetaGradient` — section 5, ``ĝ_out`` alone;

and :func:`per_fedavg_pg_round` is one communication round of Algorithm 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fedrl_algos.core.adaptation import (
    CRITIC_BASELINE,
    adaptation_gradient,
    adaptation_weights,
    check_adaptation_baseline,
)
from fedrl_algos.core.aggregation import OnReject, aggregate_valid
from fedrl_algos.core.control_variates import ControlVariates, CorrectedDirection
from fedrl_algos.core.critic import CriticBaseline
from fedrl_algos.core.curvature import (
    check_curvature,
    check_curvature_clip,
    clip_curvature_term,
    curvature_hvp,
    curvature_weights,
)
from fedrl_algos.core.directions import GradientEstimator, SamplerFn, check_step_size_or_tensor, local_update, scale
from fedrl_algos.core.estimators import hessian_vector_product
from fedrl_algos.core.federation import Federation, participated
from fedrl_algos.core.gpomdp import score_gradient
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.validation import check_int

__all__ = ["ExactMetaGradient", "FirstOrderMetaGradient", "per_fedavg_pg_round"]


class _MetaBase(GradientEstimator):
    """What the meta-gradients share: the inner adaptation step and the outer gradient.

    ``inner_baseline`` and ``outer_baseline`` are the baselines of ĝ_in and ĝ_out
    (:mod:`fedrl_algos.core.adaptation`; ``None``: eq. (2), bitwise the paper's estimates). With
    ``"critic"`` either one weights its batch with every agent's critic held by ``critics`` (one
    critic per agent serves both batches: they are trajectories of the same MDP) and fits it on
    the batch afterwards, so the inner batch is weighted by a critic fitted on earlier steps' batches
    and the outer batch by one fitted on those and the inner batch — never on the batch it weights
    (:class:`~fedrl_algos.core.critic.CriticBaseline`). The critics are then per-agent state
    (``per_agent_state``): client sampling computes every agent.
    """

    def __init__(
        self, policy, gamma: float, alpha: float | torch.Tensor, m_in: int, m_out: int, inner_baseline: str | None = None,
        outer_baseline: str | None = None, critics: CriticBaseline | None = None,
    ) -> None:
        super().__init__(policy, gamma)
        self.alpha = check_step_size_or_tensor("alpha", alpha)
        self.m_in = check_int("m_in", m_in)
        self.m_out = check_int("m_out", m_out)
        self.inner_baseline = check_adaptation_baseline(inner_baseline, "inner_baseline", allow_critic=True)
        self.outer_baseline = check_adaptation_baseline(outer_baseline, "outer_baseline", allow_critic=True)
        uses_critic = CRITIC_BASELINE in (self.inner_baseline, self.outer_baseline)
        if uses_critic and not isinstance(critics, CriticBaseline):
            raise ValueError(f"a 'critic' baseline needs critics, every agent's CriticBaseline, got {type(critics).__name__}")
        self.critics = critics if uses_critic else None
        self.per_agent_state = uses_critic

    def step_weights(self, traj: Trajectories, baseline: str | None) -> torch.Tensor:
        """ψ of a batch under ``baseline``; with ``"critic"`` the critics are fitted on it afterwards."""
        if baseline == CRITIC_BASELINE:
            return self.critics.weights_then_fit(traj)
        return adaptation_weights(traj, self.gamma, baseline)

    def gradient(self, theta: torch.Tensor, traj: Trajectories, baseline: str | None) -> torch.Tensor:
        """The adaptation-gradient estimate of ``traj`` (sampled at ``theta``) under ``baseline``
        (with ``"critic"``, the critics are fitted on ``traj`` after its weights)."""
        if baseline == CRITIC_BASELINE:
            return score_gradient(self.policy, theta, traj, self.step_weights(traj, baseline))
        return adaptation_gradient(self.policy, theta, traj, self.gamma, baseline)

    def adapted(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        """``θ̃ = θ + α ĝ_in`` from a fresh inner batch."""
        g_in = self.gradient(theta, sampler(theta, self.m_in), self.inner_baseline)
        return theta + scale(self.alpha, g_in)

    def outer_gradient(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        """``ĝ_out``: the eq. (2) estimate at ``θ̃`` from a fresh outer batch sampled with ``θ̃``
        (with ``outer_baseline``, each reward-to-go minus that baseline: still unbiased for ``∇J(θ̃)``)."""
        adapted = self.adapted(sampler, theta)
        return self.gradient(adapted, sampler(adapted, self.m_out), self.outer_baseline)


class FirstOrderMetaGradient(_MetaBase):
    """The first-order estimator ``∇̂F_i^FO(θ) = ĝ_out`` (section 5: eq. (7) without the curvature
    factor): cost ``m_in + m_out`` trajectories per step."""

    name = "first_order"

    @property
    def trajectories_per_step(self) -> int:
        return self.m_in + self.m_out

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        return self.outer_gradient(sampler, theta)


class ExactMetaGradient(_MetaBase):
    """The exact-variant estimator of eq. (7), ``∇̂F_i(θ) = (I + αĤ) ĝ_out``: cost ``m_in + m_h + m_out``.

    ``ĝ_in`` (m_in trajectories at θ), ``θ̃ = θ + αĝ_in``, ``ĝ_out`` (m_out at θ̃) and ``Ĥ`` (eq. (3),
    m_h at θ) come from three independent batches. ``Ĥ ĝ_out`` is a Hessian-vector product (the
    policy's closed form where it has one, autograd otherwise), computed in chunks of at most
    ``hvp_chunk`` trajectories to keep intermediates cache-sized.

    ``curvature`` chooses the estimator ``Ĥ`` (:mod:`fedrl_algos.core.curvature`): ``"paper"``
    (eq. (3), the default), ``"causal"`` (the Hessian of a causality-respecting DiCE surrogate with
    a leave-one-out per-step baseline: unbiased, lower variance) or ``"lvc"`` (ProMP's low-variance
    curvature: **biased**, for comparison).

    :param policy: the flat policy
    :param gamma: discount γ
    :param alpha: adaptation step size α (a number, or a tensor broadcastable to θ, e.g. ``[R, 1, 1]``
        for one α per run: an α sweep is one batched program)
    :param m_in: inner batch
    :param m_h: Hessian batch
    :param m_out: outer batch
    :param hvp_chunk: trajectories per chunk of the Hessian-vector product
    :param inner_baseline: baseline of ĝ_in (``None``: eq. (2); ``"loo"``, ``"mean"``, ``"linear"``: :mod:`fedrl_algos.core.adaptation`;
        ``"critic"``: every agent's learned critic, ``critics``)
    :param curvature: ``"paper"``, ``"causal"`` or ``"lvc"`` (:data:`~fedrl_algos.core.curvature.CURVATURES`)
    :param outer_baseline: baseline of ĝ_out, as ``inner_baseline`` (it multiplies ``Ĥ``: a less
        noisy ĝ_out makes ``Ĥ ĝ_out`` less noisy too)
    :param curvature_clip: ``c`` of a trust region on the curvature term: ``αĤĝ_out`` is shortened to
        at most ``c‖ĝ_out‖`` where longer (:func:`~fedrl_algos.core.curvature.clip_curvature_term`;
        **biased** where it acts); ``None`` (default): eq. (7) as it stands
    :param critics: every agent's critic (:class:`~fedrl_algos.core.critic.CriticBaseline`, batch the
        rows of θ) where a baseline is ``"critic"``; the curvature batch does not use it
    """

    name = "exact"

    def __init__(
        self, policy, gamma: float, alpha: float | torch.Tensor, m_in: int, m_h: int, m_out: int, hvp_chunk: int = 100,
        inner_baseline: str | None = None,
        curvature: str = "paper",
        outer_baseline: str | None = None,
        curvature_clip: float | None = None,
        critics: CriticBaseline | None = None,
    ) -> None:
        super().__init__(policy, gamma, alpha, m_in, m_out, inner_baseline, outer_baseline, critics)
        self.m_h = check_int("m_h", m_h)
        self.hvp_chunk = check_int("hvp_chunk", hvp_chunk)
        self.curvature_estimator = check_curvature(curvature)
        self.curvature_clip = check_curvature_clip(curvature_clip)

    @property
    def trajectories_per_step(self) -> int:
        return self.m_in + self.m_h + self.m_out

    def __call__(self, sampler: SamplerFn, theta: torch.Tensor) -> torch.Tensor:
        g_out = self.outer_gradient(sampler, theta)
        if not isinstance(self.alpha, torch.Tensor) and self.alpha == 0.0:
            # The curvature term is multiplied by α: skip the Hessian batch's work, not its draws,
            # so the random streams advance exactly as for α > 0. (A tensor α computes the term for
            # every row; rows with α = 0 get g_out + 0·Ĥg_out, the same values.)
            sampler(theta, self.m_h)
            return g_out
        curvature = self.curvature(sampler, theta, g_out)
        return g_out + clip_curvature_term(scale(self.alpha, curvature), g_out, self.curvature_clip)

    def curvature(self, sampler: SamplerFn, theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``Ĥ v`` from a fresh batch of ``m_h`` trajectories at θ."""
        traj = sampler(theta, self.m_h)
        if self.curvature_estimator != "paper":
            return self._coupled_curvature(theta, traj, v)
        if self.m_h <= self.hvp_chunk:
            return hessian_vector_product(self.policy, theta, traj, v, self.gamma)
        total = torch.zeros_like(theta)
        m_axis = theta.dim() - 1
        for start in range(0, self.m_h, self.hvp_chunk):
            part = Trajectories(*(x.narrow(m_axis, start, min(self.hvp_chunk, self.m_h - start)) for x in traj))
            total = total + hessian_vector_product(self.policy, theta, part, v, self.gamma) * part.n_trajectories
        return total / self.m_h

    def _coupled_curvature(self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor) -> torch.Tensor:
        # The baseline couples the batch's trajectories: weights on the whole batch, then chunks.
        weights = curvature_weights(traj, self.gamma, self.curvature_estimator)
        if self.m_h <= self.hvp_chunk:
            return curvature_hvp(self.policy, theta, traj, v, weights, self.curvature_estimator)
        total = torch.zeros_like(theta)
        m_axis = theta.dim() - 1
        for start in range(0, self.m_h, self.hvp_chunk):
            size = min(self.hvp_chunk, self.m_h - start)
            part = Trajectories(*(x.narrow(m_axis, start, size) for x in traj))
            hv = curvature_hvp(self.policy, theta, part, v, weights.narrow(m_axis, start, size), self.curvature_estimator)
            total = total + hv * size
        return total / self.m_h


def per_fedavg_pg_round(
    federation: Federation,
    theta: torch.Tensor,
    estimator: GradientEstimator,
    step_size: float,
    local_steps: int,
    agents_per_round: int | None = None,
    on_reject: OnReject | None = None,
    control: ControlVariates | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One round of Algorithm 1 for every run: broadcast θ^k, ``τ`` local steps
    ``θ_i ← θ_i + β ∇̂F_i(θ_i)`` on fresh batches, average ``θ^{k+1} = (1/n) Σ_i θ_i``.

    With ``agents_per_round = r < n`` only the ``r`` sampled agents of each run are computed and
    averaged (:meth:`~fedrl_algos.core.federation.Federation.local_round`). With ``control``
    (SCAFFOLD) the local steps are ``θ_i ← θ_i + β (∇̂F_i(θ_i) + c − c_i)`` and the controls are
    updated in place (:mod:`fedrl_algos.core.control_variates`).

    :param federation: the batched federation (its samplers and random streams)
    :param theta: server parameters ``[R, d]``
    :param estimator: the local direction ∇̂F_i (:class:`ExactMetaGradient` or :class:`FirstOrderMetaGradient`)
    :param step_size: β, the local step size (> 0 with ``control``)
    :param local_steps: τ, the local steps per round
    :param agents_per_round: r, agents sampled without replacement per run (``None``: all)
    :param on_reject: called with the check of the agents' parameters when one is rejected (not
        finite, wrong shape or dtype; the server averages the others, and keeps θ when none is
        left); default: a :class:`~fedrl_algos.core.aggregation.RejectedUpdateWarning`
    :param control: SCAFFOLD's control variates ``c [R, d]``, ``c_i [R, n, d]`` (``None``: none)
    :return: the new server parameters ``[R, d]`` and the participation mask (``None``: all)
    """
    correction = None if control is None else control.correction()

    def steps(sampler: Any, start: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        direction = estimator if correction is None else CorrectedDirection(estimator, gather(correction))
        return local_update(direction, sampler, start, step_size, local_steps)

    if control is not None:
        control.check(theta, federation.n_agents, step_size * local_steps)
    local, mask = federation.local_round(theta, steps, agents_per_round, estimator.per_agent_state)
    new, check = aggregate_valid(local, theta, mask, on_reject=on_reject)
    if control is not None:
        control.update(local, theta, step_size * local_steps, participated(check, mask))
    return new, mask
