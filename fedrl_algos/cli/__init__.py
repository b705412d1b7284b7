"""The ``fedrl`` command line: ``fedrl envs``, ``fedrl train``, ``fedrl plot``, ``fedrl bench``, ``fedrl demo``,
``fedrl reproduce``, ``fedrl flower``.

All of it lives in this package: one module per sub-command (its arguments and what it runs)
and :mod:`.args`, the argument types and output helpers they share. The work itself is the
library's (:mod:`fedrl_algos.zoo`, :mod:`fedrl_algos.reproduce`, :mod:`fedrl_algos.bench`, :mod:`fedrl_algos.flower`).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from fedrl_algos.cli import bench, demo, envs, flower, plot, reproduce, train

#: the sub-commands of ``fedrl``, in the order of ``fedrl --help``: each adds itself to the parser's
#: sub-parsers. One explicit list, so that building the parser imports nothing for its side effects.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    envs.register,
    train.register,
    plot.register,
    bench.register,
    demo.register,
    reproduce.register,
    flower.register,
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
