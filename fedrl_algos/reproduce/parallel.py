"""Independent parts of a reproduction program run at the same time, on the machine's second core.

The reproduction programs are single-threaded on purpose (``CPU_THREADS``: a second intra-op thread
changes the order of some reductions, hence the bits, and on shared cores it spin-waits). What a
second core can still do without touching a single number is run a *separate* part of the program:
a method's training while another method trains, the exact evaluation at some α values while the
others are evaluated, the Hessian batch of one m_h setting while another setting's is drawn. Each
part executes the operations it executes in the serial program, from its own random streams, so
its results are bitwise those of the serial program; only the order in which the parts run
changes. (Where a caller splits one batch into parts — ``alpha``'s runs by α — it relies on a
tested guarantee that a run's result does not depend on the rest of its batch; it never splits a
computation whose rounding depends on the layout, such as the exact evaluator's chunks.)

Two mechanisms, for two kinds of parts:

* :func:`run_forked` — each part but the first in a forked child process (the first in this one).
  For parts made of many small tensor operations (the tabular programs: a few thousand elements per
  operation), whose cost is the Python and dispatcher overhead of each call: that overhead holds the
  GIL, so threads would run them one at a time.
* :func:`run_threaded` — each part in a thread. For parts made of large tensor operations (the
  curvature batches: milliseconds per operation), during which PyTorch releases the GIL; threads
  share the tensors without copying them.

Both run the parts one after the other (in this thread, in order) when ``workers <= 1``, and
:func:`run_forked` also when forking is not safe: not on the main thread (another thread's locks
would be copied held), a device other than the CPU (CUDA does not survive a fork), or a platform
without ``fork``. The number of workers is the experiment config's ``workers`` field
(:data:`DEFAULT_WORKERS`); results never depend on it.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

__all__ = ["DEFAULT_WORKERS", "balanced_groups", "can_fork", "check_workers", "run_forked", "run_threaded"]

T = TypeVar("T")

#: concurrent parts of a reproduction program: the project's reference machine has 2 cores
DEFAULT_WORKERS = 2


def check_workers(workers: Any) -> int:
    """``workers`` as a positive int (``ValueError`` naming the argument otherwise)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    return workers


def balanced_groups(items: Sequence[T], cost: Callable[[T], float], n_groups: int) -> list[list[T]]:
    """``items`` in at most ``n_groups`` non-empty groups of similar total cost (each item, most costly
    first, joins the group with the least cost so far), heaviest group first; a group keeps the
    items' order. ``n_groups = 1``: one group, all items in order.

    :param items: hashable work items
    :param cost: the relative cost of an item
    :param n_groups: the most groups
    """
    loads: list[tuple[float, list[T]]] = [(0.0, []) for _ in range(min(n_groups, len(items)))]
    for item in sorted(items, key=cost, reverse=True):
        k = min(range(len(loads)), key=lambda j: loads[j][0])
        loads[k] = (loads[k][0] + cost(item), loads[k][1] + [item])
    order = {item: i for i, item in enumerate(items)}
    loads.sort(key=lambda load: -load[0])
    return [sorted(group, key=order.__getitem__) for _, group in loads if group]


def can_fork(device: str | torch.device = "cpu") -> bool:
    """Whether :func:`run_forked` may fork here: a CPU device, the main thread, and ``fork`` available."""
    return (
        torch.device(device).type == "cpu"
        and threading.current_thread() is threading.main_thread()
        and "fork" in multiprocessing.get_all_start_methods()
    )


def _child(task: Callable[[], Any], conn: Any) -> None:
    """Body of a forked child: run ``task``, send back the pickled result (or the error), exit."""
    try:
        payload = pickle.dumps(("ok", task()), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the parent, which raises it
        payload = pickle.dumps(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    try:
        conn.send_bytes(payload)
        conn.close()
    finally:
        os._exit(0)  # no atexit handlers, no flushing of buffers inherited from the parent


def run_forked(tasks: Sequence[Callable[[], T]], workers: int, device: str | torch.device = "cpu") -> list[T]:
    """Run independent ``tasks`` at the same time, ``tasks[0]`` here and each other one in a forked child.

    :param tasks: callables without arguments; their results must pickle (tensors, lists, dataclasses)
    :param workers: the most tasks that may run at once; unless it is ``1`` (run them one after the
        other here), ``len(tasks)`` must not exceed it: the caller groups its work into that many
        balanced parts (:func:`balanced_groups`)
    :param device: the device the tasks compute on (only a CPU program is forked)
    :return: the tasks' results, in order
    :raises RuntimeError: when a child fails (with its traceback)
    """
    workers = check_workers(workers)
    if len(tasks) <= 1 or workers == 1 or not can_fork(device):
        return [task() for task in tasks]
    if len(tasks) > workers:
        raise ValueError(f"tasks must be at most workers={workers} parts, got {len(tasks)}")
    ctx = multiprocessing.get_context("fork")
    children = []
    for task in tasks[1:]:
        receive, send = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_child, args=(task, send), daemon=True)
        process.start()
        send.close()  # the child holds its own copy; EOF reaches the parent if the child dies
        children.append((process, receive))
    results: list[Any] = [None] * len(tasks)
    try:
        results[0] = tasks[0]()
    finally:
        errors = []
        for k, (process, receive) in enumerate(children, start=1):
            try:
                status, value = pickle.loads(receive.recv_bytes())
            except EOFError:
                status, value = "error", f"the child process exited with code {process.exitcode} without a result"
            finally:
                receive.close()
                process.join()
            if status == "ok":
                results[k] = value
            else:
                errors.append(f"part {k}: {value}")
    if errors:
        raise RuntimeError("a forked part of the program failed:\n" + "\n".join(errors))
    return results


def run_threaded(tasks: Sequence[Callable[[], T]], workers: int) -> list[T]:
    """Run independent ``tasks`` on ``workers`` threads (``1``: one after the other here); results in order.

    Each thread uses the caller's intra-op thread count, so every operation runs exactly as it
    would in the caller.

    :param tasks: callables without arguments
    :param workers: threads
    """
    workers = check_workers(workers)
    if len(tasks) <= 1 or workers == 1:
        return [task() for task in tasks]
    threads = torch.get_num_threads()

    def call(task: Callable[[], T]) -> T:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return task()

    with ThreadPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        return list(pool.map(call, tasks))
