"""The figures of ``fedrl reproduce``, apart from the experiments that compute their numbers.

One module per experiment module (:mod:`~fedrl_algos.reproduce.plots.tabular`,
:mod:`~fedrl_algos.reproduce.plots.partial`, :mod:`~fedrl_algos.reproduce.plots.neural`,
:mod:`~fedrl_algos.reproduce.plots.mfpo`), and :mod:`~fedrl_algos.reproduce.plots.curves`, the learning
curves of ``fedrl train`` and ``fedrl plot`` (:mod:`fedrl_algos.zoo`). Their functions take an experiment's results as plain data
(the records of ``results.json``, its settings, and the labels and paper values to draw), write PNG
files and return their paths; each experiment's ``plot`` hands its output to them. These are the only
modules of :mod:`fedrl_algos.reproduce` that import matplotlib, and they import it only when a figure
is drawn (it takes about half a second to import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are only written to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 120, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay ``fig`` out (``tight_layout``, within ``rect`` if given), write it to ``path`` and close it.

    :return: ``path``
    """
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
