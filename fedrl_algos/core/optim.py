"""Server-side optimizers as pure functions over batched flat parameters ``theta [*R, d]``.

FedPG-BR's experiments (Fan et al., 2021) step the server with Adam on the aggregated policy
gradient; :func:`adam_ascent` is that step for every run at once, with the optimizer state
passed in and returned (no ``torch.optim`` object holding per-run state). Applied to a
federation's pseudo-gradient ``mean_k θ_k − θ`` it is the server side of FedAdam (Reddi et al.,
2021, "Adaptive federated optimization").
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["AdamState", "adam_ascent", "SERVER_OPTIMIZERS", "check_server_optimizer"]

#: the server optimizers the federated algorithms accept
SERVER_OPTIMIZERS = ("sgd", "adam")


def check_server_optimizer(name: str, value: object) -> str:
    """``value`` if it names a server optimizer, else a ``ValueError`` naming the argument ``name``."""
    if value not in SERVER_OPTIMIZERS:
        raise ValueError(f"{name} must be one of {SERVER_OPTIMIZERS}, got {value!r}")
    return str(value)


class AdamState(NamedTuple):
    """Adam's state for a batch of runs.

    :param step: steps taken so far ``[*R]`` (float, for the bias corrections)
    :param first: first-moment estimate ``[*R, d]``
    :param second: second-moment estimate ``[*R, d]``
    """

    step: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor

    @classmethod
    def zeros_like(cls, theta: torch.Tensor) -> AdamState:
        """The initial state for parameters shaped like ``theta [*R, d]``."""
        return cls(torch.zeros(theta.shape[:-1], dtype=theta.dtype, device=theta.device), torch.zeros_like(theta), torch.zeros_like(theta))


def adam_ascent(
    theta: torch.Tensor,
    direction: torch.Tensor,
    state: AdamState,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, AdamState]:
    """One Adam step along an ascent ``direction`` (``torch.optim.Adam`` on the loss ``−J``).

    :param theta: parameters ``[*R, d]``
    :param direction: the (estimated) gradient of the objective to maximize ``[*R, d]``
    :param state: the state before the step
    :param lr: step size
    :param betas: decay rates of the two moment estimates
    :param eps: added to the root of the second moment
    :param active: ``[*R]`` bool; rows where it is ``False`` keep their parameters and state
    :return: new parameters and state
    """
    if direction.shape != theta.shape or state.first.shape != theta.shape or state.second.shape != theta.shape:
        raise ValueError(
            f"direction and the state's moments must have theta's shape {tuple(theta.shape)}, got direction "
            f"{tuple(direction.shape)}, first {tuple(state.first.shape)}, second {tuple(state.second.shape)}"
        )
    if state.step.shape != theta.shape[:-1]:
        raise ValueError(f"state.step must have theta's batch shape {tuple(theta.shape[:-1])}, got {tuple(state.step.shape)}")
    beta1, beta2 = betas
    step = state.step + 1
    first = beta1 * state.first + (1 - beta1) * direction
    second = beta2 * state.second + (1 - beta2) * direction * direction
    bias1 = (1 - beta1**step).unsqueeze(-1)
    bias2 = (1 - beta2**step).unsqueeze(-1)
    new_theta = theta + lr * (first / bias1) / ((second / bias2).sqrt() + eps)
    if active is None:
        return new_theta, AdamState(step, first, second)
    rows = active.unsqueeze(-1)
    return (
        torch.where(rows, new_theta, theta),
        AdamState(torch.where(active, step, state.step), torch.where(rows, first, state.first), torch.where(rows, second, state.second)),
    )
