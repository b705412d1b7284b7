"""``fedrl train``: train a federation over several seeds with logs, checkpoints, a learning curve and a summary.

The work is :func:`fedrl_algos.zoo.train_runs`; this module is its arguments. Every flag is also a
key of a YAML/TOML config file (``--config``), the flags given on the command line winning.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from fedrl_algos.cli.args import non_negative_int, positive_int

__all__ = ["register"]

_EPILOG = """\
outputs (OUT = --out):
  OUT/config.json                 the resolved settings, versions and command line
  OUT/seed_<k>/progress.csv       SB3's CSV log: eval/return, eval/agent_<i>/return, ... every --log-interval rounds
  OUT/seed_<k>/checkpoints/       model_<steps>_steps.zip every --checkpoint-every rounds
  OUT/seed_<k>/model.zip          the final model (Class.load)
  OUT/learning_curve.png          evaluation return vs environment steps, mean +- s.e. over seeds
  OUT/summary.md, summary.csv     final evaluation return per agent, mean +- s.e. over seeds

Rerunning the same command on OUT resumes every seed from its newest checkpoint (bitwise, as an
uninterrupted run) and skips finished seeds; a larger --budget or --rounds trains on from model.zip.

example:
  fedrl train --algo mfpo --env LunarLander-v3 --agent-kwargs agents.json --seeds 3 --budget 2e5 \\
      --device cpu --out runs/mfpo
  fedrl plot runs/mfpo runs/fedavg_pg --out comparison.png
