"""The small array vocabulary the family kernels are written in: torch batches and one NumPy env.

A kernel written against these operations runs in two places from one source:

* :data:`TORCH` (:class:`TorchOps`): a flat torch batch ``[N, ...]`` on any device, as the native
  vector env, the federated env and the samplers use it;
* :data:`NUMPY_ONE` (:class:`NumpyOneOps`): *one* environment without a batch axis, as NumPy
  arrays and NumPy scalars (a CartPole state is a float32 array ``(4,)``, its components are
  ``np.float32`` scalars, a gridworld state is one ``np.int64``). This is the single env's fast
  path: a torch call costs microseconds whatever its size, a NumPy scalar operation tens of
  nanoseconds, and a step of a batch of one is dozens of operations.

A kernel picks its namespace from its input with :func:`array_ops` (``xp = array_ops(state)``), the
way the Array API standard's ``array_namespace`` does, so its signature stays ``step(state, action,
params)``. Elementwise ``+ - * /``, comparisons, ``abs``, ``%`` and ``|`` are written as Python
operators and act alike on both; ``unbind``/``stack`` act on the last axis (the state's components).

Both namespaces compute float32 in float32, one IEEE-rounded operation at a time (NumPy's scalar
rules since NumPy 2, NEP 50, convert a Python float operand to float32 as torch does), so the two
agree bitwise on every operation except the transcendental functions: torch (SLEEF) and NumPy
round ``sin``/``cos`` of about 5% of float32 arguments differently, by one unit in the last place.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

__all__ = ["TorchOps", "NumpyOneOps", "NumpyBatchOps", "TORCH", "NUMPY_ONE", "NUMPY_BATCH", "array_ops", "numpy_batch"]


class TorchOps:
    """Kernel operations on a flat torch batch: arrays are tensors ``[N, ...]`` (components ``[N]``)."""

    float32 = torch.float32
    float64 = torch.float64
    int64 = torch.int64
    bool = torch.bool
    where = staticmethod(torch.where)
    sin = staticmethod(torch.sin)
    cos = staticmethod(torch.cos)
    remainder = staticmethod(torch.remainder)

    @staticmethod
    def unbind(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The components along the last axis (views)."""
        return x.unbind(-1)

    @staticmethod
    def stack(xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Components stacked along a new last axis, each kept contiguous in memory.

        The result is a ``[..., C]`` view of a ``[C, ...]`` array: :meth:`unbind` of it gives
        contiguous components, on which torch's elementwise kernels run vectorized (on
        interleaved ``[N, C]`` rows they run strided, two to three times slower).
        """
        return torch.stack(tuple(xs), dim=0).movedim(0, -1)

    @staticmethod
    def clip(x: torch.Tensor, low: float | None = None, high: float | None = None) -> torch.Tensor:
        """``min(max(x, low), high)`` elementwise (``torch.clamp``; a ``None`` bound is absent)."""
        return torch.clamp(x, low, high)

    @staticmethod
    def astype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x`` in ``dtype`` (``x`` itself when it already is)."""
        return x.to(dtype)

    @staticmethod
    def ones_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.ones_like(x, dtype=dtype)

    @staticmethod
    def zeros_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros_like(x, dtype=dtype)

    @staticmethod
    def take(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Entries of a flat ``table`` at integer ``index`` (any shape)."""
        return table.take(index)

    @staticmethod
    def rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Rows of ``table`` ``[K, ...]`` at integer ``index`` ``[...]``: ``[..., *table.shape[1:]]``."""
        # index_select is ~3x faster than advanced indexing for this gather (same values)
        picked = torch.index_select(table, 0, index.reshape(-1).long())
        return picked.reshape(*index.shape, *table.shape[1:])

    @staticmethod
    def table(build: Callable[..., torch.Tensor], *key: Any, like: torch.Tensor) -> torch.Tensor:
        """``build(*key, device)`` for the device of ``like`` (``build`` caches its tables)."""
        return build(*key, like.device)

    @staticmethod
    def to_device(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``x`` on the device of ``like``."""
        return x.to(like.device)


@lru_cache(maxsize=64)
def _numpy_table(build: Callable[..., torch.Tensor], key: tuple[Any, ...]) -> np.ndarray:
    """The CPU table of ``build(*key)`` as a read-only NumPy array (the same values as on torch)."""
    table = build(*key, torch.device("cpu")).numpy().copy()
    table.flags.writeable = False
    return table


class NumpyOneOps:
    """Kernel operations on one environment: NumPy arrays without a batch axis and NumPy scalars."""

    float32 = np.float32
    float64 = np.float64
    int64 = np.int64
    bool = np.bool_
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    remainder = staticmethod(np.remainder)

    @staticmethod
    def where(condition: Any, x: Any, y: Any) -> Any:
        """``x`` if ``condition`` else ``y`` (one environment: the condition is one truth value)."""
        return x if condition else y

    @staticmethod
    def unbind(x: np.ndarray) -> tuple[Any, ...]:
        """The components of a 1-D array, as NumPy scalars."""
        return tuple(x)

    @staticmethod
    def stack(xs: Sequence[Any]) -> np.ndarray:
        """NumPy scalars of one dtype as a 1-D array of that dtype."""
        return np.array(xs)

    @staticmethod
    def clip(x: Any, low: float | None = None, high: float | None = None) -> Any:
        """``min(max(x, low), high)``, keeping ``x``'s dtype (NaN stays NaN, as with ``torch.clamp``)."""
        if isinstance(x, np.ndarray):
            if low is not None:
                x = np.maximum(x, low)
            return x if high is None else np.minimum(x, high)
        # One scalar: comparisons instead of ufunc calls (a tenth of the time); a bound that is
        # taken is converted to x's type so that a Python float never turns float32 into float64.
        if low is not None and x < low:
            return type(x)(low)
        if high is not None and x > high:
            return type(x)(high)
        return x

    @staticmethod
    def astype(x: Any, dtype: Any) -> Any:
        """``x`` in ``dtype`` (``x`` itself when it already is; Python numbers become NumPy scalars)."""
        have = getattr(x, "dtype", None)
        if have == dtype:  # the common case, a tenth of the cost of a conversion
            return x
        if type(x) is np.ndarray:
            return x.astype(dtype)
        return np.dtype(dtype).type(x)

    @staticmethod
    def ones_like(x: Any, dtype: Any = None) -> Any:
        if isinstance(x, np.ndarray):
            return np.ones_like(x, dtype=dtype)
        return np.dtype(x.dtype if dtype is None else dtype).type(1)

    @staticmethod
    def zeros_like(x: Any, dtype: Any = None) -> Any:
        if isinstance(x, np.ndarray):
            return np.zeros_like(x, dtype=dtype)
        return np.dtype(x.dtype if dtype is None else dtype).type(0)

    @staticmethod
    def take(table: np.ndarray, index: Any) -> Any:
        return table[index]

    @staticmethod
    def rows(table: np.ndarray, index: Any) -> Any:
        return table[index]

    @staticmethod
    def table(build: Callable[..., torch.Tensor], *key: Any, like: Any) -> np.ndarray:
        """``build(*key, cpu)`` as a NumPy array, converted once per key."""
        return _numpy_table(build, key)

    @staticmethod
    def to_device(x: Any, like: Any) -> Any:
        return x


class NumpyBatchOps(NumpyOneOps):
    """Kernel operations on a flat NumPy batch ``[N, ...]``: the CPU vector env's ``kernels="numpy"``.

    The same operations as :class:`TorchOps`, on NumPy arrays (a NumPy operation costs about a
    microsecond where a torch one costs two to three). Kernels see this namespace only inside
    :func:`numpy_batch`; elsewhere a NumPy input is one environment (:class:`NumpyOneOps`, whose
    dtypes, ufuncs, tables and devices this namespace shares; what differs is what a batch needs).
    """

    where = staticmethod(np.where)

    @staticmethod
    def unbind(x: np.ndarray) -> tuple[np.ndarray, ...]:
        """The components along the last axis (views)."""
        return tuple(np.moveaxis(x, -1, 0))

    @staticmethod
    def stack(xs: Sequence[np.ndarray]) -> np.ndarray:
        """Components stacked along a new last axis, each kept contiguous (as :meth:`TorchOps.stack`)."""
        return np.moveaxis(np.stack(tuple(xs), axis=0), 0, -1)

    @staticmethod
    def clip(x: np.ndarray, low: float | None = None, high: float | None = None) -> np.ndarray:
        """``min(max(x, low), high)`` elementwise in ``x``'s dtype (NaN stays NaN, as with ``torch.clamp``)."""
        return np.clip(x, low, high)

    @staticmethod
    def astype(x: Any, dtype: Any) -> Any:
        """``x`` in ``dtype`` (``x`` itself when it already is)."""
        return x.astype(dtype, copy=False) if isinstance(x, np.ndarray) else np.asarray(x, dtype=dtype)

    @staticmethod
    def ones_like(x: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.ones_like(x, dtype=dtype)

    @staticmethod
    def zeros_like(x: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.zeros_like(x, dtype=dtype)

    @staticmethod
    def take(table: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Entries of a flat ``table`` at integer ``index`` (any shape)."""
        return np.take(table, index)

    @staticmethod
    def rows(table: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Rows of ``table`` ``[K, ...]`` at integer ``index`` ``[...]`` (``np.take``: faster than fancy indexing)."""
        return np.take(table, index, axis=0)



#: the batched torch namespace
TORCH = TorchOps()
#: the one-environment NumPy namespace
NUMPY_ONE = NumpyOneOps()
#: the batched NumPy namespace (inside :func:`numpy_batch`)
NUMPY_BATCH = NumpyBatchOps()

_NUMPY_IS_BATCH: contextvars.ContextVar[bool] = contextvars.ContextVar("fedrl_numpy_batch", default=False)


@contextlib.contextmanager
def numpy_batch() -> Iterator[None]:
    """Within this block, kernels given NumPy arrays treat them as batches (:data:`NUMPY_BATCH`).

    A NumPy array alone cannot tell a batch of gridworld states ``[N]`` from one CartPole state
    ``(4,)``; the caller, which knows, says so.
    """
    token = _NUMPY_IS_BATCH.set(True)
    try:
        yield
    finally:
        _NUMPY_IS_BATCH.reset(token)


def array_ops(x: Any) -> TorchOps | NumpyOneOps | NumpyBatchOps:
    """The namespace of a kernel input: :data:`TORCH` for a tensor, :data:`NUMPY_ONE` otherwise.

    :param x: a kernel's state, noise or parameter
    """
    # Exact type checks first: isinstance against torch.Tensor goes through its metaclass's
    # __instancecheck__, which costs more than a whole NumPy scalar operation.
    cls = type(x)
    if cls is torch.Tensor:
        return TORCH
    if cls is np.ndarray or isinstance(x, np.generic):
        return NUMPY_BATCH if _NUMPY_IS_BATCH.get() else NUMPY_ONE
    if isinstance(x, torch.Tensor):
        return TORCH
    return NUMPY_BATCH if _NUMPY_IS_BATCH.get() else NUMPY_ONE
