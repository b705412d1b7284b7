"""``fedrl reproduce``: the papers' experiments as batched programs with figures and reports.

:data:`EXPERIMENTS` lists every experiment: the tabular ones
(:mod:`fedrl_algos.reproduce.tabular`: ``personalization``, ``alpha``), the neural ones
(:mod:`fedrl_algos.reproduce.neural`: ``curvature``, ``fewshot``, ``rollouts``), the MFPO
paper's comparison (:mod:`fedrl_algos.reproduce.mfpo`: ``mfpo``, ``byzantine``) and, beyond the
papers, partial participation (:mod:`fedrl_algos.reproduce.partial`: ``partial``); ``fedrl reproduce all``
runs all of them in this order. Each takes a frozen config (``experiment.config_class``)::

    from fedrl_algos.reproduce import EXPERIMENTS, run_experiment

    alpha = EXPERIMENTS["alpha"]
    run_experiment(alpha, "out", seeds=2, config=alpha.config(quick=True, alphas=(0.0, 1.0)))
"""

from types import MappingProxyType

from fedrl_algos.reproduce.common import Experiment, ExperimentOutput, TableRow, config_settings, run_experiment
from fedrl_algos.reproduce.mfpo import ByzantineConfig, ByzantineExperiment, MFPOComparison, MFPOConfig
from fedrl_algos.reproduce.neural import (
    CurvatureConfig,
    CurvatureExperiment,
    FewShotConfig,
    FewShotExperiment,
    RolloutsConfig,
    RolloutsExperiment,
)
from fedrl_algos.reproduce.partial import PartialConfig, PartialExperiment
from fedrl_algos.reproduce.tabular import AlphaConfig, AlphaExperiment, PersonalizationConfig, PersonalizationExperiment

#: every experiment by name, in the order of ``fedrl reproduce --help`` and of ``fedrl reproduce all``
#: (read-only: the experiments hold no state, a run's settings are its config)
EXPERIMENTS = MappingProxyType(
    {
        experiment.name: experiment
        for experiment in (
            PersonalizationExperiment(),
            AlphaExperiment(),
            CurvatureExperiment(),
            FewShotExperiment(),
            RolloutsExperiment(),
            MFPOComparison(),
            ByzantineExperiment(),
            PartialExperiment(),
        )
    }
)

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "ExperimentOutput",
    "TableRow",
    "config_settings",
    "run_experiment",
    "PersonalizationConfig",
    "AlphaConfig",
    "CurvatureConfig",
    "FewShotConfig",
    "RolloutsConfig",
    "MFPOConfig",
    "ByzantineConfig",
    "PartialConfig",
]
