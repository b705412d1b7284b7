"""FedAvg-PG (FedAvg applied to policy gradient): the SB3-style class and its round."""

from fedrl_algos.fedavg_pg.fedavg_pg import FedAvgPG
from fedrl_algos.fedavg_pg.update import fedavg_pg_round

__all__ = ["FedAvgPG", "fedavg_pg_round"]
