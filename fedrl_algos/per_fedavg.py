"""Deprecated module: the classes moved to one package per algorithm.

``PerFedAvgPG`` is in :mod:`fedrl_algos.per_fedavg_pg`, ``FedAvgPG`` in :mod:`fedrl_algos.fedavg_pg`
and ``IndependentPG`` in :mod:`fedrl_algos.independent_pg` (all three also in :mod:`fedrl_algos`).
Importing them from here works for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "PerFedAvgPG": "fedrl_algos.per_fedavg_pg",
    "FedAvgPG": "fedrl_algos.fedavg_pg",
    "IndependentPG": "fedrl_algos.independent_pg",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(
        f"fedrl_algos.per_fedavg.{name} moved to {_MOVED[name]}.{name}; the old path goes away in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(_MOVED[name]), name)
