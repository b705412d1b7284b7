"""Argument checks shared by fedrl's environments: each raises ``TypeError``/``ValueError`` naming the argument."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

#: the most environments per agent of a vector env: beyond it a batch's indices and states no
#: longer fit memory (an unbounded n_envs overflowed int64 inside torch, or exhausted memory)
MAX_ENVS = 2**24


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a ``bool``; ``TypeError`` naming ``name`` for anything else (``0``/``1``, strings and
    ``None`` included: a flag is never guessed from a truthy value). NumPy's ``bool_`` is accepted."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_int(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]``; ``TypeError``/``ValueError`` naming ``name`` otherwise.

    Accepts Python, NumPy and single-element integer torch integers; rejects bools and floats (an
    argument is never silently truncated or clipped).
    """
    if isinstance(value, bool | np.bool_) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < low or (high is not None and value > high):
        allowed = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return int(value)


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """An optional seed argument: ``None`` (draw one later) or an ``int`` (:func:`check_int`).

    Any integer from ``-2**63`` up is a seed: :func:`fedrl_envs.derive_keys` wraps it to int64.

    :param seed: the argument to check
    :param name: the argument's name, for the error message
    """
    return None if seed is None else check_int(name, seed, -(2**63))


def check_device(device: Any, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``; ``ValueError`` naming ``name`` for an unknown or absent device."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{name} must name a torch device such as 'cpu' or 'cuda:0', got {device!r}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={str(dev)!r} but CUDA is not available on this machine")
    return dev


#: what a vector env may return: torch tensors on its device, or NumPy arrays
ARRAY_TYPES = ("torch", "numpy")


def check_array_type(array_type: Any, name: str = "array_type") -> str:
    """``array_type`` as one of :data:`ARRAY_TYPES`; ``TypeError``/``ValueError`` naming ``name`` otherwise.

    :param array_type: ``"torch"`` or ``"numpy"``
    :param name: the argument's name, for the error message
    """
    if not isinstance(array_type, str):
        raise TypeError(f"{name} must be one of {ARRAY_TYPES} (a str), got {type(array_type).__name__}")
    if array_type not in ARRAY_TYPES:
        raise ValueError(f"{name} must be one of {ARRAY_TYPES}, got {array_type!r}")
    return array_type


#: accepted values of a vector env's ``kernels``
KERNELS = ("auto", "torch", "numpy", "numba")


def check_kernels(kernels: Any, family: Any, device: torch.device, name: str = "kernels") -> str:
    """The kernels that run, from ``kernels`` (one of :data:`KERNELS`), checked against the family and the device.

    ``"auto"`` resolves to the fastest kernels with bitwise the torch kernels' numbers: ``"numba"``
    on the CPU for a family with a fused step (``fused_kernels``) when Numba can be imported,
    ``"torch"`` otherwise (``"numpy"`` is never chosen: its ``sin``/``cos`` may differ by an ulp).
    ``"numpy"`` needs the CPU and a family with NumPy kernels; ``"numba"`` the CPU, a family with a
    fused step and Numba installed.
    """
    if kernels not in KERNELS:
        raise ValueError(f'{name} must be "auto", "torch", "numpy" or "numba", got {kernels!r}')
    if kernels == "auto":
        from fedrl_envs.fused import numba_available

        fused = device.type == "cpu" and getattr(family, "fused_kernels", False)
        return "numba" if fused and numba_available() else "torch"
    if kernels != "torch" and device.type != "cpu":
        raise ValueError(f'{name}="{kernels}" runs the kernels on the CPU; got device {device}')
    if kernels == "numpy" and not getattr(family, "numpy_kernels", False):
        raise ValueError(
            f'{name}="numpy" needs a family whose kernels are written against fedrl_envs.ops '
            f"(numpy_kernels = True); {type(family).__name__} has torch kernels only"
        )
    if kernels == "numba":
        if not getattr(family, "fused_kernels", False):
            raise ValueError(
                f'{name}="numba" needs a family with a fused step (fused_kernels = True: fedrl/CartPole-v0); '
                f"{type(family).__name__} has none"
            )
        from fedrl_envs.fused import _numba

        _numba()  # ImportError with the install command when Numba is missing
    return kernels


