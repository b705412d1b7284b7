"""``fedrl bench mujoco``: training throughput on a MuJoCo env, fedrl's federations against SB3's PPO.

For each method (MFPO, FedAvg-PG, FedPG-BR) it builds the federation the MFPO paper's MuJoCo rows
use — ``n_agents`` agents of the env with mass scales spread evenly over 0.75–1.25, two ReLU layers
of 256 units with tanh-Gaussian outputs and SB3's orthogonal initialization — runs one warm-up
round, then times whole ``learn`` rounds. Its **env steps** are the steps inside episodes of every
trajectory the algorithm's samplers return (as ``fedrl bench training`` counts them:
:class:`~fedrl_algos.bench.training.CountingSampler`), so a 1000-step HalfCheetah episode counts
1000 and a Hopper that fell after 30 steps counts 30.

The baseline, timed in the same process, is what a user would run instead on one copy of the env:
SB3's ``PPO("MlpPolicy", env)`` with its defaults (2048 steps a rollout, 10 epochs of minibatch
updates), whose ``learn(total_timesteps)`` steps the env ``total_timesteps`` times. Both figures are
whole-training throughputs: the rollout with the policy in the loop, the gradient computation and
the update.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from fedrl_algos.bench.training import _count_steps, _time_rounds
from fedrl_algos.cli.args import _int_at_least, finish_bench, positive_int, print_columns, set_threads

__all__ = ["MujocoBenchRecord", "bench_mujoco", "add_mujoco_target", "METHODS"]

#: the methods timed, by the name printed
METHODS: tuple[str, ...] = ("MFPO", "FedAvg-PG", "FedPG-BR")


@dataclasses.dataclass
class MujocoBenchRecord:
    """One row of ``fedrl bench mujoco``: a method's training rounds next to SB3's PPO."""

    method: str
    env_id: str
    n_agents: int
    #: trajectories per agent per sampling call (FedPG-BR: its B_max)
    trajectories: int
    rounds: int
    #: steps inside episodes of the timed rounds
    env_steps: int
    seconds: float
    training_steps_per_s: float
    ppo_timesteps: int
    ppo_seconds: float
    ppo_steps_per_s: float

    @property
    def ratio(self) -> float:
        """fedrl's env steps per second over PPO's."""
        return self.training_steps_per_s / self.ppo_steps_per_s


def _policy_kwargs() -> dict[str, Any]:
    import math

    return dict(net_arch=[256, 256], activation="relu", squash="tanh", init_gains=(math.sqrt(2.0), 0.01))


def _model(method: str, env_id: str, n_agents: int, trajectories: int, local_steps: int, seed: int, device: str) -> Any:
    import numpy as np

    import fedrl_algos
    from fedrl_wrappers.heterogeneity import mujoco_agent_kwargs

    agents = mujoco_agent_kwargs(mass_scale=[float(s) for s in np.linspace(0.75, 1.25, n_agents)]) if n_agents > 1 else [{}]
    common = dict(agent_kwargs=agents, policy_kwargs=_policy_kwargs(), seed=seed, device=device)
    if method == "MFPO":
        return fedrl_algos.MFPO("MlpPolicy", env_id, local_steps=local_steps, n_trajectories=trajectories, **common)
    if method == "FedAvg-PG":
        return fedrl_algos.FedAvgPG("MlpPolicy", env_id, local_steps=local_steps, n_trajectories=trajectories, **common)
    if method == "FedPG-BR":
        low = max(2, trajectories - 1)
        return fedrl_algos.FedPGBR("MlpPolicy", env_id, batch_range=(low, trajectories), inner_batch_size=max(1, trajectories // 2),
                                   max_importance_weight=2.0, **common)
    raise ValueError(f"methods must be among {list(METHODS)}, got {method!r}")


def _ppo_rate(env_id: str, timesteps: int, seed: int) -> tuple[int, float]:
    """Timesteps and seconds of ``PPO("MlpPolicy", env).learn(timesteps)`` with SB3's defaults."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    from fedrl_algos.common.learn import make_logger

    env = gym.make(env_id)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, n_steps=min(2048, timesteps), batch_size=64)
    model.set_logger(make_logger(0, None, "PPO", True))  # not SB3's default: it makes an empty folder in the temp directory
    start = time.perf_counter()
    model.learn(total_timesteps=timesteps)
    elapsed = time.perf_counter() - start
    env.close()
    return int(model.num_timesteps), elapsed


