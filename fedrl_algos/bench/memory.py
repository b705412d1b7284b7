"""``fedrl bench memory``: peak memory of fixed-length rollouts at growing envs × steps.

A rollout keeps every step it collects, so its memory must grow linearly in the number of env
steps it holds (envs × steps) and in nothing faster. Each size runs in a fresh Python process, so
that ``ru_maxrss`` (a process's peak resident set size, which never goes down) belongs to that size
alone. The child builds the federation and its policy, runs a one-step rollout (which loads and
allocates whatever a first call does), reads its peak RSS (the baseline), runs the measured
rollout and reads it again. Reported per size:

* **peak RSS**: the child's ``ru_maxrss`` at the end (imports, torch and the env included);
* **growth**: the peak minus the baseline, the memory the rollout itself needed at its highest;
* **bytes / env-step**: growth / (envs × steps), the figure that must stay flat across sizes;
* **held / env-step**: the exact bytes of the tensors the rollout returns, per env-step (what a
  caller keeps; the growth is above it by what existed only while the rollout ran, e.g. the
  per-step list of tensors before they are stacked).

Two paths are measured: ``vecenv`` is :meth:`fedrl_wrappers.FederatedVecEnv.rollout` (autoreset on,
so any number of steps) with the bench's per-agent MLP (or tabular) policy in the loop; ``sampler``
is the algorithms' :class:`~fedrl_algos.core.sampling.KernelSampler` with the family's
:class:`~fedrl_algos.policies.MlpPolicy`, ``n_envs`` trajectories per agent of ``n_steps`` steps
(the horizon overridden), returning :class:`~fedrl_algos.core.trajectories.Trajectories`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from fedrl_algos.cli.args import finish_bench, peak_rss, positive_int, print_columns

__all__ = ["MemoryRecord", "PATHS", "DEFAULT_SIZES", "rollout_memory", "memory_scaling", "add_memory_target"]

PATHS = ("vecenv", "sampler")
#: (envs per agent, steps): 8 agents × 4 ×, 16 × and 64 × the first size's env-steps
DEFAULT_SIZES: tuple[tuple[int, int], ...] = ((512, 64), (1024, 128), (2048, 256))


@dataclasses.dataclass
class MemoryRecord:
    """Memory of one rollout (one size of one path)."""

    path: str
    env_id: str
    n_agents: int
    n_envs: int
    n_steps: int
    #: n_agents × n_envs × n_steps
    env_steps: int
    #: ru_maxrss after the warm-up rollout, before the measured one (bytes)
    baseline_bytes: int
    #: ru_maxrss after the measured rollout (bytes)
    peak_bytes: int
    #: exact bytes of the tensors the rollout returned
    held_bytes: int

    @property
    def growth_bytes(self) -> int:
        """Peak minus baseline: what the rollout needed at its highest."""
        return self.peak_bytes - self.baseline_bytes

    @property
    def bytes_per_env_step(self) -> float:
        """Growth per env-step held."""
        return self.growth_bytes / self.env_steps

    @property
    def held_bytes_per_env_step(self) -> float:
        """Returned tensors' bytes per env-step."""
        return self.held_bytes / self.env_steps


def _held_bytes(result: Any) -> int:
    """Bytes of the distinct storages of the tensors/arrays in a NamedTuple result."""
    import numpy as np
    import torch

    seen: dict[int, int] = {}
    for value in result:
        if isinstance(value, torch.Tensor):
            seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        elif isinstance(value, np.ndarray):
            base = value if value.base is None else value.base
            seen[id(base)] = base.nbytes
    return sum(seen.values())


def _vecenv_runner(env_id: str, n_agents: int, n_envs: int, device: str, seed: int) -> Any:
    import gymnasium as gym

    import fedrl_envs
    from fedrl_algos.bench._policies import _mlp_policy, _tabular_policy
    from fedrl_wrappers import FederatedVecEnv

    n_tasks = len(fedrl_envs.get_family(env_id).train_tasks)
    venv = FederatedVecEnv(env_id, n_envs, agents=[k % n_tasks for k in range(n_agents)], device=device, seed=seed)
    tabular = isinstance(venv.single_observation_space, gym.spaces.Discrete)
    policy = _tabular_policy(venv, seed) if tabular else _mlp_policy(venv, seed)
    return lambda n_steps: venv.rollout(policy, n_steps)


