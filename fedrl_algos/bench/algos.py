"""``fedrl bench algos``: one round of the paper's configs, 10 runs batched vs looped.

Both sides run the same functional core (:mod:`fedrl_algos.core`) on the same random streams, so
they compute the same numbers (the benchmark checks it); the looped side runs one agent of one run
at a time, the way a per-agent implementation would.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from fedrl_algos.cli.args import finish_bench, positive_int
from fedrl_algos.core import KernelSampler, aggregate, local_update
from fedrl_algos.core.federation import Federation, run_keys
from fedrl_algos.per_fedavg_pg import ExactMetaGradient
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import MlpPolicy, TabularPolicy
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, RandomStreams, index_params, stack_params

__all__ = ["AlgoBenchResult", "bench_algos", "format_algo_results"]


@dataclass
class AlgoBenchResult:
    """Timing of one configuration."""

    config: str
    runs: int
    agents: int
    batched_s: float
    looped_s: float
    max_abs_diff: float

    @property
    def speedup(self) -> float:
        return self.looped_s / self.batched_s


def _configs(dtype: torch.dtype, tau: int) -> dict[str, dict[str, Any]]:
    grid_task = GRIDWORLD.train_tasks[0]
    arc_task = ARC_NAVIGATION.train_tasks[0]
    tabular = TabularPolicy(GRIDWORLD.observation_space(grid_task), GRIDWORLD.action_space(grid_task), dtype=dtype)
    mlp = MlpPolicy(ARC_NAVIGATION.observation_space(arc_task), ARC_NAVIGATION.action_space(arc_task), dtype=dtype)
    return {
        f"tabular (gridworld, 8 agents, exact, tau={tau}, m=10/10/10)": dict(
            family=GRIDWORLD, tasks=GRIDWORLD.train_tasks, policy=tabular, alpha=2.0, beta=0.3
        ),
        f"neural (arc navigation, 6 agents, exact, tau={tau}, m=10/10/10)": dict(
            family=ARC_NAVIGATION, tasks=ARC_NAVIGATION.train_tasks, policy=mlp, alpha=1.0, beta=0.2
        ),
    }


def _batched_round(cfg: dict[str, Any], seeds: torch.Tensor, theta: torch.Tensor, estimator: ExactMetaGradient, tau: int) -> torch.Tensor:
    fed = Federation(cfg["family"], stack_params(cfg["tasks"]), cfg["policy"], seeds)
    return per_fedavg_pg_round(fed, theta, estimator, cfg["beta"], tau)[0]


def _looped_round(cfg: dict[str, Any], seeds: torch.Tensor, theta: torch.Tensor, estimator: ExactMetaGradient, tau: int) -> torch.Tensor:
    params = stack_params(cfg["tasks"])
    n = len(cfg["tasks"])
    keys = run_keys(seeds, n)
    out = []
    for r in range(len(seeds)):
        local = []
        for i in range(n):
            sampler = KernelSampler(cfg["family"], index_params(params, torch.tensor([i])), cfg["policy"], RandomStreams(keys[r, i].reshape(1, 1)))
            local.append(local_update(estimator, sampler, theta[r].reshape(1, 1, -1), cfg["beta"], tau)[0, 0])
        out.append(aggregate(torch.stack(local).unsqueeze(0))[0])
    return torch.stack(out)


def bench_algos(runs: int = 10, tau: int = 5, repeats: int = 3, dtype: torch.dtype = torch.float32, quick: bool = False) -> list[AlgoBenchResult]:
    """Median wall time of one round, batched vs looped, for each paper configuration.

    :param runs: independent runs (seeds) per measurement
    :param tau: local steps per round
    :param repeats: measurements per side (the median is reported)
    :param dtype: parameter dtype
    :param quick: 2 runs, 1 local step, 1 repeat (a smoke test)
    """
    if quick:
        runs, tau, repeats = 2, 1, 1
    results = []
    for name, cfg in _configs(dtype, tau).items():
        policy = cfg["policy"]
        estimator = ExactMetaGradient(policy, 0.9, cfg["alpha"], 10, 10, 10)
        seeds = torch.arange(runs)
        theta = policy.theta.detach().expand(runs, -1).clone()
        times = {"batched": [], "looped": []}
        outputs = {}
        for _ in range(repeats):
            for side, fn in (("batched", _batched_round), ("looped", _looped_round)):
                start = time.perf_counter()
                outputs[side] = fn(cfg, seeds, theta, estimator, tau)
                times[side].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        diff = float((outputs["batched"] - outputs["looped"]).abs().max())
        results.append(AlgoBenchResult(name, runs, len(cfg["tasks"]), median["batched"], median["looped"], diff))
    return results


def format_algo_results(results: list[AlgoBenchResult]) -> str:
    """A plain-text table of :func:`bench_algos` results."""
    lines = [f"{'configuration':62s} {'runs':>4s} {'batched s':>10s} {'looped s':>10s} {'speed-up':>9s} {'max |diff|':>11s}"]
    for r in results:
        lines.append(f"{r.config:62s} {r.runs:4d} {r.batched_s:10.4f} {r.looped_s:10.4f} {r.speedup:8.1f}x {r.max_abs_diff:11.2e}")
    return "\n".join(lines)


def _cmd_bench_algos(args: Any) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.float64 else torch.float32
    runs, tau = (2, 1) if args.quick else (args.runs, args.tau)
    print(f"One round (tau={tau}) of each paper configuration, {runs} runs batched in one program vs the")
    print("same runs looped one agent and one run at a time through the same core (same streams, same numbers).")
    print(f"torch threads: {torch.get_num_threads()}, dtype: {dtype}")
    results = bench_algos(runs=args.runs, tau=args.tau, repeats=args.repeats, dtype=dtype, quick=args.quick)
    print(format_algo_results(results))
    finish_bench(args.json, [dataclasses.asdict(r) | {"speedup": r.speedup} for r in results])
    return 0



def add_algos_target(targets: Any) -> None:
    """Add ``fedrl bench algos`` (see :func:`fedrl_algos.cli.bench.register`)."""
    p = targets.add_parser(
        "algos",
        help="one training round, runs batched vs looped",
        description="Wall time of one Per-FedAvg-PG round (exact variant) of the tabular and the neural paper "
        "configuration, R runs batched vs looped one agent and one run at a time, and the speed-up.",
    )
    p.add_argument("--runs", type=positive_int, default=10, help="independent runs (default 10)")
    p.add_argument("--tau", type=positive_int, default=5, help="local steps per round (default 5)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timings per side; the median is shown (default 3)")
    p.add_argument("--float64", action="store_true", help="float64 parameters (default float32)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd_bench_algos)
