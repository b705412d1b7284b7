"""Task parameters (a frozen dataclass per family, stacked on a leading agent axis) and state layouts.

A heterogeneous population is one family's parameter dataclass with its tensor fields stacked along
a leading agent axis (:func:`stack_params`); these helpers stack, repeat, index and move such
parameters, and lay states out as the kernels compute on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

P = TypeVar("P")


def _tensor_fields(params: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(params) if isinstance(getattr(params, f.name), torch.Tensor)]


class derived:  # noqa: N801 (used as a decorator, like functools.cached_property)
    """A parameter dataclass's quantity derived from its fields, computed on first use and kept.

    Like :func:`functools.cached_property` without its lock (a lock per lookup costs more than a
    small kernel operation): the value lands in the instance's ``__dict__``, where later lookups find it first.
    Parameter dataclasses are frozen and their tensors never written in place, so the value
    never goes stale; :func:`dataclasses.replace` builds a new object that derives it afresh.
    """

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self.compute(obj)
        obj.__dict__[self.name] = value
        return value


def stack_params(tasks: Sequence[P]) -> P:
    """Stack task parameters along a new leading agent axis.

    Tensor fields are stacked; every other field (grid size, horizon, ...) must be equal across
    tasks because it fixes shapes or episode length for the whole batch.

    :param tasks: non-empty sequence of parameter dataclasses of one family
    :return: one dataclass whose tensor fields have a leading axis of length ``len(tasks)``
    """
    if len(tasks) == 0:
        raise ValueError("tasks must be a non-empty sequence of task parameters")
    first = tasks[0]
    if any(type(t) is not type(first) for t in tasks):
        raise TypeError("tasks must all be parameters of the same family")
    tensor_names = _tensor_fields(first)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        values = [getattr(t, f.name) for t in tasks]
        if f.name in tensor_names:
            changes[f.name] = torch.stack(values)
        elif any(v != values[0] for v in values):
            raise ValueError(
                f"field {f.name!r} must be equal for every task in one batch, got {sorted(set(values))}"
            )
    return dataclasses.replace(first, **changes)


def repeat_params(params: P, repeats: int) -> P:
    """Repeat each row of stacked parameters ``repeats`` times (agent-major flat batch)."""
    changes = {n: getattr(params, n).repeat_interleave(repeats, dim=0) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def index_params(params: P, index: Any) -> P:
    """Select rows of stacked parameters (any torch index along the leading axis)."""
    changes = {n: getattr(params, n)[index] for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def _gather_params(params: P, rows: torch.Tensor) -> P:
    """:func:`index_params` for non-negative int64 rows ``[R]`` (``index_select``: half the cost)."""
    changes = {n: getattr(params, n).index_select(0, rows) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def params_to(params: P, device: torch.device | str) -> P:
    """Move every tensor field to ``device``."""
    changes = {n: getattr(params, n).to(device) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def params_to_numpy(params: P) -> P:
    """The same parameters with every tensor field as NumPy: 0-d tensors as NumPy scalars, others as arrays.

    These are the parameters of the NumPy kernels (:mod:`fedrl_envs.ops`); the values and dtypes are
    the tensors' (float32 stays float32).
    """
    changes = {n: _one_numpy(getattr(params, n)) for n in _tensor_fields(params)}
    return dataclasses.replace(params, **changes)


def _one_numpy(value: torch.Tensor) -> Any:
    """A CPU copy of ``value`` as NumPy: a NumPy scalar when 0-d, else an array."""
    arr = value.detach().cpu().numpy().copy()
    return arr[()] if arr.ndim == 0 else arr


def components_layout(state: torch.Tensor) -> torch.Tensor:
    """``state`` ``[N, ..., d]`` laid out as its components kernels compute with (a ``[d, N, ...]`` array).

    What :meth:`fedrl_envs.ops.TorchOps.stack` returns: elementwise operations of such states keep
    the layout, and :meth:`~fedrl_envs.ops.TorchOps.unbind` gives contiguous components, on which
    torch's kernels run vectorized. The values are unchanged (a copy unless already so laid out).
    """
    if state.dim() < 2:
        return state
    return state.movedim(-1, 0).contiguous().movedim(0, -1)


def fresh_observation(obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """``obs`` as a C-contiguous tensor of its own (a copy when it shares memory with ``state``).

    Kernels keep a state's components contiguous (``[N, d]`` views of ``[d, N]`` arrays, see
    :meth:`fedrl_envs.ops.TorchOps.stack`); what a caller receives is an ordinary row-major batch.
    """
    if obs.data_ptr() == state.data_ptr():
        return obs.clone(memory_format=torch.contiguous_format)
    return obs.contiguous()
