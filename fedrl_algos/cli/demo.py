"""``fedrl demo``: the command of :func:`fedrl_algos.reproduce.demo.run_demo`."""

from __future__ import annotations

import argparse

import torch

from fedrl_algos.cli.args import positive_int
from fedrl_algos.reproduce.demo import run_demo
from fedrl_envs.validation import check_device

__all__ = ["register"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from fedrl_algos.reproduce.neural import cpu_threads

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    try:
        device = str(check_device(device, "--device"))
    except ValueError as err:
        raise SystemExit(f"fedrl demo: error: {err}") from None
    with cpu_threads(device):  # small ops: one intra-op thread on CPU (see neural.CPU_THREADS)
        run_demo(rounds=args.rounds, seed=args.seed, device=device, out=args.out,
                 adapt_trajectories=args.adapt_trajectories, progress_bar=not args.no_progress)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl demo`` to the ``fedrl`` parser."""
    demo = subparsers.add_parser(
        "demo",
        help="meta-train on arc navigation, adapt to unseen goals, compare with learning from scratch",
        description="Meta-trains first-order Per-FedAvg-PG on the 6 arc-navigation training goals, adapts the "
        "initialization to the 3 held-out goals with one policy-gradient step, compares with from-scratch "
        "training at the same budget and draws held-out rollouts before and after adaptation.",
    )
    demo.add_argument("--rounds", type=positive_int, default=150, help="meta-training communication rounds (default: 150)")
    demo.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    demo.add_argument("--device", default="cpu", help="torch device: cpu, cuda or auto (default: cpu)")
    demo.add_argument("--out", default="fedrl-demo", metavar="DIR",
                      help="output directory of the figure heldout_rollouts.png, created if missing (default: fedrl-demo)")
    demo.add_argument("--adapt-trajectories", type=positive_int, default=200,
                      help="trajectories of the adaptation step and from-scratch budget (default: 200)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_cmd_demo)
