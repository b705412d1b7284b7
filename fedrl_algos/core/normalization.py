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
    :param runs: ``None`` (one federation: every observation is pooled) or the number of independent
        runs batched in one program (the reproduction harness's seeds): one set of moments per run,
        indexed by the observations' leading dimension (``[runs, ...batch, *shape]``), so that batched
        runs stay the runs they would be alone
    """

    shape: tuple[int, ...]
    clip: float = 10.0
    eps: float = 1e-8
    device: torch.device | str = "cpu"
    runs: int | None = None
    mean: torch.Tensor = field(init=False)
    var: torch.Tensor = field(init=False)
    count: torch.Tensor = field(init=False)
    _pending: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        if self.runs is not None and (isinstance(self.runs, bool) or not isinstance(self.runs, int) or self.runs < 1):
            raise ValueError(f"runs must be None or an int >= 1, got {self.runs!r}")
        lead = () if self.runs is None else (self.runs,)
        # SB3 starts from mean 0, var 1 and a tiny count (1e-4), so the first update dominates.
        self.mean = torch.zeros(lead + self.shape, dtype=torch.float64, device=self.device)
        self.var = torch.ones(lead + self.shape, dtype=torch.float64, device=self.device)
        self.count = torch.full(lead, 1e-4, dtype=torch.float64, device=self.device)
        self._pending = self._empty_sums()

    def _empty_sums(self) -> list[torch.Tensor]:
        return [torch.zeros_like(self.count), torch.zeros_like(self.mean), torch.zeros_like(self.mean)]

    def _per_run(self, value: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``value [runs?, *shape]`` (or ``[runs?]``) viewed to broadcast over ``batch_dims`` batch dimensions."""
        if self.runs is None:
            return value
        return value.reshape(self.runs, *([1] * batch_dims), *value.shape[1:])

    def _check_runs(self, obs: torch.Tensor) -> int:
        """The batch dimensions of ``obs`` after the runs' (checked)."""
        batch_dims = obs.dim() - len(self.shape)
        if self.runs is not None:
            batch_dims -= 1
            if batch_dims < 0 or obs.shape[0] != self.runs:
                raise ValueError(f"observations must lead with the normalizer's {self.runs} runs, got shape {tuple(obs.shape)}")
        return batch_dims

    def normalize(self, obs: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``clip((obs − μ) / sqrt(σ² + ε))`` in ``dtype``, for observations ``[..., *shape]`` (``[runs, ..., *shape]``
        with ``runs``)."""
        batch_dims = self._check_runs(obs)
        mean = self._per_run(self.mean.to(obs.device), batch_dims)
        std = self._per_run(torch.sqrt(self.var.to(obs.device) + self.eps), batch_dims)
        return ((obs.to(torch.float64) - mean) / std).clamp(-self.clip, self.clip).to(dtype)

    def accumulate(self, obs: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the raw observations ``[..., *shape]`` of the steps where ``mask [...]`` is nonzero
        to this round's moments (nothing changes what :meth:`normalize` returns until :meth:`commit`)."""
        self._check_runs(obs)
        w = (mask > 0).to(torch.float64).to(self.mean.device)
        x = obs.to(torch.float64).to(self.mean.device)
        w_full = w.reshape(*w.shape, *([1] * len(self.shape)))
        lead = () if self.runs is None else (self.runs,)
        self._pending[0] = self._pending[0] + w.reshape(*lead, -1).sum(-1)
        self._pending[1] = self._pending[1] + (w_full * x).reshape(*lead, -1, *self.shape).sum(len(lead))
        self._pending[2] = self._pending[2] + (w_full * x * x).reshape(*lead, -1, *self.shape).sum(len(lead))

    def commit(self) -> None:
        """The server's step: merge this round's pooled moments into the running ones (Chan et al.);
        with ``runs``, each run's into its own (a run that sampled nothing keeps its moments)."""
        n, total, squares = self._pending
        if bool((n > 0).any()):
            n_full = n.reshape(*n.shape, *([1] * len(self.shape)))
            safe = n_full.clamp(min=1.0)
            batch_mean = total / safe
            batch_var = (squares / safe - batch_mean * batch_mean).clamp(min=0.0)
            delta = batch_mean - self.mean
            old = self.count.reshape(n_full.shape)
            count = old + n_full
            mean = self.mean + delta * n_full / count
            var = (self.var * old + batch_var * n_full + delta * delta * old * n_full / count) / count
            sampled = n_full > 0
            self.mean = torch.where(sampled, mean, self.mean)
            self.var = torch.where(sampled, var, self.var)
            self.count = self.count + n
        self._pending = self._empty_sums()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The running moments (the round's pending sums are not part of a saved model)."""
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`."""
        self.mean = state["mean"].to(torch.float64).to(self.mean.device).clone()
        self.var = state["var"].to(torch.float64).to(self.mean.device).clone()
        self.count = state["count"].to(torch.float64).to(self.mean.device).clone()
