"""``fedrl bench kernels``: the arc policy's compiled kernels against its torch kernels, in one process.

The neural experiments' batch: the paper's 2 → 32 tanh → 8 softmax network on arc navigation,
``rows`` agents (default 60: 10 seeds × 6 training goals), each with its own parameters (the shared
initialization plus seeded noise of scale ``--spread``, so that the policies are far from uniform and
a realistic share of trajectories reaches the goal). For every trajectory count ``m`` it times,
for ``FastMlpPolicy(kernels="torch")`` and ``kernels="numba"`` alternately (``repeats`` times,
medians):

* **rollout** — ``m`` trajectories a row (:func:`~fedrl_algos.policies.mlp.kernels.mlp_rollout`);
* **policy gradient** — the REINFORCE/GPOMDP estimate of those trajectories;
* **curvature product** — the exact variant's ``Ĥv`` (:func:`~fedrl_algos.core.curvature.curvature_vector_product`)
  with the paper's estimator (only rewarded trajectories count) and with the causal one (every
  trajectory weighted by its baseline).

Both kernels get the same trajectories (the torch kernels' rollout) for the gradient and curvature
timings, so they do the same work. Each row reports both times and the ratio torch / numba.

Then the **tabular rollout** of the Per-FedAvg-PG gridworld experiments (``alpha``,
``personalization``): ``TabularPolicy(kernels="torch")`` against ``kernels="numba"`` (the compiled
time loop of :mod:`fedrl_algos.policies.tabular_compiled`, bitwise the same trajectories) on
``tabular_runs`` runs × the 8 training goals, each row with its own random logits, through the
policy's tabulated rollout plan as the trainings use it; and the policy's probability table
``softmax(θ[s, :])`` of those rows (``torch.softmax`` against the compiled softmax of
:mod:`~fedrl_algos.policies.tabular_compiled`, bitwise the same table), which every local step
computes at each new θ.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

from fedrl_algos.cli.args import finish_bench, positive_int, print_columns, set_threads

__all__ = ["KernelBenchRecord", "bench_kernels", "add_kernels_target", "OPERATIONS", "TABULAR_OPERATION", "TABULAR_TABLE_OPERATION"]

#: what is timed, in table order
OPERATIONS = ("rollout", "policy gradient", "curvature (paper)", "curvature (causal)")
#: the tabular policy's operations, timed after the arc policy's: the rollout at each trajectory
#: count, then the probability table ``softmax(θ[s, :])`` of every row (no trajectories: recorded
#: with ``trajectories = 0``)
TABULAR_OPERATION = "tabular rollout"
TABULAR_TABLE_OPERATION = "tabular probability table"


@dataclasses.dataclass(frozen=True)
class KernelBenchRecord:
    """One operation at one batch: median seconds of each kernel choice."""

    operation: str
    rows: int
    trajectories: int
    rewarded_fraction: float
    torch_seconds: float
    numba_seconds: float
    repeats: int

    @property
    def speedup(self) -> float:
        """torch / numba: how many times faster the compiled kernels are."""
        return self.torch_seconds / self.numba_seconds


def _median_alternating(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each call, the calls alternated ``repeats`` times after one warm-up each."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_kernels(trajectories: Sequence[int] = (10, 1000), rows: int = 60, repeats: int = 5, spread: float = 0.3,
                  seed: int = 0, show: bool = True, tabular_trajectories: Sequence[int] = (10, 30),
                  tabular_runs: int = 60) -> list[KernelBenchRecord]:
    """Time the arc policy's and the tabular policy's torch and compiled kernels side by side (module docstring).

    :param trajectories: trajectory counts ``m`` a row
    :param rows: agents (rows), each with its own parameters
    :param repeats: timings of each kernel, alternated; medians reported
    :param spread: scale of the seeded noise added to the shared initialization
    :param seed: seed of that noise, the streams and the direction
    :param show: print the table
    :param tabular_trajectories: trajectory counts ``m`` a row of the tabular rollouts (none: not timed)
    :param tabular_runs: runs of the tabular rollouts, each of the gridworld's 8 training goals
    """
    import torch

    from fedrl_algos.core.curvature import curvature_vector_product
    from fedrl_algos.core.estimators import policy_gradient
    from fedrl_algos.policies import FastMlpPolicy
    from fedrl_algos.policies.mlp.kernels import mlp_rollout
    from fedrl_envs import ARC_NAVIGATION, RandomStreams, derive_keys, stack_params
    from fedrl_envs.fused import numba_available

    if not numba_available():
        raise RuntimeError('fedrl bench kernels needs Numba (pip install "fedrl[fast]")')
    task = ARC_NAVIGATION.train_tasks[0]
    policies = {k: FastMlpPolicy(ARC_NAVIGATION.observation_space(task), ARC_NAVIGATION.action_space(task), kernels=k)
                for k in ("torch", "numba")}
    nets = {k: policy.softmax_mlp for k, policy in policies.items()}
    gen = torch.Generator().manual_seed(seed)
    base = policies["torch"].theta.detach()
    theta = base + spread * torch.randn(rows, base.numel(), generator=gen)
    v = 0.01 * torch.randn(rows, base.numel(), generator=gen)
    tasks = ARC_NAVIGATION.train_tasks
    params = stack_params([tasks[r % len(tasks)] for r in range(rows)])
    keys = derive_keys(torch.tensor(seed), torch.arange(rows))
    gamma = 0.9
    records = []
    for m in trajectories:
        def roll(kernels: str, m: int = m) -> object:
            return mlp_rollout(ARC_NAVIGATION, params, nets[kernels], theta, RandomStreams(keys), m)

        traj = roll("torch")
        rewarded = float((traj.rewards.sum(-1) > 0).double().mean())
        operations: dict[str, Callable[[str], object]] = {
            "rollout": roll,
            "policy gradient": lambda k, t=traj: policy_gradient(policies[k], theta, t, gamma),
            "curvature (paper)": lambda k, t=traj: curvature_vector_product(policies[k], theta, t, v, gamma, "paper"),
            "curvature (causal)": lambda k, t=traj: curvature_vector_product(policies[k], theta, t, v, gamma, "causal"),
        }
        for name in OPERATIONS:
            run = operations[name]
            medians = _median_alternating({k: (lambda k=k, run=run: run(k)) for k in policies}, repeats)
            records.append(KernelBenchRecord(name, rows, m, rewarded, medians["torch"], medians["numba"], repeats))
    records += _bench_tabular(tabular_trajectories, tabular_runs, repeats, seed)
    if show:
        print_kernels_table(records)
    return records


def _bench_tabular(trajectories: Sequence[int], runs: int, repeats: int, seed: int) -> list[KernelBenchRecord]:
    """The gridworld's tabulated rollout with the torch loop and with the compiled loop (module docstring)."""
    import torch

    from fedrl_algos.policies import TabularPolicy
    from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, stack_params

    tasks = GRIDWORLD.train_tasks
    params = stack_params([task for _ in range(runs) for task in tasks])
    spaces = GRIDWORLD.observation_space(tasks[0]), GRIDWORLD.action_space(tasks[0])
    plans = {k: TabularPolicy(*spaces, kernels=k).kernel_rollout_plan(GRIDWORLD, params) for k in ("torch", "numba")}
    n_rows = runs * len(tasks)
    theta = torch.randn(n_rows, plans["torch"].policy.n_params, generator=torch.Generator().manual_seed(seed))
    keys = derive_keys(torch.tensor(seed), torch.arange(n_rows))
    horizon = GRIDWORLD.horizon(tasks[0])
    records = []
    for m in trajectories:
        def roll(kernels: str, m: int = m) -> object:
            return plans[kernels](theta, RandomStreams(keys), m, horizon, False)

        rewarded = float((roll("torch").rewards.sum(-1) > 0).double().mean())
        medians = _median_alternating({k: (lambda k=k: roll(k)) for k in plans}, repeats)
        records.append(KernelBenchRecord(TABULAR_OPERATION, n_rows, m, rewarded, medians["torch"], medians["numba"], repeats))
    if trajectories:
        def table(kernels: str) -> object:
            policy = plans[kernels].policy
            policy._probs_cache.clear()  # a new θ each call, as at every local step
            return policy.probs_table(theta)

        medians = _median_alternating({k: (lambda k=k: table(k)) for k in plans}, repeats)
        records.append(KernelBenchRecord(TABULAR_TABLE_OPERATION, n_rows, 0, 0.0, medians["torch"], medians["numba"], repeats))
    return records


