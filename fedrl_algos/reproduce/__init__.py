"""``fedrl reproduce``: the papers' experiments as batched programs with figures and reports.

Importing this package registers every experiment in :data:`EXPERIMENTS`: the tabular ones
(:mod:`fedrl_algos.reproduce.tabular`: ``personalization``, ``alpha``) and the neural ones
(:mod:`fedrl_algos.reproduce.neural`: ``curvature``, ``fewshot``, ``rollouts``), and the MFPO
paper's comparison (:mod:`fedrl_algos.reproduce.mfpo`: ``mfpo``, ``byzantine``; not part of ``all``,
whose full versions take hours on two cores).
"""

from importlib import import_module
from importlib.util import find_spec

from fedrl_algos.reproduce.common import EXPERIMENTS, Experiment, ExperimentOutput, TableRow, register, run_experiment

# Every module listed here registers its experiments when imported; a module that is not there
# (yet) is skipped. Add new experiment modules to this tuple.
EXPERIMENT_MODULES = ("fedrl_algos.reproduce.tabular", "fedrl_algos.reproduce.neural", "fedrl_algos.reproduce.mfpo")

for _module in EXPERIMENT_MODULES:
    if find_spec(_module) is not None:
        import_module(_module)

__all__ = ["EXPERIMENTS", "EXPERIMENT_MODULES", "Experiment", "ExperimentOutput", "TableRow", "register", "run_experiment"]