def _sampler_runner(env_id: str, n_agents: int, n_envs: int, device: str, seed: int) -> Any:
    import torch

    import fedrl_envs
    from fedrl_algos.core.sampling import KernelSampler
    from fedrl_algos.policies import MlpPolicy
    from fedrl_envs import RandomStreams, derive_keys, stack_params

    family = fedrl_envs.get_family(env_id)
    tasks = [family.train_tasks[k % len(family.train_tasks)] for k in range(n_agents)]
    policy = MlpPolicy(family.observation_space(tasks[0]), family.action_space(tasks[0])).to(device)
    theta = policy.theta.detach().expand(n_agents, -1).contiguous()
    params = stack_params(tasks)
    if hasattr(params, "to"):
        params = params.to(device)
    streams = RandomStreams(derive_keys(seed, torch.arange(n_agents)), device)

    def run(n_steps: int) -> Any:
        sampler = KernelSampler(family, params, policy, streams, horizon=n_steps - 1)
        with torch.no_grad():
            return sampler(theta, n_envs)

    return run


def rollout_memory(
    path: str = "vecenv",
    env_id: str = "fedrl/CartPole-v0",
    n_agents: int = 8,
    n_envs: int = 512,
    n_steps: int = 64,
    device: str = "cpu",
    seed: int = 0,
) -> MemoryRecord:
    """Peak RSS of one rollout of ``n_agents × n_envs`` environments for ``n_steps`` steps, in this process.

    ``ru_maxrss`` never goes down, so the growth is exact only where nothing earlier in the process
    peaked higher than the baseline: :func:`memory_scaling` calls this in a fresh process per size.

    :param path: ``"vecenv"`` (:meth:`FederatedVecEnv.rollout`) or ``"sampler"`` (:class:`KernelSampler`)
    :param env_id: a fedrl family id (``sampler`` needs a flat ``Box`` observation for the MLP)
    :param n_agents: agents (task ``k % n_train_tasks`` for agent ``k``)
    :param n_envs: environments (``sampler``: trajectories) per agent
    :param n_steps: steps collected per environment
    :param device: torch device (the RSS is the host's; on CUDA the tensors are not in it)
    :param seed: seed of the envs and the policy
    """
    from fedrl_envs.validation import check_int

    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    n_agents, n_envs = check_int("n_agents", n_agents, 1), check_int("n_envs", n_envs, 1)
    n_steps = check_int("n_steps", n_steps, 2)
    run = (_vecenv_runner if path == "vecenv" else _sampler_runner)(env_id, n_agents, n_envs, device, seed)
    run(2)  # first calls: kernels, allocator pools
    gc.collect()
    baseline = peak_rss().self_bytes
    result = run(n_steps)
    peak = peak_rss().self_bytes
    return MemoryRecord(path, env_id, n_agents, n_envs, n_steps, n_agents * n_envs * n_steps, baseline, peak, _held_bytes(result))


