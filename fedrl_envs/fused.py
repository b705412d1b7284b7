"""Fused CPU steps: a family's transition, time limit and autoreset bookkeeping in one compiled pass.

A torch (or NumPy) CPU operation costs microseconds however small its input, and at 10^5
environments every operation also streams its inputs and output through memory: a CartPole step
of the native vector env is about 70 of them. With ``kernels="numba"`` a family that has a fused
step (:attr:`TaskFamily.fused_kernels <fedrl_envs.family.TaskFamily>`) runs the transition, the
termination test, the time limit, the observation copies, the list of rows to reset and their
resets (the same reset words, hashed by the same finalizer function) as one call of loops
compiled by `Numba <https://numba.pydata.org>`_; the algorithms' rollouts use the compiled
transition alone (:meth:`TaskFamily.fast_step <fedrl_envs.family.TaskFamily.fast_step>`).

**The same numbers.** A fused step compiles the family's own arithmetic, the functions its torch
kernel calls (for CartPole: :func:`~fedrl_envs.cartpole.push`,
:func:`~fedrl_envs.cartpole.accelerations`, :func:`~fedrl_envs.cartpole.euler`,
:func:`~fedrl_envs.cartpole.is_terminal`, :func:`~fedrl_envs.cartpole.start_state`), through :func:`float32_twin`, so there is one source of
truth for the dynamics. Torch applies a Python float to a float32 tensor in float32 and rounds
every operation separately; the twin does the same (its float constants are float32, and Numba
does not contract ``a * b + c`` into fused multiply-adds unless asked to). Transcendental
functions are the one place where libraries round differently, so a fused step takes them from
torch (``torch.cos``/``torch.sin`` of the batch, two vectorized calls). Trajectories are therefore
bitwise those of ``kernels="torch"`` (``tests/test_fused_kernels.py``); a NaN, which only a state
set by hand can bring in, stays NaN but may carry another payload (the compiler may swap the
operands of a commutative operation).

Numba is optional (``pip install "fedrl[fast]"``); it is imported, and the loops compiled, the
first time a fused step runs (about two seconds). :func:`compile_loop` caches them on disk under
a name hashed from the source of every function compiled in, so later processes load them (about
half a second with Numba's import) and an edited kernel is compiled anew, never loaded stale.

Limits of :func:`float32_twin`: it converts the float constants a function reads from its module,
not float literals written in its body (name them, as ``FOUR_THIRDS``) and not the constants of
functions it calls (compile those with their own twins); the constants are read when the loop
is first compiled.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["numba_available", "float32_twin", "compile_loop", "inline", "kernel", "kernel_sources"]


@functools.cache
def numba_available() -> bool:
    """Whether Numba can be imported (what ``kernels="numba"`` and the compiled rollout steps need).

    Any failure to import it (not installed, or built for another NumPy) counts as unavailable: the
    rollouts then keep the torch kernels, which give the same numbers.
    """
    try:
        _numba()
    except Exception:  # noqa: BLE001 - an installed but broken Numba must not break the torch path
        return False
    return True


@functools.cache
def _numba() -> Any:
    try:
        import numba
    except ImportError as error:  # pragma: no cover - exercised where numba is missing
        raise ImportError('kernels="numba" needs Numba: pip install "fedrl[fast]" (or pip install numba)') from error
    return numba


def compile_loop(loop: Callable[..., Any], callees: dict[str, Callable[..., Any]],
                 compiled_from: Sequence[Callable[..., Any]] = (), fastmath: frozenset[str] = frozenset()) -> Callable[..., Any]:
    """``loop`` compiled by Numba (no GIL, no bounds checks, NumPy's division semantics), cached on disk.

    ``loop`` calls its compiled helpers by global name; ``callees`` binds those names (e.g. the
    :func:`float32_twin` of each arithmetic function). Numba keys its cache on the loop's own code
    and file only, so the cache entry is named after a hash of the source of every function
    compiled in (``loop`` and ``compiled_from``) and of the float constants they read: editing any
    of them compiles anew instead of loading a stale loop. Where no cache directory is writable
    the loop is compiled without one (once per process). ``error_model="numpy"``: a division by
    zero gives inf or nan as torch's does, instead of raising.

    :param fastmath: LLVM fast-math flags for the loop (e.g. ``{"reassoc", "contract"}``: sums that
        LLVM may vectorize and reorder, hence round differently from a sequential sum; the same bits
        on every call of one compiled loop). Default none: every operation as written.
    """
    digest = hashlib.sha256()
    if fastmath:
        digest.update(repr(sorted(fastmath)).encode())
    for func in (loop, *compiled_from):
        digest.update(inspect.getsource(func).encode())
        for name in sorted(set(func.__code__.co_names)):
            value = func.__globals__.get(name)
            if type(value) is float:
                digest.update(f"{name}={value!r}".encode())
    for name, value in sorted(callees.items()):  # constants bound as globals are compiled in too
        if not callable(value):
            digest.update(f"{name}={value!r}".encode())
    namespace = dict(loop.__globals__) | callees
    clone = types.FunctionType(loop.__code__, namespace, loop.__name__, loop.__defaults__, loop.__closure__)
    clone.__qualname__ = f"{loop.__qualname__}_{digest.hexdigest()[:16]}"
    clone.__module__ = loop.__module__
    njit = _numba().njit
    try:
        return njit(nogil=True, boundscheck=False, error_model="numpy", fastmath=set(fastmath) or False, cache=True)(clone)
    except RuntimeError:  # no cache locator (read-only install, no writable home): compile per process
        return njit(nogil=True, boundscheck=False, error_model="numpy", fastmath=set(fastmath) or False)(clone)


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


def inline(func: Callable[..., Any], callees: dict[str, Callable[..., Any]] | None = None) -> Callable[..., Any]:
    """``func`` compiled to be inlined into a fused loop, with ``callees`` bound as the globals it
    calls them by (the compiled versions of the functions it calls)."""
    if callees:
        namespace = dict(func.__globals__) | callees
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


def kernel_sources() -> tuple[Callable[..., Any], ...]:
    """The Python functions :func:`kernel` compiles (what a loop calling them must hash into its cache key)."""
    from fedrl_envs.rng import uniform32_of_finalizer_input_numpy

    return (_bookkeeping, _reset_noise, _rows_of_components, _copy_flat, uniform32_of_finalizer_input_numpy)


@functools.cache
def kernel(name: str) -> Callable[..., Any]:
    """A shared part of the fused steps, compiled (on first use) to be inlined into a family's loop:
    ``"bookkeeping"``, ``"reset_noise"``, ``"rows_of_components"`` or ``"copy_flat"``."""
    from fedrl_envs.rng import uniform32_of_finalizer_input_numpy

    if name == "reset_noise":
        return inline(_reset_noise, {"finalize": inline(uniform32_of_finalizer_input_numpy)})
    parts = {"bookkeeping": _bookkeeping, "rows_of_components": _rows_of_components, "copy_flat": _copy_flat}
    if name not in parts:
        raise ValueError(f"name must be one of {['reset_noise', *parts]}, got {name!r}")
    return inline(parts[name])
