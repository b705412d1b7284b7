"""The tabular softmax policy ``π(a|s) = softmax(θ[s, :])`` with its closed forms and fast rollout.

Everything a tabular softmax can do faster than the generic code lives next to its parametrization:

* **Closed-form estimators** (:meth:`TabularPolicy.score_gradient`, :meth:`TabularPolicy.hvp`):
  ``∇log π(a|s) = e_{s,a} − π(·|s)``, so the sums over samples of the policy gradient and of the
  paper's curvature estimate reduce to per-(state, action) sums (one ``index_add_``) plus a few
  ``[rows, S, A]`` table operations: the same estimates as autograd, in O(samples + S·A) work.
* **Probability tables** (:meth:`TabularPolicy.probs_table`): ``softmax(θ[s, :])`` depends only on
  the state, so it is computed once on the ``[*B, S, A]`` table (PyTorch's CPU softmax costs
  ~0.05–0.1 µs per row at A = 4, so a softmax over every sample was the most expensive operation of
  a local step). The policy keeps the tables of the last few θ tensors it saw (identity and
  in-place version checked), so the rollout and the estimates that share one θ compute it once.
* **Tabulated rollouts** (:meth:`TabularPolicy.kernel_rollout_plan`): on a family whose
  observation is its integer state, the family's transitions are **tabulated from its own kernel**
  (``family.step`` once on every ``(state, action)`` pair of every task row; a kernel takes no
  noise, so the table *is* the kernel), the inverse CDF is computed once per rollout, and all random
  numbers of the rollout are drawn in one call with exactly the counter layout of the step-by-step
  draws. A time step is then four operations on ``[rows·m]`` tensors, and the result is **bitwise
  identical** to the generic rollout (``tests/test_reproduce_tabular.py`` checks it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces

from fedrl_algos.core.curvature import coupled_score_weights
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies.base import CategoricalMixin, FlatPolicy
from fedrl_algos.policies.kernel_choice import check_policy_kernels
from fedrl_algos.policies.tabular_compiled import (
    compiled_softmax,
    compiled_softmax_applies,
    compiled_walk,
    compiled_walk_applies,
)
from fedrl_envs.family import TaskFamily, alive_mask
from fedrl_envs.params import repeat_params
from fedrl_envs.rng import RandomStreams

__all__ = ["TabularPolicy", "TabulatedModel", "TabulatedRollout", "tabulate", "tabular_rollout"]

#: θ tensors whose probability tables a policy keeps (a local step uses about three)
PROBS_CACHE_SIZE = 4


class TabularPolicy(CategoricalMixin, FlatPolicy):
    """Per-state softmax ``π(a|s) = softmax(θ[s, :])`` for ``Discrete`` observations and actions.

    ``kernels="numba"`` walks the tabulated rollouts' time loop as one compiled loop and computes
    the probability tables by a compiled softmax (:mod:`.tabular_compiled`; float32 parameters on
    the CPU): the same trajectories and tables bit for bit, about 2× faster rollouts and 4× faster
    tables at the gridworld experiments' batches; ``"auto"`` (the default) is ``"numba"`` where Numba
    is installed. Elsewhere (CUDA, float64, gradients through θ) torch's loop and softmax run.

    :param observation_space: ``Discrete(S)``
    :param action_space: ``Discrete(A)``
    :param dtype: parameter dtype
    :param kernels: ``"auto"`` (default), ``"torch"`` or ``"numba"``
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, dtype: torch.dtype = torch.float32,
                 kernels: str = "auto") -> None:
        if not isinstance(observation_space, spaces.Discrete) or not isinstance(action_space, spaces.Discrete):
            raise ValueError(
                f"policy TabularPolicy needs Discrete observation and action spaces, got {observation_space} and {action_space}"
            )
        self.kernels = check_policy_kernels(kernels)
        self.n_states = int(observation_space.n)
        self.n_actions = int(action_space.n)
        super().__init__(observation_space, action_space, dtype)
        self._probs_cache: list[tuple[weakref.ref, int, torch.Tensor]] = []

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        if self.kernels != "auto":  # only when set: files of the default policy name no kernels
            data.update(kernels=self.kernels)
        return data

    @property
    def n_params(self) -> int:
        return self.n_states * self.n_actions

    def initial_parameters(self) -> torch.Tensor:
        return torch.zeros(self.n_params, dtype=self.param_dtype)

    def logits(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        table = theta.reshape(*theta.shape[:-1], self.n_states, self.n_actions)
        batch = theta.shape[:-1]
        idx = obs.long().reshape(*batch, -1, 1).expand(*batch, -1, self.n_actions)
        out = torch.gather(table, -2, idx)
        return out.reshape(*obs.shape, self.n_actions)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_probs_cache"] = []  # weak references do not pickle; the tables are recomputed
        return state

    # --- closed forms ----------------------------------------------------------------------------
    def probs_table(self, theta: torch.Tensor) -> torch.Tensor:
        """``softmax(θ[s, :])`` for every state: ``[*B, S, A]`` (bitwise equal to the per-sample softmax).

        Kept for the last :data:`PROBS_CACHE_SIZE` θ tensors by identity and in-place version
        (never for a θ that requires grad), so the rollout and the estimates that share one θ
        compute it once. With ``kernels="numba"`` a compiled loop computes it, ~5× faster than
        ``torch.softmax`` at A = 4 and bitwise equal (:func:`.tabular_compiled.compiled_softmax`).
        """
        shape = (*theta.shape[:-1], self.n_states, self.n_actions)
        if theta.requires_grad:
            return torch.softmax(theta.reshape(shape), dim=-1)
        version = theta._version
        for ref, ver, probs in self._probs_cache:
            if ref() is theta and ver == version:
                return probs
        if compiled_softmax_applies(self, theta, self.n_actions):
            probs = compiled_softmax(theta.reshape(shape))
        else:
            probs = torch.softmax(theta.reshape(shape), dim=-1)
        if len(self._probs_cache) >= PROBS_CACHE_SIZE:
            self._probs_cache.pop(0)
        self._probs_cache.append((weakref.ref(theta), version, probs))
        return probs

    def _index(self, theta: torch.Tensor, traj: Trajectories) -> tuple[torch.Size, int, torch.Tensor, torch.Tensor]:
        """``(batch, rows, pos, key)``: every sample's state row ``pos = row·S + s_h`` and cell ``key = pos·A + a_h``.

        They index the flattened ``[rows·S]`` and ``[rows·S·A]`` tables, so the closed forms are
        1-D gathers and ``index_add_`` sums over samples plus a few ``[rows, S, A]`` table operations.
        """
        batch = theta.shape[:-1]
        n_rows = batch.numel()
        offsets = torch.arange(n_rows, device=theta.device).unsqueeze(-1) * self.n_states
        pos = (traj.obs.long().reshape(n_rows, -1) + offsets).reshape(-1)
        key = torch.add(traj.actions.long().reshape(-1), pos, alpha=self.n_actions)
        return batch, n_rows, pos, key

    def score_gradient(self, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor) -> torch.Tensor:
        """Closed form of :meth:`FlatPolicy.score_gradient`: ``∇log π(a|s) = e_{s,a} − π(·|s)``.

        With ``W[s, a] = Σ_{(ξ,h): s_h=s, a_h=a} ψ_h`` (one ``index_add_`` over the samples) and
        ``W_s = Σ_a W[s, a]``, the sum ``Σ_{ξ,h} ψ_h (e_{s_h,a_h} − π(·|s_h))`` is ``W − W_s π(·|s)``:
        the same estimate as summing the per-sample terms, in O(samples + S·A) work.
        """
        batch, n_rows, _, key = self._index(theta, traj)
        s, a = self.n_states, self.n_actions
        w = torch.zeros(n_rows * s * a, dtype=weights.dtype, device=theta.device)
        w = w.index_add_(0, key, weights.reshape(-1)).view(n_rows, s, a)
        probs = self.probs_table(theta).reshape(n_rows, s, a)
        grad = w - w.sum(-1, keepdim=True) * probs
        return grad.reshape(*batch, s * a) / traj.n_trajectories

    def hvp(self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Closed form of :meth:`FlatPolicy.hvp`.

        With ``π_s = π(·|s)``: ``∇log π(a|s)ᵀv = v[s,a] − π_s·v_s`` and
        ``∇²log π(a|s) v = −(π_s ⊙ v_s − π_s (π_s·v_s))`` on row ``s`` (independent of ``a``). With
        ``c_ξ = Σ_h (v[s_h,a_h] − π_{s_h}·v_{s_h})`` the per-sample weight ``ψ_h c_ξ`` multiplies the
        score ``e_{s,a} − π_s`` and ``ψ_h`` multiplies the second term, so, as in
        :meth:`score_gradient`, both sums over samples reduce to per-(s, a) sums: with
        ``U[s, a] = Σ ψ_h c_ξ`` and ``W[s, a] = Σ ψ_h`` over the samples in cell (s, a), the estimate is
        ``U − U_s π_s − W_s π_s ⊙ (v_s − π_s·v_s)``.
        """
        return self.curvature_hvp(theta, traj, v, weights, "paper")

    def curvature_hvp(
        self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor, coupling: str
    ) -> torch.Tensor:
        """Closed form of :meth:`FlatPolicy.curvature_hvp`: :meth:`hvp` with ``U[s, a] = Σ ω_h`` over the
        samples in cell (s, a), ``ω`` from the per-step ``∇log π(a_h|s_h)ᵀv`` by ``coupling``."""
        batch, n_rows, pos, key = self._index(theta, traj)
        s, a = self.n_states, self.n_actions
        probs = self.probs_table(theta).reshape(n_rows, s, a)
        v_tab = v.to(theta.dtype).expand_as(theta).reshape(n_rows, s, a)
        pv = (probs * v_tab).sum(-1, keepdim=True)  # π_s·v_s, [rows, S, 1]
        score_dot_v = v_tab.reshape(-1).index_select(0, key) - pv.reshape(-1).index_select(0, pos)
        omega = coupled_score_weights(score_dot_v.view(traj.mask.shape) * traj.mask, weights, coupling)
        both = torch.stack([omega, weights]).reshape(2, -1)  # per-sample weights U, W
        cells = torch.zeros(2, n_rows * s * a, dtype=both.dtype, device=theta.device)
        cells = cells.index_add_(1, key, both).view(2, n_rows, s, a)
        u, w = cells[0], cells[1]
        hv = u - u.sum(-1, keepdim=True) * probs - w.sum(-1, keepdim=True) * probs * (v_tab - pv)
        return hv.reshape(*batch, s * a) / traj.n_trajectories

    def kernel_rollout_plan(self, family: Any, params: Any) -> TabulatedRollout | None:
        """The tabulated rollout when it applies to ``(family, params)``, else ``None``.

        It applies to a family with ``Discrete`` observations and actions matching the policy, whose
        observation is its state (the default ``observe``) and whose kernel maps cells ``0..S-1``
        to cells.
        """
        if type(family).observe is not TaskFamily.observe:
            return None
        try:
            obs_space, act_space = family.observation_space(params), family.action_space(params)
        except (TypeError, ValueError, AttributeError, IndexError, RuntimeError):
            return None  # a family whose spaces need one task's parameters: the generic path handles it
        if not (
            isinstance(obs_space, spaces.Discrete)
            and isinstance(act_space, spaces.Discrete)
            and int(obs_space.start) == 0
            and int(act_space.start) == 0
            and int(obs_space.n) == self.n_states
            and int(act_space.n) == self.n_actions
        ):
            return None
        model = tabulate(family, params, self.n_states, self.n_actions)
        return None if model is None else TabulatedRollout(family, params, self, model)


@dataclass
class TabulatedRollout:
    """The plan :meth:`TabularPolicy.kernel_rollout_plan` returns: :func:`tabular_rollout` on a fixed model.

    :param family: task family
    :param params: task rows the model was tabulated on
    :param policy: the tabular policy
    :param model: the tabulated kernel
    """

    family: TaskFamily
    params: Any
    policy: TabularPolicy
    model: TabulatedModel

    def __call__(
        self, theta: torch.Tensor, streams: RandomStreams, n_trajectories: int, horizon: int, stop_when_done: bool
    ) -> Trajectories | None:
        """The rollout, or ``None`` where the plan does not apply (another row count, or early
        stopping with terminal transitions: the generic rollout handles those)."""
        if self.model.n_rows != theta.shape[:-1].numel() or (stop_when_done and self.model.any_terminal):
            return None
        return tabular_rollout(self.family, self.params, self.policy, theta, streams, n_trajectories, horizon, self.model)




@dataclass
class TabulatedModel:
    """A family's kernel on every ``(row, state, action)``, flat at ``(row * S + s) * A + a``.

    :param next_pos: next state as a global position ``row * S + s'`` (int64)
    :param reward: reward of the transition (the kernel's dtype)
    :param terminated: termination flag of the transition (bool)
    :param any_terminal: whether any transition terminates (if not, masks are all ones)
    :param state_of: the state ``s`` of each flat key; :param action_of: its action ``a``
    :param n_rows: task rows; :param n_states: S; :param n_actions: A
    """

    next_pos: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    any_terminal: bool
    state_of: torch.Tensor
    action_of: torch.Tensor
    n_rows: int
    n_states: int
    n_actions: int


def tabulate(family: TaskFamily, params: Any, n_states: int, n_actions: int) -> TabulatedModel | None:
    """Run ``family.step`` once on every ``(state, action)`` pair of every row of ``params``.

    :return: the tabulated model, or ``None`` when the kernel's states are not the integer cells
        ``0..S-1`` (then the generic rollout must be used)
    """
    first = next(v for v in vars(params).values() if isinstance(v, torch.Tensor))
    n_rows, device = int(first.shape[0]), first.device
    pairs = n_states * n_actions
    states = torch.arange(n_states, device=device).repeat_interleave(n_actions).repeat(n_rows)
    actions = torch.arange(n_actions, device=device).repeat(n_states * n_rows)
    next_state, reward, terminated = family.step(states, actions, repeat_params(params, pairs))
    if next_state.shape != states.shape or next_state.is_floating_point() or next_state.dtype == torch.bool:
        return None
    if bool((next_state < 0).any()) or bool((next_state >= n_states).any()):
        return None
    base = torch.arange(n_rows, device=device).repeat_interleave(pairs) * n_states
    terminated = terminated.reshape(-1).to(torch.bool)
    return TabulatedModel(
        next_pos=(next_state.to(torch.int64) + base).contiguous(),
        reward=reward.reshape(-1).contiguous(),
        terminated=terminated.contiguous(),
        any_terminal=bool(terminated.any()),
        state_of=states,
        action_of=actions,
        n_rows=n_rows,
        n_states=n_states,
        n_actions=n_actions,
    )


def _draw_uniforms(streams: RandomStreams, n_first: int, n_second: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``streams.uniform((n_first,))`` (float32) then ``streams.uniform((n_second,), dtype)`` in one draw.

    Same 64-bit words and the same word → float rules as :meth:`RandomStreams.uniform` (53 high bits
    for float64, 24 for float32); other dtypes fall back to two calls.
    """
    if dtype not in (torch.float32, torch.float64):
        return streams.uniform((n_first,)), streams.uniform((n_second,), dtype=dtype)
    words = streams.bits((n_first + n_second,))
    first, second = words[..., :n_first], words[..., n_first:]
    return _words_to_uniform(first, torch.float32), _words_to_uniform(second, dtype)


def _words_to_uniform(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float64:
        return ((words >> 11) & ((1 << 53) - 1)).to(torch.float64) * (2.0**-53)
    return ((words >> 40) & ((1 << 24) - 1)).to(torch.float32) * (2.0**-24)


def tabular_rollout(
    family: TaskFamily,
    params: Any,
    policy: Any,
    theta: torch.Tensor,
    streams: RandomStreams,
    n_trajectories: int,
    horizon: int,
    model: TabulatedModel,
):
    """:func:`~fedrl_algos.core.sampling.rollout` through the tabulated model (same result, bitwise).

    Arguments as for ``rollout`` (already validated there); ``model`` from :func:`tabulate`.
    """
    m, steps = int(n_trajectories), int(horizon) + 1
    s, a, n_rows = model.n_states, model.n_actions, model.n_rows
    n, dtype, device = n_rows * m, theta.dtype, theta.device
    compiled = compiled_walk_applies(policy, theta, streams)
    # Random numbers in the generic order: reset noise (float32, RandomStreams.uniform's default),
    # then m uniforms of θ's dtype per step (drawn as one [T, m] block: the same counters; the
    # compiled loop hashes each where it uses it).
    if compiled:
        noise = streams.uniform((m * family.reset_noise_dim,))
    else:
        noise, u = _draw_uniforms(streams, m * family.reset_noise_dim, steps * m, dtype)
    state = family.reset(repeat_params(params, m), noise.reshape(n, -1))
    pos = state.to(torch.int64) + torch.arange(n_rows, device=device).repeat_interleave(m) * s
    # Inverse CDF per state; the last column is dropped: (cdf < u).sum() clamped to A - 1 equals
    # the count over the first A - 1 columns because a cumulative sum never decreases.
    cdf = policy.probs_table(theta).reshape(n_rows * s, a).cumsum(-1)[:, : a - 1]
    if compiled:
        key, obs, actions, rewards = compiled_walk(cdf, model.next_pos, model.reward.to(dtype), pos, streams, m, steps, s, a,
                                                   with_keys=model.any_terminal)
        obs = obs.to(state.dtype)
    else:
        # Column-major ([A - 1, rows·S]) so that the per-step gather, comparison and count run
        # along contiguous sample rows (2.4× faster than on [samples, A - 1]; the same integers).
        cdf = cdf.t().contiguous()
        u = u.reshape(n_rows, steps, m).transpose(0, 1).reshape(steps, 1, n)
        keys = []
        for t in range(steps):
            action = (cdf.index_select(1, pos) < u[t]).sum(0)
            key = torch.add(action, pos, alpha=a)  # (row · S + s) · A + a
            keys.append(key)
            pos = model.next_pos.index_select(0, key)
        key = torch.stack(keys, dim=1)  # [n, T]
        flat = key.reshape(-1)
        actions = model.action_of.index_select(0, flat).view(key.shape)
        obs = model.state_of.index_select(0, flat).view(key.shape).to(state.dtype)
        rewards = model.reward.index_select(0, flat).view(key.shape).to(dtype)
    if model.any_terminal:
        mask = alive_mask(model.terminated.index_select(0, key.reshape(-1)).view(key.shape)).to(dtype)
        rewards = rewards * mask
    else:
        mask = torch.ones(rewards.shape, dtype=dtype, device=device)  # × a mask of ones: rewards unchanged
    shape = (*theta.shape[:-1], m, steps)
    return Trajectories(obs=obs.reshape(shape), actions=actions.reshape(shape), rewards=rewards.reshape(shape), mask=mask.reshape(shape))
