"""Learning curves of ``fedrl train`` and ``fedrl plot`` (:mod:`fedrl_algos.zoo`): evaluation return
against environment steps (or rounds), the mean over seeds with a band of ± one standard error.

The curves come in as plain data (:class:`Curve`); :mod:`fedrl_algos.zoo.results` reads them from the
runs' ``progress.csv`` files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrl_algos.reproduce.plots import pyplot, save

__all__ = ["Curve", "learning_curves_figure"]


@dataclass(frozen=True)
class Curve:
    """One line of a learning-curve figure.

    :param label: the legend entry (``None``: none)
    :param x: environment steps (or rounds)
    :param mean: the mean over seeds at each ``x``
    :param se: its standard error (``nan`` where fewer than two seeds; ``None``: no band)
    :param color: the index of the line's colour (one per run: its adapted and per-agent lines share it)
    :param style: ``"main"`` (solid, with the band), ``"adapted"`` (dashed, with the band) or ``"agent"`` (thin)
    """

    label: str | None
    x: Sequence[float]
    mean: Sequence[float]
    se: Sequence[float] | None
    color: int
    style: str = "main"


def learning_curves_figure(curves: Sequence[Curve], path: Path, title: str, x_label: str, y_label: str) -> Path:
    """Draw ``curves`` on one axes (mean lines, ± s.e. bands) and write the PNG to ``path``.

    :return: ``path``
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for curve in curves:
        color = palette[curve.color % len(palette)]
        x = np.asarray(curve.x, dtype=float)
        mean = np.asarray(curve.mean, dtype=float)
        if curve.style == "agent":
            ax.plot(x, mean, color=color, lw=0.8, alpha=0.55, ls=":", label=curve.label)
            continue
        ax.plot(x, mean, color=color, lw=1.8, ls="--" if curve.style == "adapted" else "-", marker="." if len(x) < 30 else None,
                label=curve.label)
        if curve.se is not None:
            se = np.asarray(curve.se, dtype=float)
            ok = np.isfinite(se)
            if ok.any():
                ax.fill_between(x[ok], (mean - se)[ok], (mean + se)[ok], color=color, alpha=0.18, lw=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    if any(c.label for c in curves):
        ax.legend(fontsize=8, loc="best")
    return save(fig, Path(path))
