"""``fedrl bench flower``: a federation on Flower's simulation engine against the same federation in
one process, in rounds per second and bytes per round.

For each number of agents (default 8 and 64) one Per-FedAvg-PG federation of the gridworld (the
paper's training goals, repeated to make up the agents) trains ``--rounds`` rounds twice from the
same seed: with ``learn`` in this process (the baseline) and with :func:`fedrl_algos.flower.simulate`
(one ClientApp per agent on Ray). The two results are compared bit for bit. Reported:

* rounds/s of each, and their ratio; the simulation's start-up (Ray, the SuperNodes) separately;
* bytes per round of the train messages' array payloads (down and up), against the paper's
  communication of ``2·d·n`` floats per round (Per-FedAvg-PG §3.3: θ to every agent and back),
  and what the rest is (each agent's random-stream positions, 8 bytes per stream).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from fedrl_algos.cli.args import finish_bench, positive_int, set_threads

__all__ = ["bench_flower", "add_flower_target"]


def _model(n_agents: int, local_steps: int, seed: int) -> Any:
    import fedrl_envs
    from fedrl_algos import PerFedAvgPG

    family = fedrl_envs.get_family("fedrl/GridWorld-v0")
    goals = [tuple(int(v) for v in task.goal.tolist()) for task in family.train_tasks]
    agents = [{"goal": goals[k % len(goals)]} for k in range(n_agents)]
    return PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=seed, device="cpu", local_steps=local_steps, agent_kwargs=agents)


def bench_flower(agents: tuple[int, ...] = (8, 64), rounds: int = 5, local_steps: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """Time in-process ``learn`` and Flower's simulation on the same federations; print a table.

    :param agents: federation sizes
    :param rounds: rounds per measurement
    :param local_steps: τ of Per-FedAvg-PG
    :param seed: seed of both runs
    :return: one record per size
    """
    from rich.console import Console
    from rich.table import Table

    from fedrl_algos.flower import simulate

    records = []
    for n in agents:
        in_process = _model(n, local_steps, seed)
        start = time.perf_counter()
        in_process.learn(total_rounds=rounds)
        seconds_in_process = time.perf_counter() - start
        stats: list[dict[str, Any]] = []
        start = time.perf_counter()
        flower = simulate(_model(n, local_steps, seed), num_rounds=rounds, round_stats=stats)
        total = time.perf_counter() - start
        seconds_rounds = sum(s["seconds"] for s in stats)
        d = int(in_process.theta.numel())
        float_bytes = in_process.theta.element_size()
        paper = 2 * d * n * float_bytes
        per_round = sum(s["bytes_sent"] + s["bytes_received"] for s in stats) / len(stats)
        records.append({
            "agents": n, "rounds": rounds, "d": d, "in_process_rounds_per_s": rounds / seconds_in_process,
            "flower_rounds_per_s": rounds / seconds_rounds, "flower_startup_s": total - seconds_rounds,
            "ratio_flower_to_in_process": seconds_in_process / seconds_rounds, "bytes_per_round": per_round,
            "paper_bytes_per_round": paper, "bytes_over_paper": per_round / paper,
            "bitwise_equal": bool(torch.equal(in_process.theta, flower.theta)),
        })
    table = Table(title=f"fedrl bench flower: Per-FedAvg-PG gridworld, {rounds} rounds, τ={local_steps}")
    for column in ("agents", "in-process rounds/s", "Flower sim rounds/s", "Flower / in-process", "sim start-up s",
                   "bytes/round", "paper 2·d·n floats", "ratio", "same θ"):
        table.add_column(column, justify="right")
    for r in records:
        table.add_row(str(r["agents"]), f"{r['in_process_rounds_per_s']:.2f}", f"{r['flower_rounds_per_s']:.2f}",
                      f"{r['ratio_flower_to_in_process']:.3f}×", f"{r['flower_startup_s']:.1f}", f"{r['bytes_per_round']:.0f}",
                      f"{r['paper_bytes_per_round']:.0f}", f"{r['bytes_over_paper']:.3f}", "yes" if r["bitwise_equal"] else "NO")
    Console().print(table)
    return records


def _cmd(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    records = bench_flower(tuple(args.agents), args.rounds, args.local_steps, args.seed)
    finish_bench(args.json, records)
    return 0 if all(r["bitwise_equal"] for r in records) else 1


def add_flower_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench flower``."""
    p = targets.add_parser(
        "flower", help="rounds/s and bytes/round on Flower's simulation vs the same federation in one process",
        description="A Per-FedAvg-PG gridworld federation trained with learn() in this process and with "
        "fedrl_algos.flower.simulate (Ray, one ClientApp per agent): rounds per second, the simulation's "
        "start-up, bytes per round against the paper's 2·d·n floats, and whether both give the same θ. "
        "Needs the flower extra.",
    )
    p.add_argument("--agents", type=positive_int, nargs="+", default=[8, 64], help="federation sizes (default 8 64)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds per measurement (default 5)")
    p.add_argument("--local-steps", type=positive_int, default=1, help="Per-FedAvg-PG's τ (default 1)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads of this process")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs (default 0)")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)
