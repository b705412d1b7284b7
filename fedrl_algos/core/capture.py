"""Captured rollouts: a family's time step compiled as one program, replayed as a CUDA graph on a GPU.

An eager rollout (:func:`~fedrl_algos.core.sampling.generic_rollout`) runs each time step as a few
dozen small tensor operations launched from Python: on a GPU the device waits on the launches
(one step of 1e5 CartPoles takes microseconds of work and tens of microseconds of launching). A
captured rollout runs the same step — observe, the policy's sample from each row's counter-based
stream, the family's ``step`` — as **one compiled program** (``torch.compile(fullgraph=True)``: no
graph break, the random streams, the heterogeneous task parameters and the step accounting inside),
and on CUDA records ``chunk`` consecutive steps as **one CUDA graph** over static buffers, replayed
for every chunk of the horizon: one launch per ``chunk`` steps. This is what gymnax gives with a
``jit`` of ``lax.scan``.

What it returns is :func:`~fedrl_algos.core.sampling.generic_rollout`'s result: the same
trajectories, and the streams left where the eager rollout leaves them. Compiled arithmetic may
round differently from eager (fused operations, vectorized ``cos``/``sin``): with the ``aot_eager``
backend, which runs the same operations, the trajectories are bitwise eager's; with the default
``inductor`` backend the continuous values agree to float32 rounding and the discrete ones
(actions, termination flags) are identical on the tested rollouts (``tests/test_capture.py``).
``stop_when_done`` runs whole chunks and keeps the steps eager would run.

Compiling costs seconds per (family, policy, batch shape) and is kept for the process; torch's
own cache (``TORCHINDUCTOR_CACHE_DIR``) keeps the generated kernels across processes
(``docs/gpu.md``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.capture import CAPTURE, ChunkRunner, check_capture, resolve_capture
from fedrl_envs.family import TaskFamily
from fedrl_envs.params import repeat_params
from fedrl_envs.rng import RandomStreams

__all__ = ["CAPTURE", "check_capture", "resolve_capture", "CapturedRollout", "captured_rollout"]

#: steps per CUDA graph: a host check of "every episode ended" (``stop_when_done``) between chunks
DEFAULT_CHUNK = 32


def _one_step(family: TaskFamily, policy: Any, batch: tuple[int, ...], m: int, state: torch.Tensor, theta: torch.Tensor,
              keys: torch.Tensor, counters: torch.Tensor, rows: Any) -> tuple[torch.Tensor, ...]:
    """One time step of every row, as a pure function of tensors (the streams' counters in and out)."""
    streams = RandomStreams(keys)
    streams.counters = counters
    obs = family.observe(state, rows)
    obs_b = obs.reshape(*batch, m, *obs.shape[1:])
    action = policy.sample(theta, obs_b, streams)
    n = obs.shape[0]
    # ``step``, not ``fast_step``: the compiled loops of the CPU fast path are not traceable, and
    # ``fast_step`` is ``step`` bitwise by the family contract.
    next_state, reward, terminated = family.step(state, action.reshape(n, *action.shape[len(batch) + 1:]), rows)
    return next_state, obs_b, action, reward.reshape(*batch, m), terminated.reshape(*batch, m), streams.counters


class CapturedRollout:
    """The captured rollout of one (family, policy) pair: compiled steps, CUDA graphs on CUDA.

    :param family: the task family (its ``reset``/``observe``/``step`` kernels)
    :param policy: the flat policy (its ``sample``)
    :param backend: ``torch.compile``'s backend (``"inductor"``; ``"aot_eager"`` runs eager's
        operations, bitwise, for checks)
    :param chunk: steps per CUDA graph (and between two "all episodes ended" checks)
    """

    def __init__(self, family: TaskFamily, policy: Any, backend: str = "inductor", chunk: int = DEFAULT_CHUNK) -> None:
        self.family = family
        self.policy = policy
        self.backend = backend
        self.chunk = int(chunk)
        self._runners: dict[tuple[Any, ...], ChunkRunner] = {}
        self._rows: dict[tuple[int, int], tuple[Any, Any]] = {}
        #: set when compiling failed: :func:`captured_rollout` then leaves this pair to the eager rollout
        self.failed = False

    def rows_of(self, params: Any, m: int) -> Any:
        """``params`` repeated ``m`` times (one object per parameter object and ``m``, kept: the
        compiled step and its CUDA graphs are bound to it)."""
        cached = self._rows.get((id(params), m))
        if cached is None or cached[0] is not params:
            cached = (params, repeat_params(params, m))
            self._rows = {k: v for k, v in self._rows.items() if k[1] != m}
            self._rows[(id(params), m)] = cached
        return cached[1]

    def runner(self, batch: tuple[int, ...], m: int) -> ChunkRunner:
        """The compiled step for batch shape ``batch`` and ``m`` trajectories (compiled once, kept;
        the task parameters are an input, so new parameter objects of these shapes reuse it)."""
        key = (*batch, m)
        runner = self._runners.get(key)
        if runner is None:
            family, policy = self.family, self.policy

            def step(state: torch.Tensor, counters: torch.Tensor, theta: torch.Tensor, keys: torch.Tensor, rows: Any) -> Any:
                next_state, obs, action, reward, terminated, counters = _one_step(family, policy, batch, m, state, theta, keys, counters, rows)
                return next_state, counters, obs, action, reward, terminated

            runner = self._runners[key] = ChunkRunner(step, n_carry=2, backend=self.backend)
        return runner

    def __call__(self, params: Any, theta: torch.Tensor, streams: RandomStreams, m: int, horizon: int,
                 stop_when_done: bool = False) -> Trajectories:
        """:func:`~fedrl_algos.core.sampling.generic_rollout` (without a normalizer), captured."""
        with warnings.catch_warnings():
            # The families' constant tables (moves, hashing words) come from lru_cache'd builders of
            # their device alone; Dynamo traces the builder instead, which computes the same table.
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
            return self._rollout(params, theta, streams, m, horizon, stop_when_done)

    def _rollout(self, params: Any, theta: torch.Tensor, streams: RandomStreams, m: int, horizon: int,
                 stop_when_done: bool) -> Trajectories:
        family = self.family
        batch = tuple(theta.shape[:-1])
        n_rows = 1
        for b in batch:
            n_rows *= b
        rows = self.rows_of(params, m)
        noise = streams.uniform((m, family.reset_noise_dim))
        state = family.reset(rows, noise.reshape(n_rows * m, -1))
        runner = self.runner(batch, m)
        theta = theta.detach()
        steps = horizon + 1
        start_counters = counters = streams.counters
        records: list[tuple[torch.Tensor, ...]] = []
        alive = torch.ones(batch + (m,), dtype=torch.bool, device=theta.device)
        kept = steps  # the steps eager runs
        for start in range(0, steps, self.chunk):
            length = min(self.chunk, steps - start)
            (state, counters), chunk_records = runner.run((state, counters), (theta, streams.keys, rows), length)
            records.extend(chunk_records)
            if not stop_when_done:
                continue
            # Eager stops before step h > 0 once no episode is alive; whole chunks run here, and the
            # steps eager would not have taken are dropped. One host read per chunk: whether any
            # episode is alive after each of its steps.
            ended = torch.stack([r[3] for r in chunk_records])  # [length, *B, m]
            alive_after = alive & torch.cumprod(~ended, dim=0).bool()
            alive = alive_after[-1]
            some_alive = alive_after.reshape(length, -1).any(-1).tolist()
            gone = next((j for j, any_alive in enumerate(some_alive) if not any_alive), None)
            if gone is not None and start + gone + 1 < steps:
                kept = start + gone + 1  # eager's step after the last one with a live episode does not run
            if kept < steps:
                # The streams end where the full rollout leaves them: every step draws alike.
                ran = start + length
                counters = counters + (counters - start_counters) // ran * (steps - ran)
                break
        streams.counters = counters
        records = records[:kept]
        time_axis = len(batch) + 1
        obs, actions, rewards, terminated = (torch.stack([r[i] for r in records], dim=time_axis) for i in range(4))
        return Trajectories.from_steps(obs, actions, rewards, terminated, theta.dtype)


def captured_rollout(family: TaskFamily, params: Any, policy: Any, theta: torch.Tensor, streams: RandomStreams, m: int,
                     horizon: int, stop_when_done: bool = False, cache: dict[Any, CapturedRollout] | None = None,
                     backend: str = "inductor") -> Trajectories | None:
    """A captured rollout (``None`` when it cannot be compiled, after a warning: the caller runs eager).

    :param cache: where the (family, policy) pair's :class:`CapturedRollout` is kept between calls
    """
    cache = {} if cache is None else cache
    key = (id(family), id(policy), backend)
    runner = cache.get(key)
    if runner is None or runner.family is not family or runner.policy is not policy:
        runner = cache[key] = CapturedRollout(family, policy, backend)
    if runner.failed:
        return None
    before = streams.counters
    try:
        return runner(params, theta, streams, m, horizon, stop_when_done)
    except Exception as err:  # noqa: BLE001  (any compiler failure: fall back to the eager rollout)
        streams.counters = before  # nothing drawn: the eager rollout draws the same numbers
        runner.failed = True
        warnings.warn(f"capture: {type(family).__name__} with {type(policy).__name__} could not be captured "
                      f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); the eager rollout runs instead",
                      stacklevel=3)
        return None
