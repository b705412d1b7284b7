"""``fedrl bench envs``: the federated vectorized environment's steps/s against NumPy and Gymnasium.

:func:`bench_envs` measures the federated vectorized environment; the other targets are the other
modules of :mod:`fedrl_algos.bench`.

How the numbers are made (also printed under the table):

* **native steps/s**: environment steps per second of :class:`fedrl_wrappers.FederatedVecEnv` with
  ``n_agents × n_envs`` environments, autoreset on, action checks on, stepping with random actions
  drawn before the clock starts (a block of 16 steps' worth, cycled);
* **NumPy vector steps/s**: the strongest baseline, the same MDPs hand-vectorized in NumPy the way
  Gymnasium's ``CartPoleVectorEnv`` is written (:mod:`fedrl_algos.bench.numpy_vector`: a
  next-cell table for the gridworld, in-place updates, per-agent goals, ``SAME_STEP`` autoreset
  drawing starts for the ended rows only), at the same ``n_agents × n_envs`` and on the same
  random actions (as NumPy arrays); Gymnasium, gymnax and EnvPool have no version of these families;
* **SyncVectorEnv steps/s**: ``gymnasium.vector.SyncVectorEnv`` over ``gym.make`` single envs of
  the same tasks, same random actions. It is timed at ``n_agents × min(n_envs, sync_max_envs)``
  envs only (its cost is linear in the number of envs, so its steps/s hardly depends on the size);
  larger sizes are compared with the largest size timed, which the table marks;
* the three step rates are timed alike (:func:`fedrl_algos.bench.vector._rate`): steps in blocks of
  about 20 ms for ``min_time`` seconds, the fastest block kept, so that on cores shared with other
  processes the figure is the least disturbed one rather than a measure of the scheduler;
* **peak MB**: growth of the process's peak resident memory while the env is built, reset and
  stepped 2 episodes plus the timing: on Linux, freed heap is first returned to the OS
  (``malloc_trim``) and ``VmHWM`` is reset through ``/proc/self/clear_refs``, then ``VmHWM`` minus
  the resident size before is reported (``ru_maxrss`` growth elsewhere, a lower bound);
  ``torch.cuda.max_memory_allocated`` growth on CUDA. The pre-drawn actions are allocated before
  and not counted. **env MB** is the exact size of the tensors the env keeps between steps;
* **rollout steps/s**: whole fixed-horizon episodes collected by :meth:`FederatedVecEnv.rollout`
  with a policy sampling every action in the loop: a tabular softmax (logits ``[n_agents, S, A]``
  gathered by observation) on the gridworld, the paper's 2 → 32 tanh → 8 MLP (360 parameters per
  agent) on arc navigation; actions are drawn by inverse CDF from per-agent counter-based streams.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from fedrl_algos.bench._policies import _mlp_policy, _tabular_policy
from fedrl_algos.bench.vector import _rate
from fedrl_algos.cli.args import finish_bench, positive_int, set_threads

__all__ = ["EnvBenchRecord", "bench_envs", "add_envs_target"]

_FAMILIES = ("fedrl/GridWorld-v0", "fedrl/ArcNavigation-v0")
_ACTION_BLOCK = 16


@dataclasses.dataclass
class EnvBenchRecord:
    """One row of ``fedrl bench envs``."""

    env_id: str
    n_agents: int
    n_envs: int
    device: str
    #: environment steps per second of the native federated env (pre-drawn random actions)
    native_steps_per_s: float
    #: steps per second of SyncVectorEnv over single envs, timed at ``sync_n_envs`` envs per agent
    sync_steps_per_s: float | None
    sync_n_envs: int | None
    #: native / sync
    ratio: float | None
    #: steps per second of the hand-vectorized NumPy env (:mod:`fedrl_algos.bench.numpy_vector`), same envs
    numpy_vector_steps_per_s: float
    #: native / numpy_vector
    numpy_vector_ratio: float
    #: peak memory growth while building, resetting and stepping the env (see module docstring)
    peak_mb: float | None
    #: bytes of the tensors the env holds between steps
    env_mb: float
    #: environment steps per second of fixed-horizon rollouts with a policy in the loop
    rollout_steps_per_s: float
    policy: str
    memory_method: str


# --- measurement helpers -------------------------------------------------------------------------
def _release_free_heap() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``), so that reuse does not hide growth."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _PeakMemory:
    """Peak memory growth of a block: VmHWM reset (Linux), ru_maxrss otherwise, or CUDA's allocator."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.method = "cuda max_memory_allocated" if self.device.type == "cuda" else self._cpu_method()

    @staticmethod
    def _read_status(field: str) -> float | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return float(line.split()[1]) * 1024.0
        except OSError:
            return None
        return None

    @classmethod
    def _cpu_method(cls) -> str:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if cls._read_status("VmHWM") is not None:
                return "VmHWM growth"
        except OSError:
            pass
        return "ru_maxrss growth"

    def __enter__(self) -> _PeakMemory:
        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = float(torch.cuda.memory_allocated(self.device))
        elif self.method == "VmHWM growth":
            _release_free_heap()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._base = self._read_status("VmRSS") or 0.0
        else:
            self._base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1.0 if sys.platform == "darwin" else 1024.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = float(torch.cuda.max_memory_allocated(self.device))
        elif self.method == "VmHWM growth":
            peak = self._read_status("VmHWM") or 0.0
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1.0 if sys.platform == "darwin" else 1024.0)
        self.bytes = max(peak - self._base, 0.0)


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Callable[[int], None], min_time: float, device: Any, min_calls: int = 2) -> tuple[int, float]:
    """Call ``step(k)`` for k = 0, 1, ... until ``min_time`` seconds and ``min_calls`` calls passed."""
    _sync(device)
    calls, start = 0, time.perf_counter()
    while True:
        step(calls)
        calls += 1
        if calls >= min_calls:
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                return calls, elapsed


