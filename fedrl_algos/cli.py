"""The ``fedrl`` command line: ``fedrl envs``, ``fedrl demo``, ``fedrl bench``, ``fedrl reproduce``, ``fedrl flower``."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from fedrl_algos import bench, flower_cli
from fedrl_algos.reproduce import cli as reproduce_cli
from fedrl_algos.reproduce import demo


def _cmd_envs(args: argparse.Namespace) -> int:
    import fedrl_envs

    for env_id, family in fedrl_envs.FAMILIES.items():
        train, heldout = family.train_tasks, family.heldout_tasks
        one = train[0]
        print(f"{env_id}  ({type(family).__name__})")
        print(f"  observation: {family.observation_space(one)}  action: {family.action_space(one)}  horizon: {family.horizon(one)}")
        print(f"  training tasks ({len(train)}):")
        for k, task in enumerate(train):
            print(f"    agent={k}: {family.describe_task(task)}")
        if heldout:
            print(f"  held-out tasks ({len(heldout)}):")
            shown = heldout if args.all or len(heldout) <= 4 else heldout[:4]
            for k, task in enumerate(shown):
                print(f"    heldout[{k}]: {family.describe_task(task)}")
            if len(shown) < len(heldout):
                print(f"    ... {len(heldout) - len(shown)} more (fedrl envs --all)")
    return 0


def register_envs(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl envs`` to the ``fedrl`` parser."""
    envs = subparsers.add_parser(
        "envs",
        help="list every registered task family with its tasks",
        description="List every registered task family (its Gymnasium id, observation and action spaces, horizon), "
        "its training tasks (agent=k of gym.make) and its held-out tasks.",
    )
    envs.add_argument("--all", action="store_true", help="list every held-out task (default: the first 4 of each family)")
    envs.set_defaults(func=_cmd_envs)


#: the sub-commands of ``fedrl``, in the order of ``fedrl --help``: each adds itself to the parser's
#: sub-parsers. One explicit list, so that building the parser imports nothing for its side effects.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    register_envs,
    bench.register,
    demo.register,
    reproduce_cli.register,
    flower_cli.register,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fedrl`` command, one sub-command per :data:`COMMANDS` entry."""
    parser = argparse.ArgumentParser(prog="fedrl", description="Federated and personalized reinforcement learning.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="the sub-command (fedrl COMMAND --help for its options)")
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fedrl`` command line from Python (the console script and ``python -m fedrl_algos.cli`` run it through :func:`run`).

    :param argv: the arguments (``None``: ``sys.argv[1:]``)
    :return: the exit status of the sub-command (argparse exits with 2 on a usage error)
    """
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def run() -> NoReturn:
    """The ``fedrl`` console script: :func:`main`, then an exit without the interpreter's teardown.

    Tearing down a process that loaded torch (and Numba) — its modules, then the C++ libraries'
    static objects and thread pools — takes 0.6–0.8 s on the 2-core machine, 6–8 % of a
    ``fedrl reproduce fewshot``. By the time ``main`` returns every result file is written and
    closed and every forked part joined, so ``run`` runs the ``atexit`` handlers (Ray's shutdown,
    logging's flush, ...), flushes the standard streams and leaves with :func:`os._exit`. Called
    from Python, :func:`main` returns normally.
    """
    try:
        code = main()
    except SystemExit as stop:  # argparse's usage errors and --help
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be written anyway
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
