"""Deprecated module: the classes moved to one package per algorithm.

``PerFedAvgPG`` is in :mod:`fedrl_algos.per_fedavg_pg`, ``FedAvgPG`` in :mod:`fedrl_algos.fedavg_pg`
and ``IndependentPG`` in :mod:`fedrl_algos.independent_pg` (all three also in :mod:`fedrl_algos`).
Importing them from here works for one release, with a ``DeprecationWarning``.
"""

from fedrl_algos.common.deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {"PerFedAvgPG": "fedrl_algos.per_fedavg_pg", "FedAvgPG": "fedrl_algos.fedavg_pg", "IndependentPG": "fedrl_algos.independent_pg"},
)
