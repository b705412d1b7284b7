"""``fedrl envs``: every registered task family with its tasks."""

from __future__ import annotations

import argparse

__all__ = ["register"]


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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl envs`` to the ``fedrl`` parser."""
    envs = subparsers.add_parser(
        "envs",
        help="list every registered task family with its tasks",
        description="List every registered task family (its Gymnasium id, observation and action spaces, horizon), "
        "its training tasks (agent=k of gym.make) and its held-out tasks.",
    )
    envs.add_argument("--all", action="store_true", help="list every held-out task (default: the first 4 of each family)")
    envs.set_defaults(func=_cmd_envs)
