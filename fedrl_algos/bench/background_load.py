"""Busy processes beside a benchmark (``fedrl bench ... --background-load N``): its figure under load.

fedrl runs where other work runs too (seeds side by side, a shared server, CI), and small tensor
operations behave differently there: a multi-threaded op waits for every worker of its OpenMP team
to be scheduled (:mod:`fedrl_envs.threads`). A benchmark timed on a quiet machine cannot show that,
so every ``fedrl bench`` target takes ``--background-load N``: N processes that each spin one core in
pure Python (no torch, no threads of their own) while the benchmark runs.

They are bounded and always ended: each exits by itself after ``max_seconds`` or as soon as the
process that started it is gone (it polls its parent every 0.1 s, so a benchmark killed by SIGKILL
leaves nothing behind), and :func:`background_load` terminates them when its block ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["BUSY_LOOP", "background_load"]

#: the program of one busy process: spin until ``max_seconds`` passed or the parent (argv[2]) is gone
BUSY_LOOP = """
import os, sys, time
end, parent = time.monotonic() + float(sys.argv[1]), int(sys.argv[2])
check = time.monotonic()
while time.monotonic() < end:
    for _ in range(20000):
        pass
    if time.monotonic() - check > 0.1:
        check = time.monotonic()
        if os.getppid() != parent:
            break
"""


@contextlib.contextmanager
def background_load(n: int, max_seconds: float = 3600.0) -> Iterator[list[subprocess.Popen]]:
    """Run the block beside ``n`` busy processes (none for ``n = 0``), ending them afterwards.

    :param n: busy processes (each spins one core)
    :param max_seconds: each process exits by itself after this many seconds
    :return: the processes (for inspection)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds!r}")
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY_LOOP, str(float(max_seconds)), str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGTERM
                proc.kill()
                proc.wait()
