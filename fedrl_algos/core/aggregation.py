"""Server-side aggregation: the (weighted) average over agents of FedAvg and its relatives, and the
validation of the agents' updates that every server applies before it aggregates them.

A server never lets one client corrupt its state: :func:`validate_updates` checks every agent's
update (shape, dtype, finite values) and says why it rejects one; :func:`aggregate_valid` averages
the valid ones only and, in a run where none is valid, keeps the server's value (the round is
skipped). Callers report the rejections (:func:`warn_rejected`, or their own logger).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

__all__ = [
    "aggregate",
    "aggregate_valid",
    "validate_updates",
    "UpdateCheck",
    "RejectedUpdateWarning",
    "warn_rejected",
    "OnReject",
]


class RejectedUpdateWarning(RuntimeWarning):
    """A server rejected an agent's update (non-finite, wrong shape or dtype) and aggregated the others."""


class UpdateCheck(NamedTuple):
    """What :func:`validate_updates` found.

    :param valid: which agents' updates may be aggregated ``[*R, n]`` (bool)
    :param reasons: one human-readable line per rejected update (``"run r, agent k: ..."``); empty
        when every update is valid
    """

    valid: torch.Tensor
    reasons: tuple[str, ...]

    @property
    def all_valid(self) -> bool:
        """Whether no update was rejected."""
        return not self.reasons

    @property
    def skipped(self) -> torch.Tensor:
        """Runs in which no update survived ``[*R]`` (bool): their server keeps its state."""
        return ~self.valid.any(-1)

    @property
    def n_rejected(self) -> int:
        """Number of rejected ``(run, agent)`` updates."""
        return int((~self.valid).sum())

    def merge(self, other: UpdateCheck) -> UpdateCheck:
        """Valid only where both checks are (e.g. an agent's parameters *and* its direction)."""
        return UpdateCheck(self.valid & other.valid, self.reasons + other.reasons)


#: a callback receiving the check of a round's updates when some were rejected
OnReject = Callable[[UpdateCheck], None]


def _where(index: tuple[int, ...]) -> str:
    """``"run r, agent k"`` (or ``"agent k"`` without a run axis) of an index over ``[*R, n]``."""
    *runs, agent = index
    prefix = f"run {', '.join(map(str, runs))}, " if runs else ""
    return f"{prefix}agent {agent}"


def validate_updates(
    updates: torch.Tensor | Sequence[torch.Tensor],
    like: torch.Tensor,
    what: str = "update",
    extra_dims: int = 1,
) -> UpdateCheck:
    """Check every agent's update against the server's tensor ``like``: shape, dtype, finite values.

    A pure function: it changes nothing and reports what it finds.

    * ``updates`` a tensor ``[*R, n, *S]`` (the batched in-process case): its batch shape must be
      ``like``'s ``[*R]`` and its trailing shape ``S`` and dtype ``like``'s, else every update is
      rejected; then each ``(run, agent)`` row must be finite.
    * ``updates`` a sequence of ``n`` tensors (one per agent, e.g. received from clients): each
      must have ``like``'s shape and dtype and finite values; ``like`` has no run axis then.

    :param updates: the agents' updates (parameters, directions, gradients or spreads)
    :param like: the server's tensor the updates must match: ``[*R, *S]`` (batched) or ``[*S]``
        (a sequence)
    :param what: the name of the updates in the reasons (``"parameters"``, ``"gradient"``, ...)
    :param extra_dims: trailing dims ``S`` of one update in the batched case (1 for a flat
        parameter vector ``[d]``, 0 for a scalar such as a reported spread)
    :return: the valid mask ``[*R, n]`` (``[n]`` for a sequence) and the reasons
    """
    if not isinstance(like, torch.Tensor):
        raise TypeError(f"like must be a torch.Tensor, got {type(like).__name__}")
    if isinstance(updates, torch.Tensor):
        return _validate_batched(updates, like, what, extra_dims)
    if not isinstance(updates, Sequence) or isinstance(updates, str):
        raise TypeError(f"updates must be a tensor [*R, n, ...] or a sequence of tensors, got {type(updates).__name__}")
    valid, reasons = [], []
    for k, update in enumerate(updates):
        problem = _problem(update, tuple(like.shape), like.dtype)
        valid.append(problem is None)
        if problem is not None:
            reasons.append(f"agent {k}: {what} {problem}")
    return UpdateCheck(torch.tensor(valid, dtype=torch.bool, device=like.device), tuple(reasons))