def _reset_mask(options: dict[str, Any] | None, num_envs: int) -> np.ndarray | None:
    """Gymnasium's ``options["reset_mask"]`` (bool NumPy array ``[num_envs]``, or a bool tensor), checked."""
    if not options or "reset_mask" not in options:
        return None
    mask = options["reset_mask"]
    mask = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else mask
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        raise TypeError(f"options['reset_mask'] must be a bool NumPy array, got {type(mask).__name__} of dtype {getattr(mask, 'dtype', None)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"options['reset_mask'] must have shape ({num_envs},), got {mask.shape}")
    if not mask.any():
        raise ValueError("options['reset_mask'] must be true for at least one environment")
    return mask


def _signed_actions(action: torch.Tensor, name: str) -> torch.Tensor:
    """Unsigned actions wider than a byte as int64 (torch cannot compare uint16/32/64 tensors on CPU).

    :raise ValueError: for a value above the int64 range, naming ``name``
    """
    if action.dtype not in (torch.uint16, torch.uint32, torch.uint64):
        return action
    if action.dtype == torch.uint64 and action.numel():  # the one that can exceed int64 (compared in NumPy: torch cannot)
        top = int(action.cpu().numpy().max())
        if top > torch.iinfo(torch.int64).max:
            raise ValueError(f"{name} must fit in int64, got {top}")
    return action.to(torch.int64)


def _as_state_tensor(state: Any, template: torch.Tensor, name: str) -> torch.Tensor:
    """``state`` as a tensor of ``template``'s dtype and shape, refusing lossy casts."""
    state_t = state.detach() if isinstance(state, torch.Tensor) else torch.as_tensor(np.asarray(state))
    if tuple(state_t.shape) != tuple(template.shape):
        raise ValueError(f"{name} must have shape {tuple(template.shape)}, got {tuple(state_t.shape)}")
    if not template.is_floating_point() and (state_t.is_floating_point() or state_t.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers (dtype {template.dtype}), got dtype {state_t.dtype}")
    return state_t.to(device=template.device, dtype=template.dtype).clone()


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number: a Python or NumPy int or float, not a bool (Python's or
    NumPy's), a string, a tensor or a complex number. The one type test behind every numeric argument check."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)


def check_real(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    finite: bool = True,
) -> float:
    """``value`` as a ``float``: a real number, optionally bounded; ``TypeError``/``ValueError`` naming ``name`` otherwise.

    Python and NumPy ints and floats are accepted (``np.float32(0.5)``, ``np.int64(2)``); bools
    (Python's and NumPy's), strings, ``None``, tensors and complex numbers are a ``TypeError``
    (a number is never parsed from a string or taken from a flag). NaN is always a ``ValueError``;
    so are infinities when ``finite`` (the default) and values outside the bounds.

    :param name: the argument's name, for the error message
    :param value: the argument to check
    :param low: lower bound (``None``: none)
    :param high: upper bound (``None``: none)
    :param low_inclusive: whether ``value == low`` is allowed (``>=``) or not (``>``)
    :param high_inclusive: whether ``value == high`` is allowed (``<=``) or not (``<``)
    :param finite: whether ``±inf`` is rejected
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range
        number = float(np.inf) if value > 0 else float(-np.inf)
    above = low is None or (number >= low if low_inclusive else number > low)
    below = high is None or (number <= high if high_inclusive else number < high)
    if np.isnan(number) or (finite and np.isinf(number)) or not (above and below):
        if low is not None and high is not None:
            bound = f" in {'[' if low_inclusive else '('}{low}, {high}{']' if high_inclusive else ')'}"
        elif low is not None:
            bound = f" {'>=' if low_inclusive else '>'} {low}"
        elif high is not None:
            bound = f" {'<=' if high_inclusive else '<'} {high}"
        else:
            bound = ""
        kind = "a finite number" if finite else "a number (not NaN)"
        raise ValueError(f"{name} must be {kind}{bound}, got {value!r}")
    return number
