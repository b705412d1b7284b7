"""Deprecated module: the shared base classes moved to :mod:`fedrl_algos.common`.

Importing ``FederatedAlgorithm``, ``EnvFreeLearnMixin``, ``FederatedProgressBar`` or
``resolve_federation_env`` from here works for one release, with a ``DeprecationWarning``.
"""

from fedrl_algos.common.deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    dict.fromkeys(("FederatedAlgorithm", "EnvFreeLearnMixin", "FederatedProgressBar", "resolve_federation_env"), "fedrl_algos.common"),
)
