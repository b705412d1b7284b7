"""FedPG-BR (federated policy gradient with Byzantine resilience): the SB3-style class and its update."""

from fedrl_algos.fedpg_br.fedpg_br import FedPGBR
from fedrl_algos.fedpg_br.update import (
    FedPGBRUpdate,
    FilterResult,
    byzantine_filter,
    filter_threshold,
    filtered_mean,
    geometric_inner_steps,
    make_server_sampler,
    server_trajectories,
)

__all__ = [
    "FedPGBR",
    "FedPGBRUpdate",
    "FilterResult",
    "byzantine_filter",
    "filter_threshold",
    "filtered_mean",
    "geometric_inner_steps",
    "make_server_sampler",
    "server_trajectories",
]
