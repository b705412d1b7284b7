"""The native batched environment: ``n_agents × n_envs`` copies of a family stepping together on a torch device.

Time limits and autoreset live here, in one place, not in the kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from fedrl_envs.family import TaskFamily
from fedrl_envs.ops import numpy_batch
from fedrl_envs.params import (
    _gather_params,
    _tensor_fields,
    components_layout,
    fresh_observation,
    index_params,
    params_to,
    repeat_params,
    stack_params,
)
from fedrl_envs.rng import (
    _GOLDEN,
    RandomStreams,
    derive_keys,
    seed_from_entropy,
    uniform32_of_finalizer_input,
    uniform32_of_finalizer_input_numpy,
)
from fedrl_envs.threads import with_fitted_threads
from fedrl_envs.validation import (
    MAX_ENVS,
    _as_state_tensor,
    _reset_mask,
    _signed_actions,
    check_array_type,
    check_device,
    check_int,
    check_kernels,
    check_seed,
)


def _vector_env_work(env: Any, *args: Any, **kwargs: Any) -> tuple[int, int, torch.device]:
    """The work of a vector env call: ``num_envs`` rows of elementwise kernels on the env's device.

    A fused step (``kernels="numba"``) is one serial compiled pass around two vectorized torch
    calls (``cos``, ``sin``); a second thread would speed those up by a few percent of the step on a
    quiet machine and stall them on a busy one, so it runs on one thread at any size."""
    return (1 if env.kernels == "numba" else env.num_envs), 1, env.device


#: a vector env method run with the intra-op threads fitted to its batch (:mod:`fedrl_envs.threads`)
fitted_to_envs = with_fitted_threads(_vector_env_work)


class FamilyVectorEnv(VectorEnv):
    """Native batched environment: ``n_agents × n_envs`` copies of a family on a torch device.

    Row ``i * n_envs + j`` is agent ``i``'s environment ``j`` (agent-major). Every agent has its
    own task parameters and its own random stream, so an agent's trajectories depend neither on
    the other agents nor on where the batch runs. Observations, rewards and flags are torch
    tensors on ``device`` (``array_type="torch"``) or NumPy arrays (``array_type="numpy"``:
    observations in the observation space's dtype, rewards ``float32``, flags ``bool``, infos
    NumPy too), and never views of the internal state; the kernels run on ``device`` either way.
    Actions may be torch tensors or NumPy arrays in both. Autoreset is ``SAME_STEP``:
    when an episode ends, the returned observation is already the first of the next episode and
    ``info["final_obs"]`` (a tensor like the observations, meaningful where the mask
    ``info["_final_obs"]`` is true) holds the last observation of the finished one;
    ``info["final_info"]`` is ``{}`` (the kernels return no info) with mask ``info["_final_info"]``.
    An agent's stream advances only when one of its own episodes ends.

    This is also the ``vector_entry_point`` of every registered family, where all environments
    share one task (``gym.make_vec(id, num_envs=N)``, the native env being ``make_vec``'s default
    mode for these ids); that route returns NumPy arrays by default, as Gymnasium's vector envs do
    (``array_type="torch"`` for tensors; :meth:`from_gym_kwargs`), while the class itself and
    ``FederatedVecEnv`` default to torch.

    :param family: the task family
    :param tasks: per-agent task parameters: a list, stacked parameters, or one task's parameters
    :param n_envs: environments per agent (1 to ``MAX_ENVS`` = 2**24)
    :param device: torch device of the whole batch
    :param seed: seed of the agents' random streams (drawn at random when ``None``); agent ``i``'s
        stream is keyed by ``(seed, i)``, so the single env seeded alike draws agent 0's
    :param autoreset: ``False`` gives the fixed-horizon mode (``AutoresetMode.DISABLED``): no
        reset until :meth:`reset`, and steps after the last one continue from the final states
        with ``truncated`` still true; ``reset(options={"reset_mask": mask})`` resets only the
        rows of ``mask``, as in Gymnasium's vector envs
    :param array_type: ``"torch"`` (tensors on ``device``) or ``"numpy"`` (NumPy arrays, for
        NumPy libraries such as Gymnasium's vector wrappers)
    :param kernels: ``"auto"`` (default): ``"numba"`` where it applies (a family with a fused step on
        the CPU, Numba installed), else ``"torch"``; the attribute ``kernels`` holds the choice.
        ``"torch"``: the family's step kernel runs on torch tensors; ``"numpy"``: on the CPU, for a family with NumPy kernels, it runs on NumPy views of the same
        memory (NumPy operations cost about half of torch's), with bitwise the same transitions for
        the gridworld and arc navigation and, for CartPole and Pendulum, transitions one float32 ulp
        apart wherever NumPy and torch round ``sin``/``cos`` differently (about 5% of arguments);
        starts, resets and the random streams are the same in both; ``"numba"``: on the CPU, for a
        family with a fused step (CartPole), each step is one compiled pass (:mod:`fedrl_envs.fused`,
        Numba needed) with bitwise the torch path's values
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        family: TaskFamily,
        tasks: Sequence[Any] | Any,
        n_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        autoreset: bool = True,
        array_type: str = "torch",
        kernels: str = "auto",
    ) -> None:
        n_envs = check_int("n_envs", n_envs, 1, MAX_ENVS)
        seed = check_seed(seed)
        self.array_type = check_array_type(array_type)
        self.family = family
        self.device = check_device(device)
        self.kernels = check_kernels(kernels, family, self.device)
        if isinstance(tasks, Sequence):
            agent_params = stack_params(list(tasks))
        elif _is_single_task(family, tasks):
            agent_params = stack_params([tasks])  # one task's parameters: one agent
        else:
            agent_params = tasks
        self.agent_params = params_to(agent_params, self.device)
        self.n_agents = int(getattr(self.agent_params, _tensor_fields(self.agent_params)[0]).shape[0])
        self.n_envs = int(n_envs)
        self.num_envs = self.n_agents * self.n_envs
        self.params = repeat_params(self.agent_params, self.n_envs)
        one_task = index_params(self.agent_params, 0)
        self.single_observation_space = family.observation_space(one_task)
        self.single_action_space = family.action_space(one_task)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.horizon = family.horizon(one_task)
        self.autoreset = autoreset
        self.metadata = dict(self.metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP if autoreset else AutoresetMode.DISABLED
        self.render_mode = None
        self.closed = False
        self._seed = seed
        self.streams = self._make_streams(seed)
        self._state: torch.Tensor | None = None
        self._t = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """``SAME_STEP`` (``autoreset=True``) or ``DISABLED`` (the fixed-horizon mode), as ``metadata["autoreset_mode"]``."""
        return self.metadata["autoreset_mode"]

    def _make_streams(self, seed: int | None) -> RandomStreams:
        if seed is None:
            seed = seed_from_entropy()
        return RandomStreams(derive_keys(seed, torch.arange(self.n_agents)), self.device)

    # --- helpers -------------------------------------------------------------------------------
    def structured(self, batch: torch.Tensor) -> torch.Tensor:
        """View a flat batch ``[num_envs, ...]`` as ``[n_agents, n_envs, ...]`` (no copy)."""
        return batch.reshape(self.n_agents, self.n_envs, *batch.shape[1:])

    def _draw_reset_states(self, agents: torch.Tensor | None = None) -> torch.Tensor:
        """Fresh initial states for every row; only the streams of ``agents`` (bool ``[n_agents]``) advance.

        All rows are drawn in one call, but an agent whose episodes all continue keeps its counter,
        so its future numbers never depend on when other agents' episodes end.
        """
        counters = self.streams.counters
        noise = self.streams.uniform((self.n_envs, self.family.reset_noise_dim))
        if agents is not None:
            self.streams.counters = torch.where(agents, self.streams.counters, counters)
        return self._laid_out(self.family.reset(self.params, noise.reshape(self.num_envs, -1)))

    def _laid_out(self, state: torch.Tensor) -> torch.Tensor:
        """``state`` in the layout the family's kernels run fastest on (see ``TaskFamily.state_as_components``)."""
        return components_layout(state) if self.family.state_as_components else state

    def _draw_reset_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Initial states of the flat rows ``rows`` only, with the numbers :meth:`_draw_reset_states` gives them.

        Row ``i * n_envs + j`` takes words ``j * d .. j * d + d - 1`` (``d = reset_noise_dim``) of
        agent ``i``'s stream, as in the full draw, and every agent with a row in ``rows`` then
        advances by the full draw's ``n_envs * d`` words; so the streams, and every later number,
        are those of drawing the whole batch. Returns the states and the rows' task parameters.
        """
        row_agent, bases = self._reset_word_bases()
        # (index_select: half the cost of advanced indexing for these gathers, the same values)
        agent = row_agent.index_select(0, rows)
        # Word k of row r hashes key + (counter + offset) * golden; modulo 2**64 that is
        # (key + offset * golden) + counter * golden, and the first term is fixed per row.
        words = bases.index_select(0, rows) + (self.streams.counters * _GOLDEN).index_select(0, agent).unsqueeze(1)
        noise = uniform32_of_finalizer_input(words)
        step = torch.zeros_like(self.streams.counters).index_fill_(0, agent, self.n_envs * self.family.reset_noise_dim)
        self.streams.counters = self.streams.counters + step
        params = _gather_params(self.params, rows) if self.family.reset_reads_params else None
        return self.family.reset(params, noise), params

    def _reset_word_bases(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's agent ``[num_envs]`` and its reset words' fixed part ``[num_envs, d]``.

        The fixed part is the finalizer's input less the counter's share: ``key + offset * golden``
        plus the finalizer's own first addend (see :func:`fedrl_envs.rng.uniform32_of_finalizer_input`).

        Rebuilt whenever the streams' keys change (a new seed, loaded stream state).
        """
        keys = self.streams.keys
        cached = getattr(self, "_word_bases", None)
        if cached is None or cached[0] is not keys or cached[1] != keys._version:
            dim = self.family.reset_noise_dim
            row_agent = torch.arange(self.n_agents, device=self.device).repeat_interleave(self.n_envs)
            offsets = torch.arange(self.n_envs * dim, device=self.device).reshape(self.n_envs, dim).repeat(self.n_agents, 1)
            cached = (keys, keys._version, row_agent, keys.reshape(-1)[row_agent].unsqueeze(1) + (offsets + 1) * _GOLDEN)
            self._word_bases = cached
        return cached[2], cached[3]

    def _kernel_step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The family's step kernel on torch tensors, or on NumPy views of them (``kernels="numpy"``)."""
        if self.kernels != "numpy":  # the fused step has the torch kernel's values
            return self.family.step(state, action, self.params)
        params = self._numpy_kernel_params()
        with numpy_batch():
            out = self.family.step(state.numpy(), action.numpy(), params)
        return tuple(torch.from_numpy(np.asarray(x)) for x in out)  # type: ignore[return-value]

    def _numpy_kernel_params(self) -> Any:
        """The batch's task parameters as NumPy views (the tensors are never written in place)."""
        params = getattr(self, "_numpy_params", None)
        if params is None:
            params = dataclasses.replace(self.params, **{n: getattr(self.params, n).numpy() for n in _tensor_fields(self.params)})
            self._numpy_params = params
        return params

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        """Observations that never alias the internal state (callers may write into them), C-contiguous."""
        obs = self.family.observe(state, self.params)
        if obs.dim() == 2 and obs.shape[1] > 1 and obs.stride() == (1, obs.shape[0]):
            # Components laid out as [d, N] (see TaskFamily.state_as_components): a gather through
            # a cached permutation writes the row-major copy three times faster than torch's
            # transposing copy (which costs more than the rest of a CartPole step at 10^5 envs).
            n, d = obs.shape
            perm = getattr(self, "_row_major_perm", None)
            if perm is None or perm.numel() != n * d or perm.device != obs.device:
                perm = torch.arange(n * d, device=obs.device).reshape(d, n).T.reshape(-1)
                self._row_major_perm = perm
            return obs.movedim(-1, 0).reshape(-1).index_select(0, perm).view(n, d)
        return fresh_observation(obs, state)

    def _export(self, x: torch.Tensor, dtype: Any = None) -> Any:
        """A returned tensor in the caller's array type (NumPy: on the CPU, in ``dtype`` if given)."""
        if self.array_type == "torch":
            return x
        out = x.detach().cpu().numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def _export_obs(self, obs: torch.Tensor) -> Any:
        return self._export(obs, self.single_observation_space.dtype)

    def _export_info(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.array_type == "torch":
            return info
        out: dict[str, Any] = {}
        for key, value in info.items():
            if isinstance(value, dict):
                out[key] = self._export_info(value)
            elif key == "final_obs" and isinstance(value, torch.Tensor):
                out[key] = self._export_obs(value)
            else:
                out[key] = self._export(value) if isinstance(value, torch.Tensor) else value
        return out

    def _export_step(
        self, obs: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, info: dict[str, Any]
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self.array_type == "torch":
            return obs, reward, terminated, truncated, info
        return (
            self._export_obs(obs),
            self._export(reward, np.float32),
            self._export(terminated, np.bool_),
            self._export(truncated, np.bool_),
            self._export_info(info),
        )

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("this environment is closed; create a new one instead of stepping it")

    def _as_action_tensor(self, actions: Any) -> torch.Tensor:
        if isinstance(actions, torch.Tensor):
            if actions.device.type == "meta":  # no data to copy (torch would raise NotImplementedError)
                raise ValueError("actions must hold data: got a tensor on the meta device")
            action_t = actions.to(self.device)
        else:
            arr = np.asarray(actions)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"actions must be a numeric array or tensor, got {type(actions).__name__} of dtype {arr.dtype}")
            action_t = torch.as_tensor(arr, device=self.device)
        action_t = _signed_actions(action_t, "actions")
        expected = (self.num_envs, *self.single_action_space.shape)
        if tuple(action_t.shape) != expected:
            raise ValueError(f"actions must have shape {expected} (num_envs, *action_shape), got {tuple(action_t.shape)}")
        self.family.validate_action(action_t, self.params)
        return action_t

    @property
    def state(self) -> torch.Tensor:
        """Current flat kernel state ``[num_envs, ...]``."""
        if self._state is None:
            raise RuntimeError("call reset() before reading the state")
        return self._state

    @fitted_to_envs
    def set_state(self, state: Any, t: torch.Tensor | int = 0) -> Any:
        """Put every environment into ``state`` (flat batch) at time index ``t``; returns observations.

        :param state: kernel states ``[num_envs, ...]`` (validated, copied, never clipped)
        :param t: time index of every environment, an int or an int tensor ``[num_envs]``
        """
        self._check_open()
        template = self.family.reset(self.params, torch.zeros(self.num_envs, self.family.reset_noise_dim, device=self.device))
        state_t = _as_state_tensor(state, template, "state")
        t_t = t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t))
        if t_t.is_floating_point() or t_t.dtype == torch.bool:
            raise TypeError(f"t must be an int or an integer tensor, got dtype {t_t.dtype}")
        if t_t.dim() > 1 or (t_t.dim() == 1 and t_t.shape[0] != self.num_envs):
            raise ValueError(f"t must be an int or have shape ({self.num_envs},), got shape {tuple(t_t.shape)}")
        if bool((t_t < 0).any()):
            raise ValueError(f"t must be >= 0, got minimum {int(t_t.min())}")
        self.family.validate_state(state_t, self.params)
        self._state = self._laid_out(state_t)
        self._t = t_t.to(self.device, torch.int64).expand(self.num_envs).clone()
        return self._export_obs(self._observe(self._state))

    # --- VectorEnv API -------------------------------------------------------------------------
    @fitted_to_envs
    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every environment; ``seed`` (an int) re-keys the agents' streams.

        ``options={"reset_mask": mask}`` (bool ``[num_envs]``) resets only the rows of ``mask``;
        only the streams of agents with a reset row advance.
        """
        obs, info = self._reset_tensors(seed, options)
        return self._export_obs(obs), info

    def _reset_tensors(
        self, seed: int | list[int] | None, options: dict[str, Any] | None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        self._check_open()
        if isinstance(seed, list | tuple):
            if len(set(seed)) != 1:
                raise ValueError("seed must be one int for the whole batch (each agent derives its own stream)")
            seed = seed[0]
        seed = check_seed(seed)
        mask = _reset_mask(options, self.num_envs)
        if mask is not None and mask.all():
            mask = None  # every row: a plain reset
        if mask is not None and self._state is None:
            raise RuntimeError("call reset() without a reset_mask before resetting some environments only")
        if seed is not None:
            self.streams = self._make_streams(seed)
            self._seed = seed
            # VectorEnv.np_random, as Gymnasium's reset(seed=) seeds it (the dynamics never draw from it)
            self._np_random, self._np_random_seed = seeding.np_random(seed % 2**64)
        if mask is None:
            self._state = self._draw_reset_states()
            self._t.zero_()
        else:
            rows = torch.from_numpy(mask).to(self.device)
            fresh = self._draw_reset_states(agents=self.structured(rows).any(1))
            self._state = torch.where(rows.reshape(rows.shape + (1,) * (fresh.dim() - 1)), fresh, self._state)
            self._t = torch.where(rows, 0, self._t)
        return self._observe(self._state), {}

    @fitted_to_envs
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step all environments; see the class docstring for autoreset and info keys."""
        return self._export_step(*self._step_tensors(actions))

    def _step_tensors(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._check_open()
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if self.kernels == "numba":
            return self._step_fused(actions)
        action_t = self._as_action_tensor(actions)
        next_state, reward, terminated = self._kernel_step(self._state, action_t)
        t = self._t + 1
        if self.horizon is None:
            truncated = torch.zeros_like(terminated)
        else:
            truncated = t >= self.horizon + 1
        obs = self._observe(next_state)
        info: dict[str, Any] = {}
        if self.autoreset:
            done = terminated | truncated
            # One synchronizing call per step; resets are drawn only when some episode ended.
            rows = done.nonzero().squeeze(1)
            if rows.numel():
                info["final_obs"] = obs
                info["_final_obs"] = done
                info["final_info"] = {}
                info["_final_info"] = done
                t.masked_fill_(done, 0)
                if rows.numel() == self.num_envs:
                    # Every episode ended (a time limit reached by all at once): the full draw
                    # gives these very numbers without gathering anything.
                    next_state = self._draw_reset_states()
                    obs = self._observe(next_state)
                else:
                    # Only the rows that reset are drawn, reset and observed (a few per step), not
                    # the batch; the kernel's output is written in place unless it is the old state.
                    fresh, fresh_obs = self._fresh_rows(rows)
                    if next_state.data_ptr() == self._state.data_ptr():
                        next_state = next_state.clone()
                    next_state.index_copy_(0, rows, fresh.to(next_state.dtype))
                    obs = obs.index_copy(0, rows, fresh_obs.to(obs.dtype))
        self._state = next_state
        self._t = t
        return obs, reward, terminated, truncated, info

    def functional_autoreset_step(
        self, state: torch.Tensor, t: torch.Tensor, counters: torch.Tensor, action: torch.Tensor,
        row_agent: torch.Tensor, bases: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """:meth:`step` with autoreset as a pure function of tensors, without a data-dependent branch
        (what a compiled, captured rollout runs; ``fedrl_envs.capture``): the same numbers as
        :meth:`step`. Every row's reset is computed from the words :meth:`_draw_reset_rows` would hash
        for it and kept where its episode ended; every agent with an ended row advances its stream
        by the full draw, as the eager step does.

        :param state: the laid-out kernel state; ``t``: time indices; ``counters``: the streams'
        :param action: valid actions ``[num_envs, ...]`` (not checked here)
        :param row_agent: each row's agent; ``bases``: its reset words' fixed part (:meth:`_reset_word_bases`)
        :return: next state, time indices, counters and observation (a reset row's first), then the
            step's reward, terminated and truncated flags
        """
        family, params = self.family, self.params
        next_state, reward, terminated = family.step(state, action, params)
        t = t + 1
        truncated = torch.zeros_like(terminated) if self.horizon is None else t >= self.horizon + 1
        done = terminated | truncated
        words = bases + (counters * _GOLDEN).index_select(0, row_agent).unsqueeze(1)
        fresh = self._laid_out(family.reset(params, uniform32_of_finalizer_input(words)))
        rows = done.reshape(done.shape + (1,) * (next_state.dim() - 1))
        next_state = torch.where(rows, fresh.to(next_state.dtype), next_state)
        obs = family.observe(next_state, params)
        draw = self.n_envs * family.reset_noise_dim
        counters = counters + done.reshape(self.n_agents, self.n_envs).any(-1).to(counters.dtype) * draw
        return next_state, torch.where(done, torch.zeros_like(t), t), counters, obs, reward, terminated, truncated

    def _step_fused(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """:meth:`_step_tensors` through the family's fused step (``kernels="numba"``): the same values.

        One compiled call (:mod:`fedrl_envs.fused`) runs the transition, the observations, the time
        limit, the list of ended rows and their resets; it writes only new arrays and a copy of the
        stream counters, so a rejected action leaves the environment as it was.
        """
        action = self._fused_actions(actions)
        state = self._state.T.numpy()  # the components [d, N] (state_as_components layout)
        n, d = self.num_envs, state.shape[0]
        packed = self.family.fused_params(self.params)  # packed once, kept on the parameters
        row_agent, bases = self._reset_word_bases()
        counters = self.streams.counters.numpy().view(np.uint64).copy()
        space = self.single_action_space
        next_state = np.empty_like(state)
        obs, final_obs = np.empty((n, d), np.float32), np.empty((n, d), np.float32)
        reward, terminated = np.empty(n, np.float32), np.empty(n, np.bool_)
        truncated, done = np.empty(n, np.bool_), np.empty(n, np.bool_)
        next_t, rows = np.empty(n, np.int64), np.empty(n, np.int64)
        noise = np.empty((n, self.family.reset_noise_dim), np.float32)
        n_done, n_bad = self.family.fused_step(
            state, action, packed, self._t.numpy(), -1 if self.horizon is None else self.horizon, self.autoreset,
            int(space.start), int(space.start + space.n - 1), row_agent.numpy(), bases.numpy().view(np.uint64),
            counters, np.uint64(_GOLDEN % 2**64), np.uint64(self.n_envs * self.family.reset_noise_dim),
            next_state, obs, final_obs, reward, terminated, truncated, done, next_t, rows, noise)
        if n_bad:
            self.family.validate_action(torch.from_numpy(action), self.params)  # raises, naming the action
        info: dict[str, Any] = {}
        if self.autoreset and n_done:
            done_t = torch.from_numpy(done)
            info = {"final_obs": torch.from_numpy(final_obs), "_final_obs": done_t, "final_info": {}, "_final_info": done_t}
            self.streams.counters = torch.from_numpy(counters.view(np.int64))
        self._state = torch.from_numpy(next_state).T
        self._t = torch.from_numpy(next_t)
        return torch.from_numpy(obs), torch.from_numpy(reward), torch.from_numpy(terminated), torch.from_numpy(truncated), info

    def _fused_actions(self, actions: Any) -> np.ndarray:
        """The actions as int64 NumPy ``[num_envs]`` for a fused step: plain integer arrays and CPU
        tensors directly, everything else through :meth:`_as_action_tensor`'s checks and errors."""
        if isinstance(actions, torch.Tensor) and actions.device.type == "cpu" and not actions.requires_grad:
            array = actions.numpy()
        elif isinstance(actions, np.ndarray):
            array = actions
        else:
            array = None
        if array is None or array.shape != (self.num_envs,) or array.dtype.kind not in "iu" or (
                array.dtype.kind == "u" and array.dtype.itemsize > 1):
            return self._as_action_tensor(actions).numpy().astype(np.int64, copy=False)
        return array.astype(np.int64, copy=False)

    def _fresh_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Initial states and observations of the rows ``rows`` (advancing the streams), drawn by the
        torch code or, with ``kernels="numpy"``, by its NumPy twin (the same bits)."""
        if self.kernels == "numpy":
            fresh, fresh_obs = self._draw_reset_rows_numpy(rows.numpy())
            return torch.from_numpy(np.asarray(fresh)), torch.from_numpy(np.asarray(fresh_obs))
        fresh, params = self._draw_reset_rows(rows)
        return fresh, self.family.observe(fresh, params)

    def _draw_reset_rows_numpy(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_draw_reset_rows` on NumPy: the rows' initial states and observations; advances the streams."""
        row_agent, bases = self._reset_word_bases()
        agent = row_agent.numpy()[rows]
        counters = self.streams.counters.numpy()
        golden = np.uint64(_GOLDEN % 2**64)
        words = bases.numpy().view(np.uint64)[rows] + (counters.view(np.uint64) * golden)[agent][:, None]
        noise = uniform32_of_finalizer_input_numpy(words)
        step = np.zeros_like(counters)
        step[agent] = self.n_envs * self.family.reset_noise_dim
        self.streams.counters = torch.from_numpy(counters + step)
        params = self._numpy_kernel_params()
        row_params = (
            dataclasses.replace(params, **{n: np.take(getattr(params, n), rows, axis=0) for n in _tensor_fields(self.params)})
            if self.family.reset_reads_params
            else None
        )
        with numpy_batch():
            fresh = self.family.reset(row_params, noise)
            return fresh, self.family.observe(fresh, row_params)

    def close_extras(self, **kwargs: Any) -> None:
        self._state = None

    @classmethod
    def from_gym_kwargs(
        cls,
        family: TaskFamily,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        autoreset: bool = True,
        render_mode: str | None = None,
        array_type: str = "numpy",
        kernels: str = "auto",
        **task_kwargs: Any,
    ) -> FamilyVectorEnv:
        """The ``vector_entry_point``: ``num_envs`` copies of one task given by ``gym.make`` kwargs.

        ``gym.make_vec`` follows Gymnasium's convention of NumPy in and out (``array_type="numpy"``,
        the default here), so that Gymnasium's NumPy vector wrappers (``RecordEpisodeStatistics``,
        ``NormalizeReward``, ...) take its output as it is; ``array_type="torch"`` returns torch
        tensors on ``device`` (the default of the class and of ``FederatedVecEnv``). With
        ``device="cuda"``, pass ``array_type="torch"``: NumPy results are copied to the host every step.

        :param family: the task family
        :param num_envs: number of environments (all on the same task)
        :param device: torch device of the batch
        :param seed: seed of the random stream
        :param autoreset: ``False`` for the fixed-horizon mode
        :param render_mode: must be ``None`` (the native vector env does not render)
        :param array_type: ``"numpy"`` (default) or ``"torch"``: what the env returns
        :param kernels: ``"auto"`` (default), ``"torch"``, ``"numpy"`` or ``"numba"``: what the step
            kernel runs on (see the class)
        :param task_kwargs: the task's ``gym.make`` keyword arguments
        """
        num_envs = check_int("num_envs", num_envs, 1)
        if render_mode is not None:
            raise ValueError(
                f"render_mode must be None for the native vector env (it does not render), got {render_mode!r}; "
                'use vectorization_mode="sync" to render single environments'
            )
        return cls(
            family,
            [family.make_params(**task_kwargs)],
            n_envs=num_envs,
            device=device,
            seed=seed,
            autoreset=autoreset,
            array_type=array_type,
            kernels=kernels,
        )


def _is_single_task(family: TaskFamily, params: Any) -> bool:
    """Whether ``params`` are one task's (unstacked) parameters, judged against the family's first task."""
    reference = family.train_tasks[0]
    if type(params) is not type(reference):
        raise TypeError(f"tasks must be parameters of {type(reference).__name__} or a sequence of them, got {type(params).__name__}")
    name = _tensor_fields(reference)[0]
    return getattr(params, name).dim() == getattr(reference, name).dim()