Reference: docs/train.md."""


def _budget(text: str) -> float:
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of environment steps such as 200000 or 2e5, got {text!r}") from None
    if not (value >= 1 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number of environment steps >= 1, got {text}")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"must be a whole number of environment steps, got {text}")
    return value


def _cmd_train(args: argparse.Namespace) -> int:
    from fedrl_algos.zoo import TrainConfigError, load_config_file, merge_settings, resolve_config, train_runs

    parser: argparse.ArgumentParser = args.parser
    if args.seed_list is not None and (args.seeds is not None or args.seed is not None):
        parser.error("--seed-list gives the seeds: use it without --seeds and --seed")
    flags: dict[str, Any] = {
        key: getattr(args, key)
        for key in ("algo", "env", "agent_kwargs", "n_agents", "algo_kwargs", "policy", "policy_kwargs", "seeds", "seed",
                    "seed_list", "budget", "rounds", "eval_trajectories", "log_interval", "checkpoint_every", "tensorboard",
                    "per_agent", "device", "progress", "verbose", "out")
    }
    flags["env_module"] = args.env_module or None
    try:
        from_file = load_config_file(args.config) if args.config else {}
        if from_file.get("env_module") is not None and flags["env_module"] is not None:  # repeatable: both count
            listed = from_file["env_module"]
            flags["env_module"] = [*([listed] if isinstance(listed, str) else listed), *flags["env_module"]]
        config = resolve_config(merge_settings(from_file, flags))
    except TrainConfigError as err:
        parser.error(str(err))
    argv = ["fedrl", *sys.argv[1:]] if sys.argv and sys.argv[0] else None
    try:
        train_runs(config, argv=argv)
    except TrainConfigError as err:  # what is checked once the first model is built (the budget, the run directory)
        parser.error(str(err))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl train`` to the ``fedrl`` parser."""
    from fedrl_algos import ALGORITHMS

    train = subparsers.add_parser(
        "train",
        help="train a federation over seeds: logs, checkpoints (resumable), learning curve, summary table",
        description=textwrap.fill(
            "Train one algorithm on one federation for every seed, in turn: SB3's logger writes progress.csv "
            "(TensorBoard with --tensorboard) with the evaluation every --log-interval rounds, a checkpoint is saved every "
            "--checkpoint-every rounds and the final model at the end; then the learning curve (mean +- standard error "
            "over seeds) and a summary table of the final returns per agent. Every setting is checked before training "
            "starts. Every flag is also a key of a --config file.", 100),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = train.add_argument_group("what to train")
    what.add_argument("--config", metavar="FILE", help="a YAML (.yaml/.yml), TOML (.toml) or JSON file whose keys are these "
                      "flags' names (agent_kwargs, budget, ...); the flags given here override it")
    what.add_argument("--algo", choices=sorted(ALGORITHMS), help="the algorithm (fedavg_sb3 also needs "
                      "--algo-kwargs '{\"algorithm_class\": \"PPO\"}' or DQN, SAC, ...)")
    what.add_argument("--env", help="a registered id: a Gymnasium env (Pendulum-v1, your own), a fedrl family "
                      "(fedrl/GridWorld-v0), or MODULE:ID, which imports MODULE first")
    what.add_argument("--env-module", action="append", default=[], metavar="MODULE",
                      help="import MODULE first: a module of yours whose import calls gymnasium.register (repeatable)")
    agents = what.add_mutually_exclusive_group()
    agents.add_argument("--agent-kwargs", metavar="FILE|JSON",
                        help="one dict of gym.make arguments per agent: a JSON/YAML/TOML file holding a list of dicts, or "
                        "the JSON text itself, e.g. '[{\"g\": 9.0}, {\"g\": 11.0}]' (a fedrl family: make_params arguments; "
                        "default there: the family's training tasks)")
    agents.add_argument("--n-agents", type=positive_int, metavar="N", help="N identical agents of a Gymnasium id")
    what.add_argument("--algo-kwargs", metavar="FILE|JSON", help="constructor arguments of the algorithm, as a JSON "
                      "object or a file, e.g. '{\"local_steps\": 5, \"n_trajectories\": 10}' (see docs/algorithms/)")
    what.add_argument("--policy", help="the policy: MlpPolicy (default), TabularPolicy or CnnPolicy")
    what.add_argument("--policy-kwargs", metavar="FILE|JSON", help="keyword arguments of the policy, e.g. '{\"net_arch\": [64, 64]}'")
    how_long = train.add_argument_group("how long, which seeds")
    length = how_long.add_mutually_exclusive_group()
    length.add_argument("--budget", type=_budget, metavar="STEPS",
                        help="total environment steps summed over all agents (and over the trajectories of every local "
                        "step), exactly learn(total_timesteps=STEPS): training stops after the round that reaches it, so "
                        "it is rounded up to whole rounds; e.g. 2e5")
    length.add_argument("--rounds", type=positive_int, help="communication rounds instead of --budget")
    how_long.add_argument("--seeds", type=positive_int, metavar="N", help="number of seeds: --seed, --seed + 1, ... (default 1)")
    how_long.add_argument("--seed", type=non_negative_int, help="the first seed (default 0)")
    how_long.add_argument("--seed-list", metavar="S1,S2,...", help="explicit seeds, comma-separated (instead of --seeds/--seed)")
    how_long.add_argument("--device", help="torch device: cpu, cuda, cuda:1 or auto (default auto: CUDA when available)")
    logs = train.add_argument_group("logs, evaluation, checkpoints")
    logs.add_argument("--out", metavar="DIR", help="the run directory (required; rerunning on it resumes)")
    logs.add_argument("--eval-trajectories", type=non_negative_int, metavar="M",
                      help="evaluation episodes per agent at every log (default 32, the library's; 0: no Monte Carlo evaluation). Each "
                      "evaluation costs M episodes per agent, and FedAvgPG/PerFedAvgPG add their adaptation step's "
                      "trajectories and M adapted episodes per agent")
    logs.add_argument("--log-interval", type=positive_int, metavar="ROUNDS", help="rounds between two logs and evaluations (default 1)")
    logs.add_argument("--checkpoint-every", type=non_negative_int, metavar="ROUNDS",
                      help="rounds between two checkpoints (default 10; 0: none, only the final model)")
    logs.add_argument("--tensorboard", action="store_const", const=True, help="also write TensorBoard event files into seed_<k>/")
    logs.add_argument("--per-agent", action="store_const", const=True, help="per-agent lines in learning_curve.png")
    logs.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="no progress bars")
    logs.add_argument("--verbose", action="store_const", const=1, help="print the logger's table at every log")
    train.set_defaults(func=_cmd_train, parser=train)
