"""Intra-op threads fitted to the size of the work: small tensor operations run on one thread.

fedrl's hot paths are long chains of small operations: an env step of a few thousand rows is
about seventy torch calls of microseconds each; a rollout is hundreds of steps; a training round
is thousands of them. A multi-threaded torch op opens an OpenMP parallel region, and at these
sizes the second thread cannot pay for waking it. On a machine that also runs other work (seeds
side by side, a shared server, CI) it is worse: the region waits until every worker of the team has
been scheduled, so each small op can cost a scheduler time slice. Measured on the 2-core
development machine with two busy processes beside it (``docs/benchmarks.md``): the gridworld step at
8 × 1024 envs runs at 1.0e6 steps/s with two intra-op threads against 3.8e7 with one, and an MFPO
CartPole round is 20× slower after ``torch.set_num_threads(2)``.

So the env steps, the samplers' rollouts, the estimators and the algorithms' rounds run inside
:func:`fitted_threads`, which sets one intra-op thread while their work is below a measured
crossover (where a second thread starts to pay on a quiet machine without costing the loaded
figure), keeps the caller's setting above it, and restores the caller's setting on exit. The caller's setting is what
``torch.get_num_threads()`` returned when the outermost fitted block was entered, so a large
estimate nested inside a round that runs single-threaded still gets the user's threads; and a
user who set a thread count explicitly gets exactly that count for every op large enough to use it.

Only the CPU is affected (a CUDA tensor op launches a kernel whatever the setting). Elementwise
ops give the same bits on any number of threads; a reduction to few outputs or a matrix product
above torch's grain (32 768 elements) may round differently with another thread count, so a run is
bitwise reproducible at a fixed setting (the test suite runs at one thread, ``conftest.py``), as
it was before these blocks existed.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

__all__ = [
    "PARALLEL_MIN_ROWS",
    "PARALLEL_MIN_WORK",
    "fitted_thread_count",
    "fitted_threads",
    "intra_op_threads",
    "requested_threads",
    "with_fitted_threads",
]

#: rows of a batch of elementwise work (env steps, per-step sampling) from which the caller's
#: threads are kept. Measured on 2 cores, one against two threads, quiet machine: the CartPole,
#: Pendulum and arc-navigation steps gain nothing up to 2^15 rows (0.93-1.02x at 2^10..2^14,
#: 0.98-1.19x at 2^15) and 1.3-1.8x from 2^16 on; the gridworld step likewise (1.02x at 2^13, 1.7x at 2^16).
PARALLEL_MIN_ROWS = 2**15
#: rows × per-row cost (a policy's parameter count, an observation's elements) from which the
#: caller's threads are kept. Measured on 2 cores: the score gradient of the paper's CartPole MLP
#: (4 226 parameters) is 0.94x with two threads at 1 000 steps (4.2e6), 1.12-1.26x from 4 000 to
#: 65 000 steps (1.7e7-2.7e8) and 1.31-1.40x from 2.6e5 to 10^6 steps; a whole MFPO CartPole round
#: (10 agents x 20 trajectories, 40 000-100 000 steps an estimate) took 0.74 s with the crossover
#: at 2^24 and 0.67 s with one thread throughout, and 0.71-0.85 s quiet against 1.65-2.12 s beside two
#: busy processes with the crossover at 2^28 (1.22-1.34 s single-threaded). So two threads only from
#: 2^30 on (2.5e5 steps of that MLP), where they gain 1.3-1.4x on a quiet machine.
PARALLEL_MIN_WORK = 2**30

_T = TypeVar("_T")
_state = threading.local()


def requested_threads() -> int:
    """The intra-op threads the caller asked for: torch's setting when the outermost fitted block
    of this thread was entered, or torch's current setting outside any fitted block."""
    requested = getattr(_state, "requested", None)
    return torch.get_num_threads() if requested is None else requested


def fitted_thread_count(rows: int, row_cost: int = 1) -> int:
    """The intra-op threads for ``rows`` rows of ``row_cost`` work each: one below the crossover,
    the caller's setting (:func:`requested_threads`) at or above it. The crossover of elementwise
    work (``row_cost <= 1``: env steps) is :data:`PARALLEL_MIN_ROWS` rows; that of work through a
    policy or over whole observations (``row_cost > 1``) is :data:`PARALLEL_MIN_WORK` rows × cost.

    :param rows: rows the operations of the block run over (envs, trajectories × steps)
    :param row_cost: work of one row relative to an elementwise op on a scalar: a policy's
        parameter count, an observation's element count (1: elementwise work on a few scalars)
    """
    parallel = rows >= PARALLEL_MIN_ROWS if row_cost <= 1 else rows * int(row_cost) >= PARALLEL_MIN_WORK
    return requested_threads() if parallel else 1


@contextlib.contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads (``None``: as they are) and restore the caller's
    setting afterwards, also when the block raises.

    :param n: the thread count inside the block (``None`` leaves it)
    """
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def fitted_threads(rows: int, row_cost: int = 1, device: torch.device | str | None = None) -> Iterator[None]:
    """Run the block with the intra-op threads fitted to its work (:func:`fitted_thread_count`).

    The caller's setting is restored on exit, and blocks nest: an inner block above the crossover
    runs with the threads the caller of the *outermost* block had, not with the one thread of the
    block around it. On a device other than the CPU nothing changes.

    :param rows: rows the block's operations run over
    :param row_cost: work of one row (see :func:`fitted_thread_count`)
    :param device: where the block computes (``None``: the CPU)
    """
    if device is not None and torch.device(device).type != "cpu":
        yield
        return
    outer = getattr(_state, "requested", None)
    _state.requested = torch.get_num_threads() if outer is None else outer
    try:
        with intra_op_threads(fitted_thread_count(rows, row_cost)):
            yield
    finally:
        _state.requested = outer


def with_fitted_threads(work: Callable[..., tuple[int, int, Any]]) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Decorate a method or function to run inside :func:`fitted_threads`.

    :param work: called with the decorated function's arguments; returns ``(rows, row_cost, device)``
    """

    def decorate(func: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> _T:
            rows, row_cost, device = work(*args, **kwargs)
            with fitted_threads(rows, row_cost, device):
                return func(*args, **kwargs)

        return wrapper

    return decorate
