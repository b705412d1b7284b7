"""Figures of the MFPO paper's experiments (:mod:`fedrl_algos.reproduce.mfpo`): figures 3, 5 and 6,
and FedPG-BR's Byzantine runs.

They draw from the records of ``results.json`` (per part, method or setting, seed and round:
``step``, the environment steps per agent, and ``return``, the evaluation return); curves are the
seed mean ± one population standard deviation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedrl_algos.reproduce.plots import pyplot, save

__all__ = ["mfpo_figures", "byzantine_figures"]


def mfpo_figures(records: list[dict[str, Any]], settings: dict[str, Any], out_dir: Path) -> list[Path]:
    """The methods' comparison (figure 3, ``mfpo_<env>_comparison.png``) and MFPO's sweeps over the
    number of agents N (figure 5, ``mfpo_<env>_agents.png``) and local steps K (figure 6,
    ``mfpo_<env>_local_steps.png``): return against environment steps per agent and against rounds,
    each figure where the records have its part.

    :param records: the ``mfpo`` records
    :param settings: the run's settings (``env``, ``n_agents``, ``methods``: the shape in the title)
    :param out_dir: where the PNGs go
    """
    paths = []
    comp = [r for r in records if r["part"] == "comparison"]
    env = settings.get("env", "cartpole")
    if comp:
        methods = settings.get("methods", {})
        shape = f"{settings.get('n_agents', 10)} agents, K = {methods.get('local_steps', 10)}, D = {methods.get('n_trajectories', 20)}"
        paths.append(_curves_figure(comp, "method", str, f"heterogeneous {env}: {shape} (mean ± std over seeds)",
                                    out_dir / f"mfpo_{env}_comparison.png"))
    for part, key, title, name in (("agents_sweep", "n_agents", "number of agents N (fig. 5)", "agents"),
                                    ("local_steps_sweep", "local_steps", "local steps K (fig. 6)", "local_steps")):
        rows = [r for r in records if r["part"] == part]
        if rows:
            symbol = "N" if key == "n_agents" else "K"
            paths.append(_curves_figure(rows, key, lambda v, c=symbol: f"{c} = {v}", f"MFPO on heterogeneous {env}: {title}",
                                        out_dir / f"mfpo_{env}_{name}.png"))
    return paths


def byzantine_figures(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Return against environment steps per agent with and without Byzantine agents, one panel per
    method (``byzantine.png``).

    :param records: the ``byzantine`` records
    :param out_dir: where the PNG goes
    """
    plt = pyplot()
    methods = [m for m in ("FedPG-BR", "FedAvg-PG") if any(r["method"] == m for r in records)] or ["FedPG-BR"]
    fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 3.8), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, method in zip(axes, methods, strict=True):
        rows = [r for r in records if r["method"] == method]
        _plot_curves(ax, rows, "step", "attack", lambda a: "no attack" if a == "none" else f"3 Byzantine: {a}")
        ax.set_title(method)
        ax.set_xlabel("environment steps per agent")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("evaluation return")
    axes[0].legend(fontsize=8)
    return [save(fig, out_dir / "byzantine.png")]


def _plot_curves(ax: Any, records: list[dict[str, Any]], key: str, group: str, label: Callable[[Any], str]) -> None:
    """Mean ± std over seeds of ``return`` against ``key`` for each value of ``group``."""
    values = []
    for r in records:
        if r[group] not in values:
            values.append(r[group])
    for v in values:
        rows = [r for r in records if r[group] == v]
        rounds = sorted({r["round"] for r in rows})
        xs, ms, ss = [], [], []
        for rnd in rounds:
            pts = [r for r in rows if r["round"] == rnd]
            ret = torch.tensor([p["return"] for p in pts], dtype=torch.float64)
            xs.append(sum(p[key] for p in pts) / len(pts))
            ms.append(float(ret.mean()))
            ss.append(float(ret.std(unbiased=False)))
        line = ax.plot(xs, ms, label=label(v))[0]
        ax.fill_between(xs, [m - s for m, s in zip(ms, ss)], [m + s for m, s in zip(ms, ss)], color=line.get_color(), alpha=0.2)


def _curves_figure(rows: list[dict[str, Any]], group: str, label: Callable[[Any], str], title: str, path: Path) -> Path:
    """Return against environment steps per agent (left) and communication rounds (right), one
    curve per value of ``group``; saved to ``path``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, xlabel in ((axes[0], "step", "environment steps per agent"), (axes[1], "round", "communication rounds")):
        _plot_curves(ax, rows, key, group, label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)