def _tensor_bytes(venv: Any) -> int:
    """Bytes of the tensors a native federated env keeps between steps (state, params, streams, t)."""
    import torch

    seen: dict[int, int] = {}

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            seen[value.data_ptr()] = value.untyped_storage().nbytes()
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                visit(getattr(value, f.name))
        elif hasattr(value, "keys") and hasattr(value, "counters"):
            visit(value.keys)
            visit(value.counters)

    for value in vars(venv).values():
        visit(value)
    return sum(seen.values())


def _pre_drawn_actions(n_agents: int, n_envs: int, n_actions: int, device: Any, seed: int) -> Any:
    """``[_ACTION_BLOCK, n_agents * n_envs]`` uniform random actions from per-agent counter-based streams."""
    import torch

    from fedrl_envs import RandomStreams, derive_keys

    streams = RandomStreams(derive_keys(seed, torch.arange(n_agents)), device)
    u = streams.uniform((_ACTION_BLOCK, n_envs))  # [agent, block, env]
    actions = torch.clamp((u * n_actions).long(), max=n_actions - 1)
    return actions.transpose(0, 1).reshape(_ACTION_BLOCK, n_agents * n_envs).contiguous()


# --- the benchmark -------------------------------------------------------------------------------
def _bench_sync(env_id: str, tasks: list[Any], n_envs: int, min_time: float, seed: int) -> float:
    """Steps/s of SyncVectorEnv over ``len(tasks) * n_envs`` single envs (SAME_STEP autoreset)."""
    from functools import partial

    import gymnasium as gym
    import numpy as np

    import fedrl_envs

    family = fedrl_envs.get_family(env_id)
    fns = [partial(family.make_env, task) for task in tasks for _ in range(n_envs)]
    venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        venv.reset(seed=seed)
        rng = np.random.default_rng(seed)
        actions = rng.integers(0, venv.single_action_space.n, size=(_ACTION_BLOCK, venv.num_envs))
        return _rate(lambda k: venv.step(actions[k % _ACTION_BLOCK]), venv.num_envs, min_time)
    finally:
        venv.close()


