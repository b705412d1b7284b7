"""Per-FedAvg-PG (personalized federated policy gradient by MAML): the SB3-style class and its update."""

from fedrl_algos.per_fedavg_pg.per_fedavg_pg import PerFedAvgPG
from fedrl_algos.per_fedavg_pg.update import ExactMetaGradient, FirstOrderMetaGradient, per_fedavg_pg_round

__all__ = ["ExactMetaGradient", "FirstOrderMetaGradient", "PerFedAvgPG", "per_fedavg_pg_round"]
