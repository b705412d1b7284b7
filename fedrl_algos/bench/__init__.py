"""``fedrl bench``: throughput benchmarks, each next to its baseline measured in the same process.

One module per target (``fedrl bench <target>``): :mod:`.envs` (the federated env against NumPy and
Gymnasium), :mod:`.algos` (a training round batched against looped), :mod:`.vector` (CartPole and
Pendulum against Gymnasium, gymnax and EnvPool), :mod:`.training` (whole training rounds against the
bare env), :mod:`.reference` (against the papers' reference implementations), :mod:`.single` (one
single-env step), :mod:`.flower` (Flower's simulation against one process), :mod:`.memory` (peak
RSS of rollouts), :mod:`.mujoco` (against SB3's PPO on MuJoCo) and :mod:`.kernels` (compiled
against torch kernels). Each module has an ``add_<target>_target(targets)`` that adds its parser;
:data:`TARGETS` lists them and :func:`register` builds ``fedrl bench`` from it, giving every target
``--background-load N`` (:mod:`.background_load`). The targets are imported only when the command
line is built, so importing ``fedrl_algos`` imports none of them.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
from collections.abc import Callable

from fedrl_algos._cli_args import non_negative_int

__all__ = ["TARGETS", "register"]

#: the ``fedrl bench`` targets in the order of ``fedrl bench --help``: target name -> module of
#: :mod:`fedrl_algos.bench` with an ``add_<target>_target(targets)`` function
TARGETS: dict[str, str] = {
    "envs": "envs",
    "algos": "algos",
    "vector": "vector",
    "training": "training",
    "reference": "reference",
    "single": "single",
    "flower": "flower",
    "memory": "memory",
    "mujoco": "mujoco",
    "kernels": "kernels",
}


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
        getattr(importlib.import_module(f"{__name__}.{module}"), f"add_{name}_target")(targets)
    for parser in targets.choices.values():
        parser.add_argument(
            "--background-load", type=non_negative_int, default=0, metavar="N",
            help="run N busy processes (one core each, ended with the benchmark, at most an hour) beside the "
            "timing, for the figure on a loaded machine (default 0)",
        )
        parser.set_defaults(func=_under_background_load(parser.get_default("func")))


def _under_background_load(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A target's command run beside ``args.background_load`` busy processes (:mod:`.background_load`)."""

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
