"""Federated averaging of any Stable-Baselines3 algorithm: Fed-DQN, Fed-SAC, Fed-PPO.

FedAvg (McMahan et al., 2017, https://arxiv.org/abs/1602.05629) around unmodified SB3 learners,
laid out as SB3 lays out an algorithm:

* :mod:`~fedrl_algos.fedavg_sb3.fedavg_sb3`: :class:`FedAvgSB3`, the SB3-style shell (``learn``,
  ``predict``, ``save``/``load``, loggers, callbacks);
* :mod:`~fedrl_algos.fedavg_sb3.aggregation`: the server step — :func:`parameter_average`, FedAvg's
  weighted parameter average, and the strategy objects around it (:class:`ParameterAverage`, the
  selectors :class:`PrefixSelector` and :class:`PolicySelector`, :func:`default_selector`);
* :mod:`~fedrl_algos.fedavg_sb3.persistence`: the zip/JSON format of a saved federation.

The MFPO paper's settings of these baselines are an experiment, not part of the algorithm:
:mod:`fedrl_algos.reproduce.sb3_baselines`. See ``docs/algorithms/fedavg_sb3.md``.
"""

from fedrl_algos.fedavg_sb3.aggregation import (
    Aggregator,
    ParameterAverage,
    PolicySelector,
    PrefixSelector,
    Selector,
    broadcast,
    default_selector,
    parameter_average,
)
from fedrl_algos.fedavg_sb3.fedavg_sb3 import FedAvgSB3

__all__ = [
    "Aggregator",
    "FedAvgSB3",
    "ParameterAverage",
    "PolicySelector",
    "PrefixSelector",
    "Selector",
    "broadcast",
    "default_selector",
    "parameter_average",
]
