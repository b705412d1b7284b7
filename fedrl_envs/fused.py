"""Fused CPU steps: a family's transition, time limit and autoreset bookkeeping in one compiled pass.

A torch (or NumPy) CPU operation costs microseconds however small its input, and at 10^5
environments every operation also streams its inputs and output through memory: a CartPole step
of the native vector env is about 70 of them. With ``kernels="numba"`` a family that has a fused
step (:attr:`TaskFamily.fused_kernels <fedrl_envs.core.TaskFamily>`) runs the transition, the
termination test, the time limit, the observation copies and the list of rows to reset as one
loop compiled by `Numba <https://numba.pydata.org>`_; the resets of those rows are then drawn by
the vector env's NumPy twin of its torch draw (the same bits).

**The same numbers.** A fused step compiles the family's own arithmetic, the functions its torch
kernel calls (for CartPole: :func:`~fedrl_envs.cartpole.push`,
:func:`~fedrl_envs.cartpole.accelerations`, :func:`~fedrl_envs.cartpole.euler`,
:func:`~fedrl_envs.cartpole.is_terminal`), through :func:`float32_twin`, so there is one source of
truth for the dynamics. Torch applies a Python float to a float32 tensor in float32 and rounds
every operation separately; the twin does the same (its float constants are float32, and Numba
does not contract ``a * b + c`` into fused multiply-adds unless asked to). Transcendental
functions are the one place where libraries round differently, so a fused step takes them from
torch (``torch.cos``/``torch.sin`` of the batch, two vectorized calls). Trajectories are therefore
bitwise those of ``kernels="torch"`` (``tests/test_fused_kernels.py``).

Numba is optional (``pip install "fedrl[fast]"``); it is imported, and the loops compiled, the
first time a fused step runs (about a second; Numba's on-disk cache keeps the compiled code for
later processes where the package directory is writable).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["numba_available", "float32_twin", "jit", "kernel"]


@functools.cache
def numba_available() -> bool:
    """Whether Numba can be imported (what ``kernels="numba"`` and the compiled rollout steps need)."""
    try:
        _numba()
    except ImportError:
        return False
    return True


@functools.cache
def _numba() -> Any:
    try:
        import numba
    except ImportError as error:  # pragma: no cover - exercised where numba is missing
        raise ImportError('kernels="numba" needs Numba: pip install "fedrl[fast]" (or pip install numba)') from error
    return numba


def jit(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` compiled by Numba for the fused steps (no GIL held, no bounds checks, NumPy's division semantics).

    ``error_model="numpy"``: a division by zero gives inf or nan as torch's does, instead of raising.
    """
    return _numba().njit(nogil=True, boundscheck=False, error_model="numpy", cache=True)(func)


def float32_twin(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` compiled by Numba with every Python float it reads from its module as a float32 constant.

    The family's arithmetic (e.g. ``GRAVITY * sin``) then computes in float32 on float32
    arguments, as torch and NumPy compute a Python float times a float32 array; left as a
    Python float, Numba would promote the expression to float64 and round it differently. The
    function's code is reused as it is (one source of truth), only its globals differ.
    """
    module_globals = dict(func.__globals__)
    for name in func.__code__.co_names:
        if type(module_globals.get(name)) is float:
            module_globals[name] = np.float32(module_globals[name])
    twin = types.FunctionType(func.__code__, module_globals, func.__name__, func.__defaults__, func.__closure__)
    twin.__qualname__, twin.__module__ = func.__qualname__, func.__module__
    # inline="always": the twin runs inside the caller's loop, which the compiler then vectorizes
    return _numba().njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")(twin)


def _jit_inline(func: Callable[..., Any], **globals_: Any) -> Callable[..., Any]:
    """``func`` compiled to be inlined into a fused loop, with some of its module globals replaced
    (the compiled versions of the functions it calls)."""
    if globals_:
        namespace = dict(func.__globals__) | globals_
        func = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__, func.__closure__)
    return _numba().njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")(func)


# --- the parts every fused step shares (compiled by kernel(name), called inside a family's loop) --


def _bookkeeping(action, low, high, terminated, t, last_t, autoreset, truncated, done, next_t, rows):
    """The time limit and reset list: the vector env's torch rules, row by row; ``(n_done, n_bad)``.

    ``truncated`` where the next time index passes ``last_t`` (``last_t < 0``: no time limit),
    ``done = terminated | truncated``; with ``autoreset`` a done row's next time index is 0. The
    first ``n_done`` entries of ``rows`` list the done rows in order; ``n_bad`` counts the actions
    outside ``[low, high]``.
    """
    # Branch-free: which rows end is data, and a branch per row mispredicts at every episode end.
    n_done = 0
    n_bad = 0
    for i in range(t.shape[0]):
        a = action[i]
        n_bad += (a < low) | (a > high)
        step = t[i] + 1
        cut = (last_t >= 0) & (step > last_t)
        ended = terminated[i] | cut
        truncated[i] = cut
        done[i] = ended
        rows[n_done] = i  # kept only where the row ended (n_done <= i: inside the array)
        n_done += ended
        next_t[i] = step * (1 - (ended & autoreset))
    return n_done, n_bad


def _reset_noise(rows, row_agent, bases, counters, golden, advance, noise):
    """The reset draw of ``rows``: the bits of the vector env's torch and NumPy draws.

    Row ``r = rows[j]`` takes word ``k`` as the finalizer of ``bases[r, k] + counters[agent] *
    golden`` (uint64, wrapping) into ``noise[j, k]``; then every agent with a row advances its
    counter by ``advance`` (in place), as the full draw of all its rows would.
    """
    touched = np.zeros(counters.shape[0], np.bool_)
    for j in range(rows.shape[0]):
        agent = row_agent[rows[j]]
        touched[agent] = True
        offset = counters[agent] * golden
        for k in range(noise.shape[1]):
            noise[j, k] = finalize(bases[rows[j], k] + offset)  # noqa: F821 (compiled in: kernel())
    for agent in range(counters.shape[0]):
        if touched[agent]:
            counters[agent] += advance


def _rows_of_components(components, flat):
    """``flat[i * d + k] = components[k, i]``: the row-major copy of ``[d, N]`` components.

    Through a flat output, which compiles to stores as fast as a plain copy (2-D indexing of the
    output does not vectorize); four explicit stores a row for d = 4 (a loop over k does not either).
    """
    d, n = components.shape
    if d == 4:
        for i in range(n):
            flat[4 * i], flat[4 * i + 1], flat[4 * i + 2], flat[4 * i + 3] = (
                components[0, i], components[1, i], components[2, i], components[3, i])
        return
    for i in range(n):
        for k in range(d):
            flat[i * d + k] = components[k, i]


def _copy_flat(source, target):
    for j in range(source.shape[0]):
        target[j] = source[j]


@functools.cache
def kernel(name: str) -> Callable[..., Any]:
    """A shared part of the fused steps, compiled (on first use) to be inlined into a family's loop:
    ``"bookkeeping"``, ``"reset_noise"``, ``"rows_of_components"`` or ``"copy_flat"``."""
    from fedrl_envs.rng import uniform32_of_finalizer_input_numpy

    if name == "reset_noise":
        return _jit_inline(_reset_noise, finalize=_jit_inline(uniform32_of_finalizer_input_numpy))
    parts = {"bookkeeping": _bookkeeping, "rows_of_components": _rows_of_components, "copy_flat": _copy_flat}
    if name not in parts:
        raise ValueError(f"name must be one of {['reset_noise', *parts]}, got {name!r}")
    return _jit_inline(parts[name])
