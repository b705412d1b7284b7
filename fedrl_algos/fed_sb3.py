"""Deprecated: the old home of the federated SB3 baselines; it goes in the next release.

``fedrl_algos.fed_sb3`` was split by concern: the algorithm is :mod:`fedrl_algos.fedavg_sb3`
(:class:`~fedrl_algos.fedavg_sb3.FedAvgSB3`, the selectors and :class:`~fedrl_algos.fedavg_sb3.ParameterAverage`)
and the MFPO paper's settings are :mod:`fedrl_algos.reproduce.sb3_baselines` (``run_fed_baseline``;
``BASELINES`` is now ``SB3_BASELINE_DEFAULTS``). Each old name still resolves, to the very object
at its new place, with a ``DeprecationWarning`` that names that place; ``dir()`` does not list
them (so that tools which walk a module's names, pytest's collection among them, do not trigger
the warnings). Files saved by the old module load unchanged (the format did not change).
"""

from __future__ import annotations

import warnings
from typing import Any

# old name -> (new module, new name)
_MOVED: dict[str, tuple[str, str]] = {
    **{
        name: ("fedrl_algos.fedavg_sb3", name)
        for name in (
            "FedAvgSB3",
            "Aggregator",
            "ParameterAverage",
            "PolicySelector",
            "PrefixSelector",
            "broadcast",
            "default_selector",
        )
    },
    "BASELINES": ("fedrl_algos.reproduce.sb3_baselines", "SB3_BASELINE_DEFAULTS"),
    "run_fed_baseline": ("fedrl_algos.reproduce.sb3_baselines", "run_fed_baseline"),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new_name = _MOVED[name]
    # Imported on first use, not at import time: the algorithm alone must not pull in the
    # reproduction package, and an old `import fedrl_algos.fed_sb3` should cost nothing.
    if module == "fedrl_algos.fedavg_sb3":
        import fedrl_algos.fedavg_sb3 as target
    else:
        import fedrl_algos.reproduce.sb3_baselines as target
    new = f"{module}.{new_name}"
    what = f"{name} is now {new}" if new_name != name else f"{name} moved to {module}"
    warnings.warn(
        f"fedrl_algos.fed_sb3 is deprecated and will be removed in the next release: {what}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(target, new_name)
