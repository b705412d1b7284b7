"""Shared machinery of ``fedrl reproduce``: the experiment registry, outputs and reports.

An experiment is a :class:`Experiment` object registered under its name. ``run`` returns flat
records (one per method, setting, seed and round or budget) and a comparison table against the
paper; :func:`run_experiment` times it and writes, under ``out/<name>/``:

* ``results.json`` — ``{"experiment", "settings", "wall_time_s", "cpu_time_s", "machine", "records": [...]}``;
* the experiment's PNG figures;
* ``report.md`` — this run's numbers next to the paper's, with the settings, wall time and machine load.
"""

from __future__ import annotations

import json
import os
import platform
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Experiment",
    "ExperimentOutput",
    "TableRow",
    "EXPERIMENTS",
    "register",
    "run_experiment",
    "write_report",
    "progress_bar",
    "machine_info",
]


@dataclass
class TableRow:
    """One line of a report's comparison table.

    :param quantity: what is compared (e.g. ``"F, exact variant, K=80"``)
    :param paper: the paper's number (``None`` where the paper gives none)
    :param ours: this run's number (mean over seeds unless ``note`` says otherwise)
    :param spread: seed-to-seed standard deviation (or another spread named in ``note``)
    :param note: anything a reader needs to interpret the row
    """

    quantity: str
    paper: float | str | None
    ours: float | str | None
    spread: float | None = None
    note: str = ""


@dataclass
class ExperimentOutput:
    """What an experiment's ``run`` returns."""

    records: list[dict[str, Any]]
    table: list[TableRow]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)


class Experiment(ABC):
    """A reproducible experiment of one of the papers."""

    #: registry name (``fedrl reproduce <name>``)
    name: str
    #: one line shown by ``fedrl reproduce --help``
    description: str
    #: figure/section of the paper it reproduces
    paper_reference: str

    @abstractmethod
    def run(self, seeds: int, quick: bool, device: str, progress: bool) -> ExperimentOutput:
        """Run the experiment with ``seeds`` seeds (``quick``: a seconds-long smoke version)."""

    @abstractmethod
    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        """Write the experiment's PNG figures into ``out_dir`` and return their paths."""


#: every registered experiment by name, in registration order
EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add an experiment to :data:`EXPERIMENTS` (names must be unique)."""
    if experiment.name in EXPERIMENTS:
        raise ValueError(f"an experiment named {experiment.name!r} is already registered")
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def progress_bar(total: int, enabled: bool, desc: str, unit: str = "it") -> Any:
    """A tqdm progress bar on stderr (``None`` when disabled); call ``update``/``close`` on it."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)


def machine_info() -> dict[str, Any]:
    """What a wall time depends on: CPU, cores, torch threads and the load average when measured."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # not available on every platform
        load = None
    return {
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_1_5_15min": load,
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def write_report(
    experiment: Experiment,
    output: ExperimentOutput,
    wall_time: float,
    figures: list[Path],
    out_dir: Path,
    cpu_time: float | None = None,
    machine: dict[str, Any] | None = None,
) -> Path:
    """Write ``report.md`` for one experiment run and return its path."""
    machine = machine or machine_info()
    cpu = f" (CPU time {cpu_time:.1f} s)" if cpu_time is not None else ""
    load = machine.get("load_average_1_5_15min")
    load_txt = f", load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min) when it started" if load else ""
    lines = [
        f"# `{experiment.name}` — {experiment.description}",
        "",
        f"Reproduces {experiment.paper_reference}. Wall time: {wall_time:.1f} s{cpu} on {machine.get('machine')} "
        f"with {machine.get('cpu_count')} cores{load_txt}; torch {machine.get('torch')}.",
        "",
        "| quantity | paper | this run | ± (seeds) | note |",
        "|---|---|---|---|---|",
    ]
    for row in output.table:
        lines.append(f"| {row.quantity} | {_fmt(row.paper)} | {_fmt(row.ours)} | {_fmt(row.spread)} | {row.note} |")
    lines += ["", "## Settings", "", "```json", json.dumps(output.settings, indent=2, sort_keys=True, default=str), "```"]
    if output.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in output.notes]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_experiment(experiment: Experiment, out: Path, seeds: int, quick: bool, device: str, progress: bool) -> dict[str, Any]:
    """Run, time and write one experiment; returns the content of its ``results.json``."""
    out_dir = Path(out) / experiment.name
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    start, cpu_start = time.perf_counter(), time.process_time()
    output = experiment.run(seeds=seeds, quick=quick, device=device, progress=progress)
    wall_time, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    figures = experiment.plot(output, out_dir)
    payload = {
        "experiment": experiment.name,
        "settings": {**output.settings, "seeds": seeds, "quick": quick, "device": device},
        "wall_time_s": wall_time,
        "cpu_time_s": cpu_time,
        "machine": machine,
        "records": output.records,
    }
    (out_dir / "results.json").write_text(json.dumps(payload, indent=1, default=float))
    write_report(experiment, output, wall_time, figures, out_dir, cpu_time=cpu_time, machine=machine)
    return payload