def _problem(update: object, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """Why one update is unusable (``None``: it is usable)."""
    if not isinstance(update, torch.Tensor):
        return f"is a {type(update).__name__}, not a tensor"
    if tuple(update.shape) != shape:
        return f"has shape {list(update.shape)}, expected {list(shape)}"
    if update.dtype != dtype:
        return f"has dtype {update.dtype}, expected {dtype}"
    bad = ~torch.isfinite(update)
    if bool(bad.any()):
        return f"has {int(bad.sum())} non-finite values (NaN or inf) of {update.numel()}"
    return None


def _validate_batched(updates: torch.Tensor, like: torch.Tensor, what: str, extra_dims: int) -> UpdateCheck:
    batch = tuple(like.shape[: like.dim() - extra_dims])
    trailing = tuple(like.shape[like.dim() - extra_dims :])
    expected = f"[{', '.join(map(str, (*batch, 'n', *trailing)))}]"
    shape_ok = updates.dim() == len(batch) + 1 + extra_dims and tuple(updates.shape[: len(batch)]) == batch and (
        tuple(updates.shape[updates.dim() - extra_dims :]) == trailing
    )
    if not shape_ok or updates.dtype != like.dtype:
        n = updates.shape[len(batch)] if updates.dim() > len(batch) else 1
        problem = f"shape {list(updates.shape)}, expected {expected}" if not shape_ok else f"dtype {updates.dtype}, expected {like.dtype}"
        valid = torch.zeros(*batch, n, dtype=torch.bool, device=like.device)
        return UpdateCheck(valid, (f"every agent: {what} tensor has {problem}",))
    finite = torch.isfinite(updates)
    valid = finite.reshape(*updates.shape[: len(batch) + 1], -1).all(-1) if extra_dims else finite
    if bool(valid.all()):
        return UpdateCheck(valid, ())
    reasons = []
    counts = (~finite).reshape(*valid.shape, -1).sum(-1)
    size = max(1, int(torch.tensor(trailing).prod())) if trailing else 1
    for index in (~valid).nonzero().tolist():
        reasons.append(f"{_where(tuple(index))}: {what} has {int(counts[tuple(index)])} non-finite values (NaN or inf) of {size}")
    return UpdateCheck(valid, tuple(reasons))


def warn_rejected(check: UpdateCheck, context: str = "server") -> None:
    """Report the rejections of ``check`` as one :class:`RejectedUpdateWarning` (nothing when all are valid)."""
    if check.all_valid:
        return
    skipped = int(check.skipped.sum())
    tail = f"; {skipped} run(s) had no valid update and skipped the round (server state unchanged)" if skipped else ""
    warnings.warn(f"{context}: rejected {check.n_rejected} update(s): " + "; ".join(check.reasons) + tail,
                  RejectedUpdateWarning, stacklevel=3)


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


def masked_weights(valid: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The aggregation weights ``[*R, n]`` with rejected agents at 0."""
    base = torch.ones_like(valid, dtype=torch.float64) if weights is None else weights.to(torch.float64)
    return torch.where(valid, base, torch.zeros_like(base))


def aggregate_valid(
    local: torch.Tensor,
    server: torch.Tensor,
    weights: torch.Tensor | None = None,
    check: UpdateCheck | None = None,
    on_reject: OnReject | None = None,
    what: str = "parameters",
) -> tuple[torch.Tensor, UpdateCheck]:
    """:func:`aggregate` of the valid updates only; a run with none (valid and weighted) keeps ``server``.

    With every update valid the result is :func:`aggregate`'s, bit for bit. Otherwise rejected rows
    get weight 0 (and are zeroed first, so that a NaN cannot leak through ``0·NaN``).

    :param local: the agents' updates ``[*R, n, d]``
    :param server: the server's current value ``[*R, d]`` (kept where nothing survives)
    :param weights: optional non-negative weights ``[*R, n]`` (e.g. a participation mask)
    :param check: a check already made (default: :func:`validate_updates` of ``local`` against ``server``)
    :param on_reject: called with the check when an update was rejected (default: :func:`warn_rejected`)
    :param what: the name of the updates in the reasons
    :return: the aggregate ``[*R, d]`` and the check
    """
    if check is None:
        check = validate_updates(local, server, what)
    if check.all_valid:
        return aggregate(local, weights), check
    (on_reject or warn_rejected)(check)
    if local.shape[:-2] != server.shape[:-1] or local.shape[-1] != server.shape[-1] or local.dtype != server.dtype:
        return server.clone(), check  # the whole tensor is unusable: the round is skipped everywhere
    w = masked_weights(check.valid, weights)
    alive = w.sum(-1) > 0  # [*R]
    safe = torch.where(check.valid.unsqueeze(-1), local, torch.zeros_like(local))
    mean = (safe * w.to(local.dtype).unsqueeze(-1)).sum(-2) / w.sum(-1, keepdim=True).clamp(min=1e-300).to(local.dtype)
    return torch.where(alive.unsqueeze(-1), mean, server), check