def _bench_numpy_vector(env_id: str, tasks: list[Any], actions: Any, min_time: float, seed: int) -> float:
    """Steps/s of the NumPy vector env of ``tasks`` (``len(tasks)`` agents) on the pre-drawn ``actions``."""
    from fedrl_algos.bench.numpy_vector import numpy_vector_env

    block = actions.cpu().numpy()
    venv = numpy_vector_env(env_id, tasks, block.shape[1] // len(tasks))
    venv.reset(seed=seed)
    return _rate(lambda k: venv.step(block[k % _ACTION_BLOCK]), venv.num_envs, min_time)


def bench_envs(
    sizes: Sequence[int] = (64, 1024, 16384),
    n_agents: int = 8,
    device: str = "cpu",
    env_ids: Sequence[str] = _FAMILIES,
    quick: bool = False,
    sync_max_envs: int | None = None,
    min_time: float | None = None,
    seed: int = 0,
    show: bool = True,
    kernels: str = "torch",
) -> list[EnvBenchRecord]:
    """Measure the federated env against the NumPy vector env and SyncVectorEnv; one record per family and size.

    :param sizes: environments per agent
    :param n_agents: agents; task ``k % n_train_tasks`` for agent ``k``
    :param device: torch device of the federated env
    :param env_ids: fedrl family ids to measure
    :param quick: short timings and a small SyncVectorEnv (a smoke run, not a measurement)
    :param sync_max_envs: largest envs per agent at which SyncVectorEnv is timed (default 1024, 8 if quick)
    :param min_time: seconds per timing (default 1.0, 0.05 if quick); step rates keep the fastest ~20 ms block
    :param seed: seed of the envs, the random actions and the policies
    :param show: print the table
    :param kernels: what the native env's step kernel runs on, ``"torch"`` or ``"numpy"`` (``FederatedVecEnv(kernels=)``)
    """
    import gymnasium as gym
    import torch

    import fedrl_envs
    from fedrl_wrappers import FederatedVecEnv

    sync_max_envs = (8 if quick else 1024) if sync_max_envs is None else sync_max_envs
    min_time = (0.05 if quick else 1.0) if min_time is None else min_time
    records: list[EnvBenchRecord] = []
    for env_id in env_ids:
        family = fedrl_envs.get_family(env_id)
        n_tasks = len(family.train_tasks)
        agents = [k % n_tasks for k in range(n_agents)]
        sync_rate: float | None = None
        sync_at: int | None = None
        for n_envs in sorted(sizes):
            if sync_at is None or n_envs <= sync_max_envs:
                sync_at = min(n_envs, sync_max_envs)
                sync_rate = _bench_sync(env_id, [family.train_tasks[k] for k in agents], sync_at, min_time, seed)
            n_actions = int(family.action_space(family.train_tasks[0]).n)
            actions = _pre_drawn_actions(n_agents, n_envs, n_actions, device, seed)
            with _PeakMemory(device) as memory:
                venv = FederatedVecEnv(env_id, n_envs, agents=agents, device=device, seed=seed, kernels=kernels)
                venv.reset()
                for k in range(2 * (venv.horizon + 1)):  # warm-up through two autoresets
                    venv.step(actions[k % _ACTION_BLOCK])
                sync = None if torch.device(device).type != "cuda" else (lambda _: torch.cuda.synchronize(device))
                native_rate = _rate(lambda k, v=venv, a=actions: v.step(a[k % _ACTION_BLOCK]), venv.num_envs, min_time, sync)
            env_bytes = _tensor_bytes(venv)
            venv.close()
            del venv
            numpy_rate = _bench_numpy_vector(env_id, [family.train_tasks[k] for k in agents], actions, min_time, seed)
            del actions

            rollout_env = FederatedVecEnv(env_id, n_envs, agents=agents, device=device, seed=seed, autoreset=False)
            is_tabular = isinstance(rollout_env.single_observation_space, gym.spaces.Discrete)
            policy = _tabular_policy(rollout_env, seed) if is_tabular else _mlp_policy(rollout_env, seed)
            rollout_env.rollout(policy)  # warm-up
            steps = rollout_env.num_envs * rollout_env.max_episode_steps
            calls, elapsed = _timed(lambda k, v=rollout_env, p=policy: v.rollout(p), min_time, device, min_calls=1)
            rollout_env.close()
            del rollout_env
            records.append(
                EnvBenchRecord(
                    env_id=env_id,
                    n_agents=n_agents,
                    n_envs=n_envs,
                    device=str(torch.device(device)),
                    native_steps_per_s=native_rate,
                    sync_steps_per_s=sync_rate,
                    sync_n_envs=sync_at,
                    ratio=None if not sync_rate else native_rate / sync_rate,
                    numpy_vector_steps_per_s=numpy_rate,
                    numpy_vector_ratio=native_rate / numpy_rate,
                    peak_mb=memory.bytes / 2**20,
                    env_mb=env_bytes / 2**20,
                    rollout_steps_per_s=calls * steps / elapsed,
                    policy="tabular softmax" if is_tabular else "MLP 2-32-8",
                    memory_method=memory.method,
                )
            )
    if show:
        print_env_table(records)
    return records


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_env_table(records: Sequence[EnvBenchRecord]) -> None:
    """Print records as a table (rich when installed, plain text otherwise)."""
    import torch

    header = [
        "env", "agents x envs", "native/s", "NumPy vec/s", "vs NumPy vec", "Sync/s", "Sync size", "vs Sync",
        "peak MB", "env MB", "rollout/s", "policy",
    ]
    rows = [
        [
            r.env_id.split("/")[-1].removesuffix("-v0"),
            f"{r.n_agents} x {r.n_envs}",
            f"{r.native_steps_per_s:.3g}",
            f"{r.numpy_vector_steps_per_s:.3g}",
            f"{r.numpy_vector_ratio:.2f}x",
            _fmt(r.sync_steps_per_s, ".3g"),
            "-" if r.sync_n_envs is None else f"{r.n_agents} x {r.sync_n_envs}",
            "-" if r.ratio is None else f"{r.ratio:.0f}x",
            _fmt(r.peak_mb, ".1f"),
            f"{r.env_mb:.1f}",
            f"{r.rollout_steps_per_s:.3g}",
            r.policy,
        ]
        for r in records
    ]
    note = (
        f"env steps per second (fastest ~20 ms block); NumPy vec: hand-vectorized NumPy env, same envs and actions; "
        f"device {records[0].device if records else '-'}, {torch.get_num_threads()} torch threads; "
        f"memory: {records[0].memory_method if records else '-'}; method: fedrl_algos/bench/envs.py"
    )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
        for line in [header, *rows]:
            print("  ".join(str(c).rjust(w) for c, w in zip(line, widths, strict=True)))
        print(note)
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    table = Table(title="fedrl bench envs", caption=note)
    for h in header:
        table.add_column(h, justify="left" if h in ("env", "policy") else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)


# --- command line --------------------------------------------------------------------------------
def _cmd_bench_envs(args: argparse.Namespace) -> int:
    sizes = args.sizes if args.sizes else ((64,) if args.quick else (64, 1024, 16384))
    set_threads(args.threads)
    records = bench_envs(
        sizes=sizes,
        n_agents=args.agents,
        device=args.device,
        quick=args.quick,
        sync_max_envs=args.sync_max_envs,
        seed=args.seed,
        kernels=args.kernels,
    )
    finish_bench(args.json, records)
    return 0



def add_envs_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench envs`` (see :func:`fedrl_algos.cli.bench.register`)."""
    p = targets.add_parser(
        "envs",
        help="env steps/s of the federated env vs a hand-vectorized NumPy env and gymnasium SyncVectorEnv",
        description="Environment steps per second of FederatedVecEnv (gridworld, arc navigation) next to the "
        "same MDPs hand-vectorized in NumPy (as Gymnasium's CartPoleVectorEnv) and gymnasium.vector.SyncVectorEnv, "
        "measured in the same process, peak memory, and rollouts with a policy.",
    )
    p.add_argument("--sizes", type=positive_int, nargs="+", help="envs per agent (default 64 1024 16384)")
    p.add_argument("--quick", action="store_true", help="a short smoke run (size 64, tiny timings)")
    p.add_argument("--device", default="cpu", help="torch device of the federated env (cpu, cuda, ...)")
    p.add_argument("--kernels", choices=["torch", "numpy"], default="torch", help="what the native env's step kernel runs on (numpy: CPU only)")
    p.add_argument("--agents", type=positive_int, default=8, help="number of agents (default 8)")
    p.add_argument("--sync-max-envs", type=positive_int, default=None, help="largest envs per agent timed under SyncVectorEnv")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the envs, the random actions and the policies (default 0)")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd_bench_envs)
