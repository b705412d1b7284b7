"""Detect a module named ``wrappers`` that is not fedrl's (a user's own ``wrappers.py``, say).

fedrl's own code imports :mod:`fedrl_wrappers` only, so a foreign ``wrappers`` never breaks
``fedrl_envs`` or ``fedrl_algos``. The compatibility package ``wrappers`` (same objects under the
old name) is what such a file hides; :func:`warn_if_wrappers_shadowed` says so once, naming the
file, when :mod:`fedrl_wrappers` is first imported, instead of letting a later
``from wrappers import FederatedVecEnv`` fail with an unrelated-looking error.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

__all__ = ["WrappersShadowedWarning", "wrappers_location", "warn_if_wrappers_shadowed"]

#: fedrl's compatibility package ``wrappers`` is installed next to ``fedrl_wrappers``
_OWN_WRAPPERS = (Path(__file__).resolve().parent.parent / "wrappers").resolve()


class WrappersShadowedWarning(UserWarning):
    """The name ``wrappers`` resolves to a module other than fedrl's compatibility package."""


def wrappers_location() -> str | None:
    """Where ``import wrappers`` would load from (a file or a directory), ``None`` if nowhere.

    Uses the import system's own lookup (``sys.modules`` first, then ``sys.path``) without
    executing the module it finds.
    """
    module = sys.modules.get("wrappers")
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec("wrappers")
    except (ImportError, ValueError):  # a broken or spec-less module: report it by its file
        spec = None
        if module is not None:
            return getattr(module, "__file__", None) or repr(module)
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return spec.origin
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else spec.origin


def _is_own(location: str) -> bool:
    path = Path(location).resolve()
    return path == _OWN_WRAPPERS or path.parent == _OWN_WRAPPERS


def warn_if_wrappers_shadowed() -> bool:
    """Warn (:class:`WrappersShadowedWarning`) when ``wrappers`` is not fedrl's; return whether it is shadowed."""
    location = wrappers_location()
    if location is None or _is_own(location):
        return False
    warnings.warn(
        f"the module name 'wrappers' resolves to {location}, not to fedrl's compatibility package "
        f"({_OWN_WRAPPERS}); fedrl itself does not need it, but `from wrappers import FederatedVecEnv` "
        "will not find fedrl's class: import it from fedrl_wrappers instead "
        "(`from fedrl_wrappers import FederatedVecEnv`, the same class)",
        WrappersShadowedWarning,
        stacklevel=3,
    )
    return True
