"""Server-side aggregation: the (weighted) average over agents of FedAvg and its relatives."""

from __future__ import annotations

import torch

__all__ = ["aggregate"]


def aggregate(local: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Server average over the agent axis (second to last): ``[*R, n, d] → [*R, d]``.

    :param local: agents' parameters after their local steps
    :param weights: optional non-negative weights ``[*R, n]`` (e.g. a participation mask); each
        run's weights are normalized to sum to one
    """
    if weights is None:
        return local.mean(-2)
    weights = weights.to(local.dtype)
    return (local * weights.unsqueeze(-1)).sum(-2) / weights.sum(-1, keepdim=True)
