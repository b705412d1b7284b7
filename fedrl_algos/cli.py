"""The ``fedrl`` command line: ``fedrl envs``, ``fedrl demo``, ``fedrl bench``, ``fedrl reproduce``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fedrl`` command (sub-commands register themselves here)."""
    parser = argparse.ArgumentParser(prog="fedrl", description="Federated and personalized reinforcement learning.")
    sub = parser.add_subparsers(dest="command", required=True)
    envs = sub.add_parser("envs", help="list every registered task family with its tasks")
    envs.add_argument("--all", action="store_true", help="list every held-out task")
    envs.set_defaults(func=_cmd_envs)
    import fedrl_algos.reproduce.cli  # noqa: F401  (appends ``fedrl reproduce`` to _EXTRA_COMMANDS)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


#: functions ``register(subparsers)`` adding further sub-commands (demo, bench, reproduce)
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []

from fedrl_algos import bench as _bench  # noqa: E402  (registers ``fedrl bench``)

_EXTRA_COMMANDS.append(_bench.register)

from fedrl_algos.reproduce import demo as _demo  # noqa: E402  (registers ``fedrl demo``)

_EXTRA_COMMANDS.append(_demo.register)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedrl`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    # ``python -m fedrl_algos.cli``: run the imported module's main, whose command registry the
    # sub-command modules (``fedrl reproduce``) extend; this ``__main__`` copy has its own, empty one.
    from fedrl_algos.cli import main as _main

    sys.exit(_main())