def bench_mujoco(
    env_id: str = "HalfCheetah-v5",
    methods: Sequence[str] = METHODS,
    n_agents: int = 2,
    trajectories: int = 4,
    local_steps: int = 2,
    rounds: int = 1,
    ppo_timesteps: int = 4096,
    device: str = "cpu",
    seed: int = 0,
    show: bool = True,
) -> list[MujocoBenchRecord]:
    """Time whole training rounds of each method on ``env_id`` and SB3's PPO on one copy of it.

    :param env_id: a Gymnasium MuJoCo id (the agents differ by their bodies' mass scales)
    :param methods: names from :data:`METHODS`
    :param n_agents: agents of each federation
    :param trajectories: trajectories per agent per local step, at least 2 (MFPO's and FedAvg-PG's D;
        FedPG-BR's B_max, with B_min one less but at least 2, and inner batches of half)
    :param local_steps: K of MFPO and FedAvg-PG
    :param rounds: timed rounds, after one warm-up round
    :param ppo_timesteps: PPO's timesteps (its rollouts are ``min(2048, ppo_timesteps)`` steps)
    :param device: torch device of the federations (PPO runs on the CPU)
    :param seed: seed of the models and envs
    :param show: print the table
    """
    from fedrl_envs.validation import check_int

    for name in methods:
        if name not in METHODS:
            raise ValueError(f"methods must be among {list(METHODS)}, got {name!r}")
    n_agents, trajectories = check_int("n_agents", n_agents, 1), check_int("trajectories", trajectories, 2)
    local_steps, rounds = check_int("local_steps", local_steps, 1), check_int("rounds", rounds, 1)
    ppo_timesteps = check_int("ppo_timesteps", ppo_timesteps, 64)
    ppo_steps, ppo_seconds = _ppo_rate(env_id, ppo_timesteps, seed)
    records = []
    for name in methods:
        model = _model(name, env_id, n_agents, trajectories, local_steps, seed, device)
        model.learn(total_rounds=1)
        counter = _count_steps(model)[0]
        elapsed, steps, _, _ = _time_rounds(model, rounds, counter)
        records.append(MujocoBenchRecord(
            method=name, env_id=env_id, n_agents=n_agents, trajectories=trajectories, rounds=rounds, env_steps=steps, seconds=elapsed,
            training_steps_per_s=steps / elapsed, ppo_timesteps=ppo_steps, ppo_seconds=ppo_seconds, ppo_steps_per_s=ppo_steps / ppo_seconds,
        ))
        for env in {id(e): e for e in (model.federation.env, model.federation.eval_env) if e is not None}.values():
            env.close()
    if show:
        print_mujoco_table(records)
    return records


def print_mujoco_table(records: Sequence[MujocoBenchRecord]) -> None:
    """Print the records with fedrl's rate over PPO's."""
    import torch

    header = ["method", "env", "agents x traj", "env steps", "seconds", "training/s", "PPO steps/s", "ratio"]
    lines = [header] + [
        [r.method, r.env_id, f"{r.n_agents} x {r.trajectories}", str(r.env_steps), f"{r.seconds:.2f}", f"{r.training_steps_per_s:.3g}",
         f"{r.ppo_steps_per_s:.3g}", f"{r.ratio:.2f}"]
        for r in records
    ]
    print_columns(lines)
    if records:
        print(f"env steps = steps inside episodes of the timed rounds (after one warm-up round); PPO: SB3's defaults on one env, "
              f"learn({records[0].ppo_timesteps}) in {records[0].ppo_seconds:.2f} s; {torch.get_num_threads()} torch threads; "
              f"method: fedrl_algos/bench/mujoco.py")


def _cmd(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    quick = dict(trajectories=2, local_steps=1, ppo_timesteps=256) if args.quick else {}
    records = bench_mujoco(env_id=args.env, methods=args.methods, n_agents=args.agents,
                           trajectories=quick.get("trajectories", args.trajectories), local_steps=quick.get("local_steps", args.local_steps),
                           rounds=args.rounds, ppo_timesteps=quick.get("ppo_timesteps", args.ppo_timesteps), device=args.device, seed=args.seed)
    finish_bench(args.json, [dataclasses.asdict(r) | {"ratio": r.ratio} for r in records])
    return 0


def _at_least_two(text: str) -> int:
    return _int_at_least(text, 2)


def add_mujoco_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench mujoco`` to the bench sub-commands."""
    p = targets.add_parser(
        "mujoco",
        help="training env steps/s on a MuJoCo env vs SB3's PPO on one copy of it",
        description="Env steps per second of whole MFPO, FedAvg-PG and FedPG-BR rounds on a heterogeneous MuJoCo federation "
        "(the MFPO paper's 256-256 ReLU tanh-Gaussian policy), next to SB3's PPO with its defaults on one env, in one process.",
    )
    p.add_argument("--env", default="HalfCheetah-v5", help="Gymnasium MuJoCo id (default HalfCheetah-v5)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS), help="methods to time")
    p.add_argument("--agents", type=positive_int, default=2, help="agents of each federation (default 2)")
    p.add_argument("--trajectories", type=_at_least_two, default=4, help="trajectories per agent per local step, >= 2 (default 4)")
    p.add_argument("--local-steps", type=positive_int, default=2, help="K of MFPO and FedAvg-PG (default 2)")
    p.add_argument("--rounds", type=positive_int, default=1, help="timed rounds after one warm-up round (default 1)")
    p.add_argument("--ppo-timesteps", type=positive_int, default=4096, help="PPO's learn() timesteps (default 4096)")
    p.add_argument("--device", default="cpu", help="torch device of the federations")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 trajectories, K = 1, 256 PPO steps (over those options)")
    p.add_argument("--seed", type=int, default=0, help="seed of the models and envs")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)
