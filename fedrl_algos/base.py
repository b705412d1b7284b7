"""Deprecated module: the shared base classes moved to :mod:`fedrl_algos.common`.

Importing ``FederatedAlgorithm``, ``EnvFreeLearnMixin``, ``FederatedProgressBar`` or
``resolve_federation_env`` from here works for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "FederatedAlgorithm": "fedrl_algos.common.base_class",
    "EnvFreeLearnMixin": "fedrl_algos.common.learn",
    "FederatedProgressBar": "fedrl_algos.common.learn",
    "resolve_federation_env": "fedrl_algos.common.env_util",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(
        f"fedrl_algos.base.{name} moved to {_MOVED[name]}.{name}; the old path goes away in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(_MOVED[name]), name)
