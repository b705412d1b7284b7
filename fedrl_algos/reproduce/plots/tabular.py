"""Figures of the tabular experiments (:mod:`fedrl_algos.reproduce.tabular`): figure 1 and figure 6.

They draw from the records of ``results.json`` (one per method, α, seed and round: ``method``,
``alpha``, ``seed``, ``round``, ``trajectories``, ``F``, ``f``); bands are the seed mean ± one
population standard deviation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedrl_algos.reproduce.parallel import run_forked
from fedrl_algos.reproduce.plots import pyplot, save

__all__ = ["COLORS", "personalization_figures", "alpha_figures", "band"]

#: each method's colour, in every tabular figure
COLORS = {"exact": "tab:blue", "first_order": "tab:orange", "fedavg": "tab:green"}


def personalization_figures(records: list[dict[str, Any]], out_dir: Path, labels: Mapping[str, str],
                            uniform: float | None = None, budget: int | None = None) -> list[Path]:
    """Figure 1 (left): F (and the exact variant's f) against trajectories per agent; figure 6: the same
    against rounds. Writes ``fig1_left_trajectories.png`` and ``fig6_rounds.png``.

    :param records: the ``personalization`` records
    :param out_dir: where the PNGs go
    :param labels: each method's display name, in the order they are drawn
    :param uniform: f of the uniform-random policy, drawn as a line (``None``: none)
    :param budget: the paper's matched budget of trajectories per agent, drawn where the runs reach it
    """
    plt = pyplot()
    curves = _curves(records)
    paths = []
    for x, xlabel, title, fname in (("trajectories", "trajectories per agent", "Tabular personalization (fig. 1 left)",
                                      "fig1_left_trajectories.png"),
                                     ("round", "communication round", "Tabular personalization against rounds (fig. 6)",
                                      "fig6_rounds.png")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for m, label in labels.items():
            if (m, None) not in curves:
                continue
            c = curves[(m, None)]
            band(ax, c[x], c["F"], COLORS[m], label + " — F")
            if m == "exact":
                band(ax, c[x], c["f"], COLORS[m], label + " — f (before adaptation)", dashed=True)
        if x == "trajectories":
            if isinstance(uniform, float):
                ax.axhline(uniform, color="gray", lw=0.8, ls=":", label="uniform-random policy")
            if budget is not None and any(r["trajectories"] >= budget for r in records):
                ax.axvline(budget, color="black", lw=0.8, ls=":", label=f"matched budget ({budget} trajectories)")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("exact objective")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
        paths.append(save(fig, out_dir / fname))
    return paths


def alpha_figures(records: list[dict[str, Any]], out_dir: Path, labels: Mapping[str, str], workers: int = 1) -> list[Path]:
    """Figure 1 (right): final F against α (``fig1_right_alpha.png``); F against rounds, one panel
    per α (``alpha_rounds.png``).

    :param records: the ``alpha`` records
    :param out_dir: where the PNGs go
    :param labels: each method's display name, in the order they are drawn
    :param workers: with ``workers > 1`` the second figure is drawn in a forked child
        (:func:`~fedrl_algos.reproduce.parallel.run_forked`)
    """
    pyplot()  # matplotlib imported once, before a child is forked
    curves = _curves(records, by_alpha=True)
    last = max(r["round"] for r in records)
    figures = [functools.partial(_alpha_final_figure, curves, last, labels, out_dir),
               functools.partial(_alpha_rounds_figure, curves, labels, out_dir)]
    return run_forked(figures, workers)


def _alpha_final_figure(curves: dict, last: int, labels: Mapping[str, str], out_dir: Path) -> Path:
    """Figure 1 (right): final F against α, mean ± std over seeds."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for m, label in labels.items():
        alphas = sorted(a for (mm, a) in curves if mm == m)
        if not alphas:
            continue
        finals = torch.stack([curves[(m, a)]["F"][-1] for a in alphas])  # [n_alpha, seeds]
        mean, std = finals.mean(-1), finals.std(-1, unbiased=False)
        ax.errorbar(alphas, mean, yerr=std, marker="o", capsize=3, color=COLORS[m], label=label)
        ax.fill_between(alphas, mean - std, mean + std, color=COLORS[m], alpha=0.15)
    ax.set_xlabel("adaptation step size α")
    ax.set_ylabel(f"exact F after K={last} rounds")
    ax.set_title("Effect of α (fig. 1 right)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return save(fig, out_dir / "fig1_right_alpha.png")


def _alpha_rounds_figure(curves: dict, labels: Mapping[str, str], out_dir: Path) -> Path:
    """F against rounds, one panel per α."""
    plt = pyplot()
    alphas = sorted({a for (_, a) in curves})
    cols = min(3, len(alphas))
    rows = math.ceil(len(alphas) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.0 * cols, 3.0 * rows), sharex=True, sharey=True, squeeze=False)
    for i, alpha in enumerate(alphas):
        ax = axes[i // cols][i % cols]
        for m, label in labels.items():
            if (m, alpha) in curves:
                c = curves[(m, alpha)]
                band(ax, c["round"], c["F"], COLORS[m], label)
        ax.set_title(f"α = {alpha:g}", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("communication round")
    for row in axes:
        row[0].set_ylabel("exact F")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("F against rounds for every α")
    return save(fig, out_dir / "alpha_rounds.png")


def _curves(records: list[dict[str, Any]], by_alpha: bool = False) -> dict[tuple[str, float | None], dict[str, torch.Tensor]]:
    """Records → per (method, α) tensors ``round [K+1]``, ``trajectories [K+1]``, ``F``/``f [K+1, seeds]``."""
    groups: dict[tuple[str, float | None], dict[tuple[int, int], tuple[int, float, float]]] = {}
    for r in records:
        key = (r["method"], r["alpha"] if by_alpha else None)
        groups.setdefault(key, {})[(r["round"], r["seed"])] = (r["trajectories"], r["F"], r["f"])
    out = {}
    for key, cells in groups.items():
        rounds = sorted({k for k, _ in cells})
        seeds = sorted({s for _, s in cells})
        out[key] = {
            "round": torch.tensor(rounds, dtype=torch.float64),
            "trajectories": torch.tensor([cells[(k, seeds[0])][0] for k in rounds], dtype=torch.float64),
            "F": torch.tensor([[cells[(k, s)][1] for s in seeds] for k in rounds], dtype=torch.float64),
            "f": torch.tensor([[cells[(k, s)][2] for s in seeds] for k in rounds], dtype=torch.float64),
        }
    return out


def band(ax: Any, x: torch.Tensor, y: torch.Tensor, color: str, label: str, dashed: bool = False) -> None:
    """Seed mean of ``y [len(x), seeds]`` against ``x`` with a ± 1 population standard deviation band."""
    mean, std = y.mean(-1), y.std(-1, unbiased=False)
    ax.plot(x, mean, color=color, ls="--" if dashed else "-", lw=1.6, label=label)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.12 if dashed else 0.2, lw=0)
