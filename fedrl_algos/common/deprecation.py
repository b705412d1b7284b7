"""Renamed constructor arguments, kept as deprecated aliases for one release."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed_arguments", "moved_names"]


def renamed_arguments(owner: str, renamed: Mapping[str, str], given: Mapping[str, Any], stacklevel: int = 3) -> dict[str, Any]:
    """The values of deprecated keyword arguments ``given``, under their new names.

    Each use warns (``DeprecationWarning`` naming the new argument); an unknown keyword is a
    ``TypeError`` as Python's own.

    :param owner: the class whose constructor got them (for the messages)
    :param renamed: old name → new name
    :param given: the extra keyword arguments the constructor received
    :param stacklevel: where the warning points (the caller of the constructor by default)
    """
    out: dict[str, Any] = {}
    for old, value in given.items():
        if old not in renamed:
            raise TypeError(f"{owner}.__init__() got an unexpected keyword argument {old!r}")
        warnings.warn(
            f"{owner}: argument {old!r} is deprecated and will be removed in the next release; use {renamed[old]!r}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        out[renamed[old]] = value
    return out


def moved_names(old_module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves names moved elsewhere, with a ``DeprecationWarning``.

    :param old_module: the deprecated module's dotted name (for the messages)
    :param moved: name → the module it lives in now
    :return: the function to assign to the deprecated module's ``__getattr__``
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(
            f"{old_module}.{name} moved to {moved[name]}.{name}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(moved[name]), name)

    return __getattr__