def _child_environment() -> dict[str, str]:
    """The environment of a child process: this process's fedrl packages first on its path."""
    import fedrl_algos

    root = os.path.dirname(os.path.dirname(os.path.abspath(fedrl_algos.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def memory_scaling(
    sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
    paths: Sequence[str] = PATHS,
    env_id: str = "fedrl/CartPole-v0",
    n_agents: int = 8,
    device: str = "cpu",
    seed: int = 0,
    threads: int = 1,
    show: bool = True,
    timeout: float = 600.0,
) -> list[MemoryRecord]:
    """:func:`rollout_memory` at each size, each in a fresh Python process; print bytes per env-step.

    :param sizes: ``(envs per agent, steps)`` pairs
    :param paths: which rollouts to measure (see :data:`PATHS`)
    :param env_id: a fedrl family id
    :param n_agents: agents
    :param device: torch device
    :param seed: seed of the envs and the policies
    :param threads: torch threads in the children
    :param show: print the table
    :param timeout: seconds allowed to each child
    """
    for path in paths:
        if path not in PATHS:
            raise ValueError(f"paths must be among {PATHS}, got {path!r}")
    if not sizes:
        raise ValueError("sizes must hold at least one (n_envs, n_steps) pair")
    for size in sizes:
        if not (isinstance(size, tuple | list) and len(size) == 2 and all(isinstance(v, int) and v >= 1 for v in size)):
            raise ValueError(f"sizes must be (n_envs, n_steps) pairs of positive integers, got {size!r}")
    records = []
    for path in paths:
        for n_envs, n_steps in sizes:
            spec = dict(path=path, env_id=env_id, n_agents=n_agents, n_envs=n_envs, n_steps=n_steps, device=device, seed=seed)
            done = subprocess.run(
                [sys.executable, "-m", "fedrl_algos.bench.memory", "--child", json.dumps(spec), "--threads", str(threads)],
                capture_output=True, text=True, env=_child_environment(), timeout=timeout, check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"the memory child for {spec} failed ({done.returncode}):\n{done.stderr[-2000:]}")
            records.append(MemoryRecord(**json.loads(done.stdout.strip().splitlines()[-1])))
    if show:
        print_memory_table(records)
    return records


def print_memory_table(records: Sequence[MemoryRecord]) -> None:
    """Print the records, and per path the largest over the smallest bytes per env-step."""
    header = ["path", "agents x envs x steps", "env-steps", "peak RSS MiB", "growth MiB", "bytes/env-step", "held/env-step"]
    lines = [header] + [
        [r.path, f"{r.n_agents} x {r.n_envs} x {r.n_steps}", str(r.env_steps), f"{r.peak_bytes / 2**20:.0f}",
         f"{r.growth_bytes / 2**20:.1f}", f"{r.bytes_per_env_step:.1f}", f"{r.held_bytes_per_env_step:.1f}"]
        for r in records
    ]
    print_columns(lines)
    for path in dict.fromkeys(r.path for r in records):
        rows = sorted((r for r in records if r.path == path), key=lambda r: r.env_steps)
        if len(rows) > 1:
            small, large = rows[0].bytes_per_env_step, rows[-1].bytes_per_env_step
            ratio = f"{large / small:.2f}" if small > 0 else "- (no growth measurable at the smallest size)"
            print(f"{path}: bytes/env-step at {rows[-1].env_steps} env-steps over that at {rows[0].env_steps}: "
                  f"{ratio} (1 = linear, above 1 = faster than linear)")
    print(f"{records[0].env_id if records else '-'}; one fresh process per size; growth = ru_maxrss after the rollout "
          "minus before it; held = the returned tensors; method: fedrl_algos/bench/memory.py")


def _child(spec: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    record = rollout_memory(**json.loads(spec))
    print(json.dumps(dataclasses.asdict(record)))


def _size(text: str) -> tuple[int, int]:
    try:
        n_envs, n_steps = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be ENVSxSTEPS, e.g. 512x64, got {text!r}") from None
    if n_envs < 1 or n_steps < 2:
        raise argparse.ArgumentTypeError(f"must be ENVSxSTEPS with ENVS >= 1 and STEPS >= 2, got {text!r}")
    return n_envs, n_steps


def _cmd(args: argparse.Namespace) -> int:
    sizes = args.sizes or (((64, 16), (128, 32)) if args.quick else DEFAULT_SIZES)
    records = memory_scaling(sizes=sizes, paths=args.paths, env_id=args.env, n_agents=args.agents, device=args.device,
                             seed=args.seed, threads=args.threads)
    finish_bench(args.json, [dataclasses.asdict(r) | {"growth_bytes": r.growth_bytes, "bytes_per_env_step": r.bytes_per_env_step,
                                                      "held_bytes_per_env_step": r.held_bytes_per_env_step} for r in records])
    return 0


def add_memory_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench memory`` to the bench sub-commands."""
    p = targets.add_parser(
        "memory",
        help="peak RSS of rollouts at growing envs x steps (one fresh process per size), bytes per env-step",
        description="Peak resident memory of FederatedVecEnv.rollout and of the algorithms' KernelSampler at several "
        "envs x steps sizes, each in a fresh process, and the growth per env-step held, which must not rise with size.",
    )
    p.add_argument("--sizes", type=_size, nargs="+", help="ENVSxSTEPS per agent (default 512x64 1024x128 2048x256)")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS), help="rollouts to measure (default both)")
    p.add_argument("--env", default="fedrl/CartPole-v0", help="fedrl family id (default fedrl/CartPole-v0)")
    p.add_argument("--agents", type=positive_int, default=8, help="agents (default 8)")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads in each child (default 1)")
    p.add_argument("--quick", action="store_true", help="a smoke run: two tiny sizes")
    p.add_argument("--seed", type=int, default=0, help="seed of the envs and the policies")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description="one size of fedrl bench memory (a child process)")
    _parser.add_argument("--child", required=True, help="JSON keyword arguments of rollout_memory")
    _parser.add_argument("--threads", type=positive_int, default=1)
    _args = _parser.parse_args()
    _child(_args.child, _args.threads)
