"""fedrl algorithms: a batched functional core, policies that own their calculus, one package per algorithm.

Layers (each imports only the ones before it): :mod:`fedrl_algos.core` (trajectory batches,
samplers, estimators, aggregation, server optimizers, attacks) → :mod:`fedrl_algos.policies` →
:mod:`fedrl_algos.common` (the SB3 shell every federation shares) → one package per algorithm
(:mod:`~fedrl_algos.per_fedavg_pg`, :mod:`~fedrl_algos.fedavg_pg`, :mod:`~fedrl_algos.independent_pg`,
:mod:`~fedrl_algos.mfpo`, :mod:`~fedrl_algos.fedpg_br`, :mod:`~fedrl_algos.fedavg_sb3`) →
:mod:`fedrl_algos.reproduce` and the ``fedrl`` command line. See ``docs/architecture.md``.

>>> from fedrl_algos import PerFedAvgPG, FedAvgPG, IndependentPG
"""

from fedrl_algos.fedavg_pg import FedAvgPG
from fedrl_algos.fedavg_sb3 import FedAvgSB3
from fedrl_algos.fedpg_br import FedPGBR
from fedrl_algos.independent_pg import IndependentPG
from fedrl_algos.mfpo import MFPO
from fedrl_algos.per_fedavg_pg import PerFedAvgPG
from fedrl_algos.policies import FastMlpPolicy, FlatPolicy, MlpPolicy, TabularPolicy

#: the library's algorithms by the name the command line gives them (``fedrl flower --algo NAME``)
ALGORITHMS: dict[str, type] = {
    "per_fedavg_pg": PerFedAvgPG,
    "fedavg_pg": FedAvgPG,
    "independent_pg": IndependentPG,
    "mfpo": MFPO,
    "fedpg_br": FedPGBR,
    "fedavg_sb3": FedAvgSB3,
}

__all__ = [
    "ALGORITHMS",
    "MFPO",
    "FastMlpPolicy",
    "FedAvgPG",
    "FedAvgSB3",
    "FedPGBR",
    "FlatPolicy",
    "IndependentPG",
    "MlpPolicy",
    "PerFedAvgPG",
    "TabularPolicy",
]
