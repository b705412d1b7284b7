"""``fedrl bench <target>``: one sub-parser per target of :data:`fedrl_algos.bench.TARGETS`, each
with ``--background-load N``."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
from collections.abc import Callable

from fedrl_algos.bench import TARGETS
from fedrl_algos.cli.args import non_negative_int

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench <target>`` to the ``fedrl`` parser: one sub-parser per :data:`TARGETS` entry."""
    bench = subparsers.add_parser(
        "bench", help="throughput benchmarks against same-process baselines",
        description="Throughput benchmarks, each next to its baseline measured in the same process: "
        "fedrl bench envs (env steps/s), fedrl bench algos (a training round, batched vs looped), "
        "fedrl bench single (one single-env step vs Gymnasium/NumPy, SB3 PPO), "
        "fedrl bench reference (training rounds vs the papers' reference implementations), "
        "fedrl bench memory (peak RSS of rollouts at growing envs x steps), "
        "fedrl bench mujoco (training env steps/s on a MuJoCo env vs SB3's PPO), "
        "fedrl bench kernels (the arc policy's compiled kernels vs its torch kernels). Every target prints its peak "
        "RSS and takes --background-load N.",
    )
    targets = bench.add_subparsers(dest="bench_target", required=True, metavar="TARGET", help="what to benchmark")
    for name, module in TARGETS.items():
        getattr(importlib.import_module(f"fedrl_algos.bench.{module}"), f"add_{name}_target")(targets)
    for parser in targets.choices.values():
        parser.add_argument(
            "--background-load", type=non_negative_int, default=0, metavar="N",
            help="run N busy processes (one core each, ended with the benchmark, at most an hour) beside the "
            "timing, for the figure on a loaded machine (default 0)",
        )
        parser.set_defaults(func=_under_background_load(parser.get_default("func")))


def _under_background_load(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A target's command run beside ``args.background_load`` busy processes (:mod:`fedrl_algos.bench.background_load`)."""

    @functools.wraps(run)
    def command(args: argparse.Namespace) -> int:
        n = getattr(args, "background_load", 0)
        if not n:
            return run(args)
        from fedrl_algos.bench.background_load import background_load

        with background_load(n):
            print(f"background load: {n} busy process(es) beside the timing ({os.cpu_count()} cores)")
            return run(args)

    return command
