"""MFPO (momentum-assisted federated policy optimization): the SB3-style class and its update."""

from fedrl_algos.core.schedules import ExponentialStepSize, LinearStepSize, MomentumSchedule
from fedrl_algos.mfpo.mfpo import MFPO
from fedrl_algos.mfpo.update import MFPOState, MFPOUpdate, adam_server_step, ascend, momentum_direction, server_step

__all__ = ["MFPO", "ExponentialStepSize", "LinearStepSize", "MFPOState", "MFPOUpdate", "MomentumSchedule", "adam_server_step", "ascend",
           "momentum_direction", "server_step"]
