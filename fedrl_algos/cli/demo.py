"""``fedrl demo``: the command of :func:`fedrl_algos.reproduce.demo.run_demo`."""

from __future__ import annotations

import argparse

import torch

from fedrl_algos.cli.args import non_negative_int, positive_int
from fedrl_algos.reproduce.demo import DTYPES, check_demo_args, run_demo
from fedrl_envs.validation import check_device

__all__ = ["register"]


def _cmd_demo(args: argparse.Namespace) -> int:
    """Run ``fedrl demo`` with the parsed ``args``; bad values end with ``fedrl demo: error: ...``."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    try:
        device = str(check_device(device, "--device"))
        check_demo_args(rounds=args.rounds, seeds=args.seeds, seed=args.seed, adapt_trajectories=args.adapt_trajectories,
                        eval_trajectories=args.eval_trajectories, dtype=args.dtype)
    except ValueError as err:
        raise SystemExit(f"fedrl demo: error: {err}") from None
    # run_demo computes on one intra-op thread on CPU (neural.CPU_THREADS)
    run_demo(rounds=args.rounds, seeds=args.seeds, seed=args.seed, device=device, out=args.out,
             adapt_trajectories=args.adapt_trajectories, eval_trajectories=args.eval_trajectories, dtype=args.dtype,
             progress_bar=not args.no_progress)
    return 0


def _at_least_two(text: str) -> int:
    """``argparse`` type of ``--adapt-trajectories``: the leave-one-out baseline needs two trajectories."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer >= 2 (the leave-one-out baseline needs another trajectory), got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl demo`` to the ``fedrl`` parser.

    :param subparsers: the ``fedrl`` parser's sub-command set
    """
    demo = subparsers.add_parser(
        "demo",
        help="meta-train on arc navigation over seeds, adapt to unseen goals, compare with learning from scratch",
        description="Meta-trains first-order Per-FedAvg-PG (leave-one-out baselines in the inner step and the outer "
        "gradient) on the 6 arc-navigation training goals for every seed at once, adapts each seed's initialization to "
        "the 3 held-out goals with one policy-gradient step, compares with from-scratch training at the same budget, "
        "prints mean ± standard deviation over seeds and on how many seeds adaptation helped, and draws the first "
        "seed's held-out rollouts before and after adaptation (adapted through PerFedAvgPG.adapt).",
    )
    demo.add_argument("--rounds", type=positive_int, default=150, help="meta-training communication rounds (default: 150)")
    demo.add_argument("--seeds", type=positive_int, default=10, metavar="N",
                      help="number of seeds, trained in one batch (default: 10)")
    demo.add_argument("--seed", type=non_negative_int, default=0,
                      help="first seed: the seeds are SEED..SEED+N-1, the figure draws SEED (default: 0)")
    demo.add_argument("--device", default="cpu", help="torch device: cpu, cuda or auto (default: cpu)")
    demo.add_argument("--out", default="fedrl-demo", metavar="DIR",
                      help="output directory of the figure heldout_rollouts.png, created if missing (default: fedrl-demo)")
    demo.add_argument("--adapt-trajectories", type=_at_least_two, default=200,
                      help="trajectories per goal of the adaptation step, and the from-scratch budget (default: 200)")
    demo.add_argument("--eval-trajectories", type=positive_int, default=1000,
                      help="evaluation rollouts per seed and held-out goal (default: 1000)")
    demo.add_argument("--dtype", choices=list(DTYPES), default="float32",
                      help="floating-point type of the parameters; float64 checks that the conclusion does not hang on "
                      "float32 rounding (default: float32)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_cmd_demo)
