"""``fedrl bench training``: env steps per second of whole training rounds against the bare env.

For each configuration (the paper settings' defaults of MFPO and FedPG-BR on ``fedrl/CartPole-v0``
and Per-FedAvg-PG on ``fedrl/ArcNavigation-v0``) it times ``learn`` over whole rounds, after one
warm-up round, and divides the env steps the rounds consumed (``num_timesteps``, exact trajectory
accounting) by the wall time: everything a round does — policy forwards in the rollout, sampling,
the estimators, aggregation — is in that figure. Next to it, the bare native vector env of the same
agents at the batch the algorithm samples at (its trajectories per agent per sampling call) steps
with random actions drawn before the clock starts. The fraction is training / bare: 1.0 would mean
the learner costs nothing beyond stepping its envs.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from fedrl_algos._cli_args import positive_int, set_threads, write_json

__all__ = ["TrainingBenchRecord", "bench_training", "add_training_target", "CONFIGS"]

#: name -> (algorithm class name, policy, env id)
CONFIGS: dict[str, tuple[str, str, str]] = {
    "mfpo-cartpole": ("MFPO", "MlpPolicy", "fedrl/CartPole-v0"),
    "fedpg_br-cartpole": ("FedPGBR", "MlpPolicy", "fedrl/CartPole-v0"),
    "per_fedavg_pg-arc": ("PerFedAvgPG", "MlpPolicy", "fedrl/ArcNavigation-v0"),
}


@dataclasses.dataclass
class TrainingBenchRecord:
    """One row of ``fedrl bench training``."""

    config: str
    n_agents: int
    envs_per_agent: int
    rounds: int
    env_steps: int
    training_steps_per_s: float
    bare_env_steps_per_s: float

    @property
    def fraction(self) -> float:
        """Training env steps/s over the bare env's at the same batch."""
        return self.training_steps_per_s / self.bare_env_steps_per_s


def _sampling_batch(model: Any) -> int:
    """Trajectories per agent the model samples in one call (its inner batch)."""
    for name in ("n_trajectories", "m_in", "inner_batch_size"):
        value = getattr(model, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"cannot tell the sampling batch of {type(model).__name__}")


def _bare_rate(model: Any, envs_per_agent: int, min_time: float, seed: int) -> float:
    import torch

    from fedrl_envs.core import FamilyVectorEnv

    venv = FamilyVectorEnv(model.family, model.agent_params, n_envs=envs_per_agent, device=model.device, seed=seed)
    venv.reset()
    space = venv.single_action_space
    gen = torch.Generator().manual_seed(seed)
    if hasattr(space, "n"):
        actions = torch.randint(0, int(space.n), (16, venv.num_envs), generator=gen)
    else:
        actions = torch.rand((16, venv.num_envs, *space.shape), generator=gen) * 2 - 1
    actions = actions.to(venv.device)
    for k in range(3):
        venv.step(actions[k])
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < min_time:
        venv.step(actions[calls % 16])
        calls += 1
    rate = calls * venv.num_envs / (time.perf_counter() - start)
    venv.close()
    return rate


def bench_training(
    configs: Sequence[str] = tuple(CONFIGS),
    rounds: int = 2,
    device: str = "cpu",
    min_time: float = 1.0,
    seed: int = 0,
    show: bool = True,
) -> list[TrainingBenchRecord]:
    """Time whole training rounds of each configuration and the bare env at the same batch.

    :param configs: names from :data:`CONFIGS`
    :param rounds: timed rounds (after one warm-up round)
    :param device: torch device
    :param min_time: seconds of the bare-env timing
    :param seed: seed of the models and envs
    :param show: print the table
    """
    import fedrl_algos
    from fedrl_envs.core import check_int

    for name in configs:
        if name not in CONFIGS:
            raise ValueError(f"configs must be among {list(CONFIGS)}, got {name!r}")
    rounds = check_int("rounds", rounds, 1)
    records = []
    for name in configs:
        cls_name, policy, env_id = CONFIGS[name]
        model = getattr(fedrl_algos, cls_name)(policy, env_id, seed=seed, device=device)
        model.learn(total_rounds=1)
        before, start = model.num_timesteps, time.perf_counter()
        model.learn(total_rounds=rounds, reset_num_timesteps=False)
        elapsed = time.perf_counter() - start
        steps = model.num_timesteps - before
        batch = _sampling_batch(model)
        records.append(
            TrainingBenchRecord(
                config=name,
                n_agents=model.n_agents,
                envs_per_agent=batch,
                rounds=rounds,
                env_steps=int(steps),
                training_steps_per_s=steps / elapsed,
                bare_env_steps_per_s=_bare_rate(model, batch, min_time, seed),
            )
        )
    if show:
        print_training_table(records)
    return records


def print_training_table(records: Sequence[TrainingBenchRecord]) -> None:
    """Print the records with the training / bare-env fraction."""
    import torch

    header = ["config", "agents x envs", "rounds", "env steps", "training/s", "bare env/s", "fraction"]
    lines = [header] + [
        [r.config, f"{r.n_agents} x {r.envs_per_agent}", str(r.rounds), str(r.env_steps),
         f"{r.training_steps_per_s:.3g}", f"{r.bare_env_steps_per_s:.3g}", f"{r.fraction:.2f}"]
        for r in records
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))))
    print(f"env steps per second of whole learn() rounds vs the bare native vector env at the same batch; "
          f"{torch.get_num_threads()} torch threads; method: fedrl_algos/bench_training.py")


def _cmd(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    records = bench_training(configs=args.configs, rounds=1 if args.quick else args.rounds, device=args.device,
                             min_time=0.05 if args.quick else 1.0, seed=args.seed)
    write_json(args.json, [dataclasses.asdict(r) | {"fraction": r.fraction} for r in records])
    return 0


def add_training_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench training`` to the bench sub-commands."""
    p = targets.add_parser(
        "training",
        help="env steps/s of whole training rounds vs the bare env at the same batch",
        description="Env steps per second of MFPO and FedPG-BR on CartPole and Per-FedAvg-PG on arc navigation, "
        "whole learn() rounds, next to the bare native vector env of the same agents at the same batch.",
    )
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="configurations to time")
    p.add_argument("--rounds", type=positive_int, default=2, help="timed rounds after one warm-up round (default 2)")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="a smoke run: one timed round, tiny env timing")
    p.add_argument("--seed", type=int, default=0, help="seed of the models and envs")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)
