"""Deprecated location of the Byzantine attacks: they live in :mod:`fedrl_algos.core.attacks`.

FedPG-BR and FedAvg-PG both apply them, and algorithms do not import each other, so the attacks
moved to the shared core. Importing a name from here still works for one release, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from typing import Any

from fedrl_algos.core import attacks as _attacks


def __getattr__(name: str) -> Any:
    if name.startswith("__") or not hasattr(_attacks, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"fedrl_algos.attacks.{name} moved to fedrl_algos.core.attacks.{name}; the old path goes away in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_attacks, name)
