"""fedrl algorithms: a batched functional core and SB3-style classes.

>>> from fedrl_algos import PerFedAvgPG, FedAvgPG, IndependentPG
"""

from fedrl_algos.fedavg_sb3 import FedAvgSB3
from fedrl_algos.fedpg_br import FedPGBR
from fedrl_algos.mfpo import MFPO
from fedrl_algos.per_fedavg import FedAvgPG, IndependentPG, PerFedAvgPG
from fedrl_algos.policies import FlatPolicy, MlpPolicy, TabularPolicy

__all__ = ["FedAvgPG", "FlatPolicy", "IndependentPG", "MlpPolicy", "PerFedAvgPG", "TabularPolicy"]
__all__ += ["FedAvgSB3"]
__all__ += ["FedPGBR", "MFPO"]
