"""Figures of ``partial`` (:mod:`fedrl_algos.reproduce.partial`): F under client sampling, with and
without control variates, and the wall time per round of each participation path.

They draw from the records of ``results.json``: ``kind == "curve"`` (per method, agents per round,
control variates, seed and round: ``F`` and ``trajectories_total``) and ``kind == "timing"`` (per
federation size, runs and path: ``round_s_median``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedrl_algos.reproduce.plots import pyplot, save
from fedrl_algos.reproduce.plots.tabular import band

__all__ = ["partial_figures"]


def partial_figures(records: list[dict[str, Any]], settings: dict[str, Any], out_dir: Path, labels: Mapping[str, str],
                    setting_label: Callable[[int, int, bool], str], paths: Sequence[str]) -> list[Path]:
    """F against rounds (``partial_rounds.png``) and against the trajectories of all agents together
    (``partial_trajectories.png``), one panel per method; the median wall time per round of each path
    (``partial_wall_time.png``, when the records have timings).

    :param records: the ``partial`` records
    :param settings: the run's settings (``n_agents``; ``fraction``, default 4)
    :param out_dir: where the PNGs go
    :param labels: each method's display name, in the order of the panels
    :param setting_label: the display name of ``(agents per round r, n, control variates)``
    :param paths: the timed participation paths (``full``, ``subset``, ``masked``), in the order of the bars
    """
    plt = pyplot()
    curves: dict[tuple[str, int, bool], dict[tuple[int, int], tuple[float, float]]] = {}
    for rec in records:
        if rec["kind"] == "curve":
            curves.setdefault((rec["method"], rec["agents_per_round"], rec["control_variates"]), {})[(rec["round"], rec["seed"])] = (
                rec["trajectories_total"], rec["F"])
    n = int(settings["n_agents"])
    methods = [m for m in labels if any(key[0] == m for key in curves)]
    out = []
    for axis, fname, xlabel in (("round", "partial_rounds.png", "communication round"),
                                ("total", "partial_trajectories.png", "trajectories, all agents together")):
        fig, axes = plt.subplots(1, len(methods), figsize=(4.6 * len(methods), 3.8), sharey=True, squeeze=False)
        for ax, m in zip(axes[0], methods):
            for (mm, r, cv), cells in sorted(curves.items()):
                if mm != m:
                    continue
                rounds = sorted({k for k, _ in cells})
                seeds = sorted({s for _, s in cells})
                y = torch.tensor([[cells[(k, s)][1] for s in seeds] for k in rounds], dtype=torch.float64)
                x = torch.tensor(rounds if axis == "round" else [cells[(k, seeds[0])][0] for k in rounds], dtype=torch.float64)
                color = "tab:blue" if r == n else "tab:red"
                band(ax, x, y, color, setting_label(r, n, cv), dashed=cv)
            ax.set_title(labels[m], fontsize=10)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("exact F")
        axes[0][0].legend(fontsize=7, loc="lower right")
        fig.suptitle("Partial participation on the gridworld (dashed: SCAFFOLD control variates)")
        out.append(save(fig, out_dir / fname))
    timing = [rec for rec in records if rec["kind"] == "timing"]
    frac = int(settings.get("fraction", 4))
    if timing:
        groups = sorted({(rec["n_agents"], rec["runs"]) for rec in timing})
        fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(groups), 3.8))
        width = 0.27
        for j, path in enumerate(paths):
            values = [1e3 * next(rec["round_s_median"] for rec in timing if (rec["n_agents"], rec["runs"], rec["path"]) == g + (path,))
                      for g in groups]
            ax.bar([i + (j - 1) * width for i in range(len(groups))], values, width,
                   label={"full": "r = n", "subset": f"r = n/{frac}, sampled only", "masked": f"r = n/{frac}, masked (previous)"}[path],
                   color=("tab:blue", "tab:red", "tab:gray")[j])
        ax.set_xticks(range(len(groups)), [f"n={na}, {runs} run(s)" for na, runs in groups], fontsize=8)
        ax.set_ylabel("wall time per round (ms)")
        ax.set_title("Wall time per round (median)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        out.append(save(fig, out_dir / "partial_wall_time.png"))
    return out
