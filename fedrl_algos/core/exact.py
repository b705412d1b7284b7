"""Exact evaluation of tabular softmax policies: returns, gradients, HVPs and the meta-objective.

For a tabular family (one that exposes its exact model: a next-state table or a transition tensor,
a reward vector and a start distribution) the per-agent objective of the Per-FedAvg-PG paper,

    J_i(θ) = E[Σ_{h=0..H} γ^h r_i(s_h)],   π(a|s) = softmax(θ[s, :]),

is computed exactly by finite-horizon dynamic programming in float64 torch, and every derivative is
taken by autograd through that program: ∇J_i, ∇²J_i v, the adapted parameters θ + α∇J_i(θ), the
meta-objective F(θ) = (1/n) Σ_i J_i(θ + α∇J_i(θ)) and its gradient. All agents are evaluated in one
batched program, and θ may carry any leading batch dimensions ``[*B]`` (runs, seeds, step sizes).

See ``docs/exact.md`` for the recursion, the shape conventions and an example.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from fedrl_envs import get_family, stack_params
from fedrl_envs.family import TaskFamily
from fedrl_envs.threads import intra_op_threads

__all__ = ["TabularEvaluator", "has_exact_model"]

_T = TypeVar("_T")


def _single_threaded(method: Callable[..., _T]) -> Callable[..., _T]:
    """Run ``method`` with one intra-op CPU thread, restoring the caller's setting afterwards.

    The dynamic program is a chain of microsecond ops on small tensors, which intra-op parallelism
    cannot speed up; on shared cores a second thread instead stalls every parallel op (softmax, exp)
    for a scheduler time slice. Measured on the 2-core container under load from other processes:
    ``returns`` of one θ 0.11 ms with one thread against 8-12 ms with two, and ``meta_grad`` of
    1600 θ at once 1.5 s against 6.0 s.
    """

    @functools.wraps(method)
    def wrapper(self: TabularEvaluator, *args: Any, **kwargs: Any) -> _T:
        with intra_op_threads(1 if self.device.type == "cpu" else None):
            return method(self, *args, **kwargs)

    return wrapper


def has_exact_model(family: Any) -> bool:
    """Whether ``family`` exposes the exact tabular model that :class:`TabularEvaluator` plans with:
    ``start_distribution``, ``reward_vector``, ``horizon`` and ``next_state_table`` or ``transition_tensor``.

    The one place that decides whether a family is tabular (the algorithms log exact objectives
    for those families and Monte Carlo estimates for the others).

    :param family: a task family
    """
    has = {
        name: callable(getattr(family, name, None))
        for name in ("start_distribution", "reward_vector", "next_state_table", "transition_tensor", "horizon")
    }
    return has["start_distribution"] and has["reward_vector"] and has["horizon"] and (has["next_state_table"] or has["transition_tensor"])


class TabularEvaluator:
    """Exact returns, policy gradients, Hessian-vector products and meta-objective of a federation.

    The policy is the tabular softmax π(a|s) = softmax(θ[s, :]) with θ ∈ R^{S×A}, given either as
    ``[*B, S, A]`` or flat row-major as ``[*B, S*A]`` (θ[s*A + a]); ``*B`` is any number of leading
    batch dimensions (possibly none). Every method computes in float64 on ``device`` and returns
    float64 tensors; tensor results that carry a parameter axis use the *layout of the θ passed
    in* (``[..., S, A]`` or ``[..., S*A]``), written ``L`` below.

    ==============================  ===============================================  ==================
    method                          value                                            shape
    ==============================  ===============================================  ==================
    ``returns(θ)``                  J_i(θ)                                           ``[*B, n]``
    ``grads(θ)``                    ∇J_i(θ)                                          ``[*B, n, *L]``
    ``hvps(θ, v)``                  ∇²J_i(θ) v (``v`` shared ``[*B, *L]`` or         ``[*B, n, *L]``
                                    per agent ``[*B, n, *L]``)
    ``adapted_params(θ, α)``        θ + α∇J_i(θ)                                     ``[*B, n, *L]``
    ``meta_objective_per_agent``    (F_i(θ), J_i(θ)), F_i = J_i(θ + α∇J_i(θ))        ``[*B, n]`` each
    ``meta_objective(θ, α)``        (F(θ), f(θ)) = means over agents                 ``[*B]`` each
    ``meta_grads_per_agent(θ, α)``  ∇F_i(θ) = (I + α∇²J_i(θ)) ∇J_i(θ + α∇J_i(θ))     ``[*B, n, *L]``
    ``meta_grad(θ, α)``             ∇F(θ) = mean_i ∇F_i(θ)                           ``[*B, *L]``
    ==============================  ===============================================  ==================

    ``α`` is a non-negative float or a tensor broadcastable to ``[*B]`` (one step size per batch
    entry, e.g. an α-sweep evaluated in one call). ``returns`` is differentiable with respect to a θ
    that requires grad; every other method returns detached tensors. The methods work under
    ``torch.no_grad()`` and ``torch.inference_mode()``.

    :param env_id_or_family: a registered id (``"fedrl/GridWorld-v0"``) or a family object that
        exposes its exact model: ``start_distribution``, ``reward_vector`` (``[..., S]`` for a reward
        r(s) of the state acted in, or ``[..., S, A]`` for r(s, a)) and either ``next_state_table``
        (deterministic dynamics, fastest) or ``transition_tensor`` (``[..., S, A, S]``).
    :param gamma: discount factor in [0, 1] (the paper uses 0.9)
    :param agents: indices into the family's training tasks; ``None`` (default) means all of them,
        in order. Mutually exclusive with ``tasks``.
    :param tasks: any task parameters of the family (e.g. ``family.heldout_tasks``), one agent each;
        they must share every non-tensor field (grid size, horizon)
    :param device: torch device the model lives on and results are returned on
    """

    def __init__(
        self,
        env_id_or_family: str | TaskFamily = "fedrl/GridWorld-v0",
        gamma: float = 0.9,
        agents: Sequence[int] | None = None,
        tasks: Sequence[Any] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.family = self._resolve_family(env_id_or_family)
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device must be a torch device or its name, got {device!r}") from err
        self.tasks = self._resolve_tasks(agents, tasks)
        # Model tensors are built outside inference mode so that autograd may save them later.
        with torch.inference_mode(False), torch.no_grad():
            self._build_model()

    # --- construction ----------------------------------------------------------------------------
    @staticmethod
    def _resolve_family(env_id_or_family: Any) -> TaskFamily:
        if isinstance(env_id_or_family, str):
            try:
                family = get_family(env_id_or_family)
            except ValueError as err:
                raise ValueError(f"env_id_or_family: {err}") from None
        else:
            family = env_id_or_family
        if not has_exact_model(family):
            name = getattr(family, "env_id", type(family).__name__)
            raise ValueError(
                "env_id_or_family must be a tabular family exposing its exact model (start_distribution, "
                f"reward_vector, next_state_table or transition_tensor, horizon); {name!r} does not"
            )
        return family

    def _resolve_tasks(self, agents: Sequence[int] | None, tasks: Sequence[Any] | None) -> list[Any]:
        if agents is not None and tasks is not None:
            raise ValueError("pass either agents (indices of training tasks) or tasks, not both")
        if tasks is not None:
            if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or len(tasks) == 0:
                raise ValueError(f"tasks must be a non-empty sequence of task parameters, got {tasks!r}")
            kind = type(self.family.train_tasks[0])
            for k, task in enumerate(tasks):
                if not isinstance(task, kind):
                    raise ValueError(f"tasks[{k}] must be a {kind.__name__}, got {type(task).__name__}")
            return list(tasks)
        train = list(self.family.train_tasks)
        if agents is None:
            return train
        if isinstance(agents, torch.Tensor):
            agents = agents.tolist()
        try:
            agents = [] if isinstance(agents, (str, bytes)) else list(agents)
        except TypeError:
            agents = []
        if len(agents) == 0:
            raise ValueError("agents must be a non-empty sequence of training-task indices")
        chosen = []
        for k in agents:
            try:
                if isinstance(k, bool):
                    raise TypeError
                k = operator.index(k)
            except TypeError:
                raise ValueError(f"agents must hold ints, got {k!r}") from None
            if not 0 <= k < len(train):
                raise ValueError(f"agents must index the {len(train)} training tasks (0..{len(train) - 1}), got {k}")
            chosen.append(train[k])
        return chosen

    def _build_model(self) -> None:
        try:
            params = stack_params(self.tasks)
        except (ValueError, TypeError) as err:
            raise ValueError(f"tasks: {err}") from None
        family, dev = self.family, self.device
        self.params = params
        self.horizon = int(family.horizon(params))
        if self.horizon < 0:
            raise ValueError(f"env_id_or_family: horizon must be >= 0, got {self.horizon}")
        mu = family.start_distribution(params).to(dev, torch.float64)
        reward = family.reward_vector(params).to(dev, torch.float64)
        if mu.ndim != 2:
            raise ValueError(f"env_id_or_family: start_distribution has shape {tuple(mu.shape)}, expected [n, S]")
        n, s = mu.shape
        self.n_agents, self.n_states = n, s
        if callable(getattr(family, "next_state_table", None)):
            table = family.next_state_table(params).to(dev, torch.int64)
            if table.shape[:2] != (n, s) or table.ndim != 3:
                raise ValueError(
                    f"env_id_or_family: next_state_table has shape {tuple(table.shape)}, expected [{n}, {s}, A]"
                )
            self.n_actions = table.shape[-1]
            self._next = table.reshape(n, 1, s * self.n_actions)  # gather index over s'
            self._trans_t = None
        else:
            trans = family.transition_tensor(params).to(dev, torch.float64)
            if trans.ndim != 4 or trans.shape[:2] != (n, s) or trans.shape[-1] != s:
                raise ValueError(
                    f"env_id_or_family: transition_tensor has shape {tuple(trans.shape)}, expected [{n}, {s}, A, {s}]"
                )
            self.n_actions = trans.shape[2]
            self._next = None
            self._trans_t = trans.reshape(n, s * self.n_actions, s).transpose(-1, -2).contiguous()  # [n, S', S*A]
        if reward.shape not in ((n, s), (n, s, self.n_actions)):
            raise ValueError(
                f"env_id_or_family: reward_vector has shape {tuple(reward.shape)}, expected [{n}, {s}] or [{n}, {s}, A]"
            )
        self._mu = mu.unsqueeze(1)  # [n, 1, S]
        self._reward = reward.unsqueeze(1)  # [n, 1, S] or [n, 1, S, A]

    # --- public descriptors ----------------------------------------------------------------------
    @property
    def dim(self) -> int:
        """Number of policy parameters ``S * A``."""
        return self.n_states * self.n_actions

    @property
    def start_distribution(self) -> torch.Tensor:
        """μ_i(s), ``[n, S]``."""
        return self._mu.squeeze(1)

    @property
    def rewards(self) -> torch.Tensor:
        """r_i(s) ``[n, S]`` (or r_i(s, a) ``[n, S, A]``)."""
        return self._reward.squeeze(1)

    def __repr__(self) -> str:
        name = getattr(self.family, "env_id", type(self.family).__name__)
        return (
            f"TabularEvaluator({name!r}, n_agents={self.n_agents}, n_states={self.n_states}, "
            f"n_actions={self.n_actions}, horizon={self.horizon}, gamma={self.gamma})"
        )

    # --- the dynamic program ---------------------------------------------------------------------
    def _returns_core(self, logits: torch.Tensor) -> torch.Tensor:
        """J for agent-major logits ``[k, M, S, A]`` (k = 1 shared by all agents, or k = n): ``[n, M]``.

        Backward (value) recursion V_H = r, V_h(s) = r(s) + γ Σ_a π(a|s) V_{h+1}(s'(s, a)),
        J = μ·V_0; the deterministic case reads V_{h+1}(s') with one gather per step.
        """
        n, m, s, a = self.n_agents, logits.shape[1], self.n_states, self.n_actions
        pi = torch.softmax(logits, dim=-1)
        reward = self._reward
        rew = reward if reward.ndim == 3 else (pi * reward).sum(-1)  # expected r(s) under π
        gamma_pi = pi * self.gamma
        values = rew.expand(n, m, s)
        index = None if self._next is None else self._next.expand(n, m, s * a)
        for _ in range(self.horizon):
            if index is not None:
                following = values.gather(-1, index)
            else:
                following = values @ self._trans_t
            values = rew + (gamma_pi * following.view(n, m, s, a)).sum(-1)
        return (values * self._mu).sum(-1)

    # --- argument handling -----------------------------------------------------------------------
    def _theta(self, theta: Any) -> tuple[torch.Tensor, torch.Size, bool]:
        """θ as float64 ``[M, S, A]`` on the device, its batch shape, and whether it was flat."""
        t = theta if isinstance(theta, torch.Tensor) else torch.as_tensor(theta)
        s, a = self.n_states, self.n_actions
        if t.ndim >= 2 and tuple(t.shape[-2:]) == (s, a):
            batch, flat = t.shape[:-2], False
        elif t.ndim >= 1 and t.shape[-1] == s * a:
            batch, flat = t.shape[:-1], True
        else:
            raise ValueError(f"theta must have shape [*B, {s}, {a}] or [*B, {s * a}], got {tuple(t.shape)}")
        if t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"theta must hold real numbers, got dtype {t.dtype}")
        t = t.to(device=self.device, dtype=torch.float64)
        return t.reshape(-1, s, a), batch, flat

    def _alpha(self, alpha: Any, batch: torch.Size) -> float | torch.Tensor:
        """α as a float or a float64 tensor ``[1, M, 1, 1]`` (agent-major broadcast shape)."""
        if isinstance(alpha, bool):
            raise ValueError(f"alpha must be a non-negative number or tensor, got {alpha!r}")
        if isinstance(alpha, numbers.Real):
            if not (math.isfinite(alpha) and alpha >= 0):
                raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
            return float(alpha)
        t = alpha if isinstance(alpha, torch.Tensor) else torch.as_tensor(alpha)
        if t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"alpha must hold real numbers, got dtype {t.dtype}")
        t = t.detach().to(device=self.device, dtype=torch.float64)
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError("alpha must be finite and >= 0")
        try:
            ok = torch.broadcast_shapes(t.shape, batch) == batch
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"alpha must be a number or broadcastable to the batch shape {tuple(batch)}, got shape {tuple(t.shape)}"
            )
        return t.expand(batch).reshape(1, -1, 1, 1)

    def _per_agent_out(self, x: torch.Tensor, batch: torch.Size, flat: bool) -> torch.Tensor:
        """Agent-major ``[n, M, S, A]`` → ``[*B, n, *L]``."""
        layout = (self.dim,) if flat else (self.n_states, self.n_actions)
        return x.detach().transpose(0, 1).reshape(*batch, self.n_agents, *layout)

    def _copies(self, theta: torch.Tensor) -> torch.Tensor:
        """One leaf copy of θ per agent, agent-major ``[n, M, S, A]``, so ∂J_i lands in row i."""
        return theta.detach().unsqueeze(0).expand(self.n_agents, *theta.shape).clone().requires_grad_(True)

    # --- public API --------------------------------------------------------------------------------
    @_single_threaded
    def returns(self, theta: Any) -> torch.Tensor:
        """J_i(θ) for every agent, shape ``[*B, n]`` (differentiable with respect to θ)."""
        t, batch, _ = self._theta(theta)
        return self._returns_core(t.unsqueeze(0)).transpose(0, 1).reshape(*batch, self.n_agents)

    @_single_threaded
    def grads(self, theta: Any) -> torch.Tensor:
        """∇J_i(θ), shape ``[*B, n, S, A]`` (``[*B, n, S*A]`` for a flat θ)."""
        t, batch, flat = self._theta(theta)
        with torch.inference_mode(False), torch.enable_grad():
            x = self._copies(t)
            (g,) = torch.autograd.grad(self._returns_core(x).sum(), x)
        return self._per_agent_out(g, batch, flat)

    @_single_threaded
    def hvps(self, theta: Any, v: Any) -> torch.Tensor:
        """∇²J_i(θ) v, shape ``[*B, n, *L]``.

        :param v: a direction shared by all agents, broadcastable to θ's shape, or one per agent,
            broadcastable to ``[*B, n, *L]`` (same layout as θ)
        """
        t, batch, flat = self._theta(theta)
        layout = (self.dim,) if flat else (self.n_states, self.n_actions)
        vt = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
        shared = vt.ndim <= len(batch) + len(layout)
        target = (*batch, *layout) if shared else (*batch, self.n_agents, *layout)
        try:
            vt = torch.broadcast_to(vt.detach().to(self.device, torch.float64), target)
        except RuntimeError:
            raise ValueError(
                f"v must be broadcastable to {tuple((*batch, *layout))} (shared) or "
                f"{tuple((*batch, self.n_agents, *layout))} (per agent), got {tuple(vt.shape)}"
            ) from None
        m = t.shape[0]
        if shared:
            vt = vt.reshape(1, m, self.n_states, self.n_actions)
        else:
            vt = vt.reshape(m, self.n_agents, self.n_states, self.n_actions).transpose(0, 1)
        with torch.inference_mode(False), torch.enable_grad():
            x = self._copies(t)
            (g,) = torch.autograd.grad(self._returns_core(x).sum(), x, create_graph=True)
            (hv,) = torch.autograd.grad(g, x, grad_outputs=vt.expand_as(g))
        return self._per_agent_out(hv, batch, flat)

    @_single_threaded
    def adapted_params(self, theta: Any, alpha: Any) -> torch.Tensor:
        """θ_i⁺ = θ + α∇J_i(θ), shape ``[*B, n, *L]``."""
        t, batch, flat = self._theta(theta)
        a = self._alpha(alpha, batch)
        with torch.inference_mode(False), torch.enable_grad():
            x = self._copies(t)
            (g,) = torch.autograd.grad(self._returns_core(x).sum(), x)
        return self._per_agent_out(x.detach() + a * g, batch, flat)

    @_single_threaded
    def meta_objective_per_agent(self, theta: Any, alpha: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(F_i(θ), J_i(θ)) with F_i(θ) = J_i(θ + α∇J_i(θ)); each ``[*B, n]``."""
        t, batch, _ = self._theta(theta)
        a = self._alpha(alpha, batch)
        with torch.inference_mode(False), torch.enable_grad():
            x = self._copies(t)
            before = self._returns_core(x)
            (g,) = torch.autograd.grad(before.sum(), x)
        with torch.no_grad():
            after = self._returns_core(x.detach() + a * g)
        shape = (*batch, self.n_agents)
        return after.transpose(0, 1).reshape(shape), before.detach().transpose(0, 1).reshape(shape)

    def meta_objective(self, theta: Any, alpha: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(F(θ), f(θ)): post- and pre-adaptation returns averaged over agents, each ``[*B]`` — the
        meta-objective of eq. (5), ``F(θ) = (1/n) Σ_i J_i(θ + α∇J_i(θ))``, exactly."""
        after, before = self.meta_objective_per_agent(theta, alpha)
        return after.mean(-1), before.mean(-1)

    @_single_threaded
    def _meta_core(
        self, theta: Any, alpha: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Size, bool]]:
        """Agent-major F_i ``[n, M]``, J_i ``[n, M]`` and ∇F_i ``[n, M, S, A]``, plus batch and layout."""
        t, batch, flat = self._theta(theta)
        a = self._alpha(alpha, batch)
        with torch.inference_mode(False), torch.enable_grad():
            x = self._copies(t)
            before = self._returns_core(x)
            (g,) = torch.autograd.grad(before.sum(), x, create_graph=True)
            after = self._returns_core(x + a * g)
            # d/dθ J_i(θ + α∇J_i(θ)) = (I + α∇²J_i(θ)) ∇J_i(θ⁺), by double backward through g.
            (meta,) = torch.autograd.grad(after.sum(), x)
        return after.detach(), before.detach(), meta, (batch, flat)

    def meta_grads_per_agent(self, theta: Any, alpha: Any) -> torch.Tensor:
        """∇F_i(θ) = (I + α∇²J_i(θ)) ∇J_i(θ + α∇J_i(θ)), shape ``[*B, n, *L]``."""
        _, _, meta, (batch, flat) = self._meta_core(theta, alpha)
        return self._per_agent_out(meta, batch, flat)

    def meta_grad(self, theta: Any, alpha: Any) -> torch.Tensor:
        """∇F(θ) = (1/n) Σ_i ∇F_i(θ), the shape of θ."""
        return self.meta_objective_and_grad(theta, alpha)[2]

    def meta_objective_and_grad(self, theta: Any, alpha: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(F(θ), f(θ), ∇F(θ)) from one program: ``[*B]``, ``[*B]`` and the shape of θ — ∇F is eq. (6),
        ``(1/n) Σ_i (I + α∇²J_i(θ)) ∇J_i(θ + α∇J_i(θ))``, by autograd through the exact returns."""
        after, before, meta, (batch, flat) = self._meta_core(theta, alpha)
        layout = (self.dim,) if flat else (self.n_states, self.n_actions)
        grad = meta.mean(0).reshape(*batch, *layout)
        return after.mean(0).reshape(batch), before.mean(0).reshape(batch), grad
