"""Renamed constructor arguments, kept as deprecated aliases for one release."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["renamed_arguments"]


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