def print_kernels_table(records: Sequence[KernelBenchRecord]) -> None:
    """Print the records with the speed-up of the compiled kernels."""
    import torch

    lines = [["operation", "rows x trajectories", "rewarded", "torch ms", "numba ms", "torch/numba"]] + [
        [r.operation, f"{r.rows} x {r.trajectories}" if r.trajectories else f"{r.rows} rows",
         f"{r.rewarded_fraction:.0%}" if r.trajectories else "-", f"{1e3 * r.torch_seconds:.2f}",
         f"{1e3 * r.numba_seconds:.2f}", f"{r.speedup:.2f}x"]
        for r in records
    ]
    print_columns(lines)
    repeats = records[0].repeats if records else 0
    print(f"arc navigation, the paper's 2-32-8 softmax network, and the gridworld's tabular policy (rows: runs x 8 goals), "
          f"float32; medians of {repeats} alternated calls after a warm-up; {torch.get_num_threads()} torch threads; "
          "method: fedrl_algos/bench/kernels.py")


def _cmd(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    trajectories = (10, 50) if args.quick else args.trajectories
    records = bench_kernels(trajectories, rows=6 if args.quick else args.rows, repeats=1 if args.quick else args.repeats,
                            spread=args.spread, seed=args.seed, tabular_trajectories=args.tabular_trajectories,
                            tabular_runs=2 if args.quick else args.tabular_runs)
    finish_bench(args.json, [dataclasses.asdict(r) | {"speedup": r.speedup} for r in records])
    return 0


def add_kernels_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench kernels`` to the bench sub-commands."""
    p = targets.add_parser(
        "kernels",
        help="the arc policy's compiled (numba) kernels vs its torch kernels: rollout, gradient, curvature product; "
        "the tabular policy's compiled rollout loop and softmax",
        description="Rollouts, policy gradients and curvature products of the paper's arc-navigation network "
        "with FastMlpPolicy(kernels='numba') next to kernels='torch', alternated in one process.",
    )
    p.add_argument("--trajectories", type=positive_int, nargs="+", default=[10, 1000],
                   help="trajectories a row (default 10 1000: a local step's batch and the largest Hessian batch)")
    p.add_argument("--rows", type=positive_int, default=60, help="agents, each with its own parameters (default 60)")
    p.add_argument("--repeats", type=positive_int, default=5, help="alternated timings of each kernel; medians (default 5)")
    p.add_argument("--spread", type=float, default=0.3, help="noise added to the shared initialization (default 0.3)")
    p.add_argument("--tabular-trajectories", type=positive_int, nargs="*", default=[10, 30],
                   help="trajectories a row of the gridworld's tabular rollouts (default 10 30: the alpha experiment's "
                   "inner and per-step batches; none: not timed)")
    p.add_argument("--tabular-runs", type=positive_int, default=60,
                   help="runs of the tabular rollouts, each of the 8 training goals (default 60: alpha's 6 step sizes x 10 seeds)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 6 rows, 10 and 50 trajectories, one timing")
    p.add_argument("--seed", type=int, default=0, help="seed of the parameters, streams and direction")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)
