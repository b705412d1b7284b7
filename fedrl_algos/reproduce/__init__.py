"""``fedrl reproduce``: the papers' experiments as batched programs with figures and reports.

Importing this package registers every experiment in :data:`EXPERIMENTS`.
"""

from fedrl_algos.reproduce.common import EXPERIMENTS, Experiment, ExperimentOutput, TableRow, register, run_experiment

__all__ = ["EXPERIMENTS", "Experiment", "ExperimentOutput", "TableRow", "register", "run_experiment"]
