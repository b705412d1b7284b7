"""Observation normalization with SB3 ``VecNormalize`` semantics, and its federated rule.

The policy sees ``clip((s − μ) / sqrt(σ² + ε), −c, c)`` (SB3's defaults ``c = 10``, ``ε = 1e-8``)
with running moments μ, σ² of every observation the agents trained on.

**The federated rule: the statistics are the server's.** Agents accumulate the moments of their
observations during a round; at the end of the round the server pools them — the count-weighted
average of the agents' means and variances, merged into the running moments with Chan et al.'s
parallel update (as SB3's ``RunningMeanStd``) — and every agent uses the pooled statistics, frozen,
during the next round. Why not keep them local: the server averages the agents' parameters, and
an average of networks is only meaningful if they read the same inputs — with per-agent
statistics the same weight would mean a different thing on each agent (for heterogeneous agents
most of all). The moments are aggregates of the agents' observations, of the same kind (and
privacy cost) as the averaged gradients. Freezing them within a round keeps every trajectory of a
local step normalized alike, so the estimators see one fixed input map.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["ObservationNormalizer"]


@dataclass
class ObservationNormalizer:
    """Running observation moments, pooled over agents once per round (see the module docstring).

    :param shape: one observation's shape
    :param clip: normalized observations are clipped to ``[−clip, clip]``
    :param eps: added to the variance
    :param device: torch device of the statistics
    """

    shape: tuple[int, ...]
    clip: float = 10.0
    eps: float = 1e-8
    device: torch.device | str = "cpu"
    mean: torch.Tensor = field(init=False)
    var: torch.Tensor = field(init=False)
    count: torch.Tensor = field(init=False)
    _pending: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        # SB3 starts from mean 0, var 1 and a tiny count (1e-4), so the first update dominates.
        self.mean = torch.zeros(self.shape, dtype=torch.float64, device=self.device)
        self.var = torch.ones(self.shape, dtype=torch.float64, device=self.device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=self.device)
        self._pending = [torch.zeros((), dtype=torch.float64, device=self.device), torch.zeros_like(self.mean), torch.zeros_like(self.mean)]

    def normalize(self, obs: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``clip((obs − μ) / sqrt(σ² + ε))`` in ``dtype``, for observations ``[..., *shape]``."""
        mean, std = self.mean.to(obs.device), torch.sqrt(self.var.to(obs.device) + self.eps)
        return ((obs.to(torch.float64) - mean) / std).clamp(-self.clip, self.clip).to(dtype)

    def accumulate(self, obs: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the raw observations ``[..., *shape]`` of the steps where ``mask [...]`` is nonzero
        to this round's moments (nothing changes what :meth:`normalize` returns until :meth:`commit`)."""
        w = (mask > 0).to(torch.float64).to(self.mean.device)
        x = obs.to(torch.float64).to(self.mean.device)
        w_full = w.reshape(*w.shape, *([1] * len(self.shape)))
        self._pending[0] = self._pending[0] + w.sum()
        self._pending[1] = self._pending[1] + (w_full * x).reshape(-1, *self.shape).sum(0)
        self._pending[2] = self._pending[2] + (w_full * x * x).reshape(-1, *self.shape).sum(0)

    def commit(self) -> None:
        """The server's step: merge this round's pooled moments into the running ones (Chan et al.)."""
        n, total, squares = self._pending
        if float(n) > 0:
            batch_mean = total / n
            batch_var = (squares / n - batch_mean * batch_mean).clamp(min=0.0)
            delta = batch_mean - self.mean
            count = self.count + n
            self.mean = self.mean + delta * n / count
            m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / count
            self.var = m2 / count
            self.count = count
        self._pending = [torch.zeros_like(n), torch.zeros_like(total), torch.zeros_like(squares)]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The running moments (the round's pending sums are not part of a saved model)."""
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`."""
        self.mean = state["mean"].to(torch.float64).to(self.mean.device).clone()
        self.var = state["var"].to(torch.float64).to(self.mean.device).clone()
        self.count = state["count"].to(torch.float64).to(self.mean.device).clone()
