"""Shared machinery of ``fedrl reproduce``: the experiment interface, outputs and reports.

An experiment is an :class:`Experiment` with a frozen config dataclass (:attr:`Experiment.config_class`:
the paper's configuration by default, its ``quick()`` the smoke version). ``run(config, seeds,
device, progress)`` returns flat records (one per method, setting, seed and round or budget) and a
comparison table against the paper, and never changes the experiment or any module state, so runs
with different configs may interleave. :func:`run_experiment` times a run and writes, under
``out/<name>/``:

* ``results.json`` — ``{"experiment", "settings", "wall_time_s", "cpu_time_s", "machine", "records": [...]}``,
  ``settings`` holding the config's fields, what the run derived from them, and ``seeds``, ``quick``, ``device``;
* the experiment's PNG figures;
* ``report.md`` — this run's numbers next to the paper's, with the settings, wall time and machine load.

A quick run (``quick=True``, ``fedrl reproduce --quick``, or a config equal to its own ``quick()``) is
a smoke test of the code, not a reproduction: its ``report.md`` opens with :func:`quick_run_label`
(``QUICK SMOKE RUN: 4 rounds, 2 seeds, not comparable with the paper``) and heads its column
"this run (quick smoke)"; ``results.json`` has ``settings["quick"]`` and its records are unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch

__all__ = [
    "Experiment",
    "ExperimentOutput",
    "TableRow",
    "run_experiment",
    "config_settings",
    "FederatedTrainingConfig",
    "write_report",
    "quick_run_label",
    "is_quick_config",
    "progress_bar",
    "machine_info",
    "WallTimeEstimate",
    "format_duration",
    "linear_estimate",
    "mean_std",
    "median",
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


@dataclass(frozen=True)
class FederatedTrainingConfig:
    """The training fields every Per-FedAvg-PG experiment has: K rounds of τ local steps, each from
    trajectory batches (the paper's Table 2; the tabular column by default)."""

    rounds: int = 80
    """K, communication rounds"""
    tau: int = 5
    """τ, local steps per round"""
    beta: float = 0.3
    """β, local (outer) step size"""
    m_in: int = 10
    """m_in, trajectories of the inner adaptation estimate"""
    m_out: int = 10
    """m_out, trajectories of the outer gradient estimate"""


@dataclass(frozen=True)
class WallTimeEstimate:
    """The expected wall time of a run, from wall times measured on this project's 2-core machine.

    :param parts: expected seconds of each phase, by phase name (``None``: no measured rate for it)
    :param basis: how the numbers were estimated (the measured runs and the scaling)
    """

    parts: dict[str, float | None]
    basis: str

    @property
    def seconds(self) -> float | None:
        """The expected total (``None`` when a phase has no measured rate)."""
        values = list(self.parts.values())
        return None if any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]

    def describe(self) -> str:
        """``≈ 1 h 4 min (MFPO 3 min, ...)`` with unknown phases named."""
        parts = ", ".join(f"{k} {'unknown' if v is None else format_duration(v)}" for k, v in self.parts.items())
        total = self.seconds
        known = sum(v for v in self.parts.values() if v is not None)
        if total is not None:
            head = f"≈ {format_duration(total)}"
        elif all(v is None for v in self.parts.values()):
            return "unknown: no measured rate on record for this configuration"
        else:
            head = f"unknown (the phases with a measured rate: ≈ {format_duration(known)})"
        return f"{head} ({parts})" if len(self.parts) > 1 else head


def linear_estimate(phase: str, measured_s: float, scale: dict[str, tuple[float, float]], source: str) -> WallTimeEstimate:
    """A run's wall time as a measured run's, scaled linearly in each size that differs.

    :param phase: name of the (single) phase
    :param measured_s: wall time of the measured run, in seconds
    :param scale: by size name, ``(this run's value, the measured run's value)``, e.g. ``{"seeds": (5, 10)}``
    :param source: where the measured run is documented
    """
    seconds = measured_s
    for now, then in scale.values():
        seconds *= now / then
    sizes = ", ".join(f"{name} {then:g}" for name, (_, then) in scale.items())
    basis = (f"the wall time measured on a 2-core machine ({measured_s:.0f} s at {sizes}; {source}), "
             f"scaled linearly in {', '.join(scale)}")
    return WallTimeEstimate({phase: seconds}, basis)


def format_duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``1 h 4 min``, ``2.5 days``: a wall time as a person reads it."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{seconds / 86400:.1f} days"


def mean_std(values: Sequence[float] | torch.Tensor) -> tuple[float, float] | tuple[None, None]:
    """Mean and population standard deviation (ddof 0: ``0.0`` for one value) of ``values``, a
    sequence of numbers or a tensor of any shape, computed in float64: the "mean ± spread over
    seeds" of the reports' tables.

    :return: ``(mean, std)``, or ``(None, None)`` for no values (a table cell left empty)

    >>> mean_std([1.0, 2.0, 3.0, 4.0])
    (2.5, 1.118033988749895)
    >>> mean_std(torch.tensor([0.5])), mean_std([])
    ((0.5, 0.0), (None, None))
    """
    t = torch.as_tensor(values if isinstance(values, torch.Tensor) else list(values), dtype=torch.float64)
    if t.numel() == 0:
        return None, None
    return float(t.mean()), float(t.std(unbiased=False)) if t.numel() > 1 else 0.0


def median(values: Sequence[float]) -> float:
    """The median of ``values`` in float64 (of an even count, the mean of the two middle values).

    >>> median([3.0, 1.0, 2.0]), median([4.0, 1.0, 2.0, 3.0])
    (2.0, 2.5)
    """
    t = torch.tensor(list(values), dtype=torch.float64).sort().values
    k = t.numel()
    return float((t[(k - 1) // 2] + t[k // 2]) / 2)


#: an experiment's config type
ConfigT = TypeVar("ConfigT")


class Experiment(ABC, Generic[ConfigT]):
    """A reproducible experiment of one of the papers.

    Subclasses set the class attributes below and implement :meth:`run` and :meth:`plot`. The
    object holds no state: everything a run depends on is its config, a frozen dataclass of type
    :attr:`config_class` whose defaults are the paper's configuration and whose ``quick()``
    returns the seconds-long smoke version of that config.
    """

    #: name of ``fedrl reproduce <name>``
    name: ClassVar[str]
    #: one line shown by ``fedrl reproduce --help``
    description: ClassVar[str]
    #: figure/section of the paper it reproduces
    paper_reference: ClassVar[str]
    #: the frozen config dataclass (``config_class()``: the paper's configuration)
    config_class: ClassVar[type]
    #: whether ``fedrl reproduce all`` runs it (every experiment of this package does: README promises
    #: "every experiment", and ``fedrl reproduce all`` prints the expected wall time first)
    include_in_all: ClassVar[bool] = True

    @classmethod
    def config_fields(cls) -> tuple[str, ...]:
        """Names of the config's fields: what :meth:`config` (and a command-line flag) may set."""
        return tuple(f.name for f in dataclasses.fields(cls.config_class))

    @classmethod
    def config(cls, quick: bool = False, **changes: Any) -> ConfigT:
        """The paper's config with ``changes`` applied (``dataclasses.replace``), then, with ``quick``,
        its smoke version (``quick()`` keeps the fields that do not set the run's size, e.g. ``env``).

        :param quick: return the config's ``quick()`` variant
        :param changes: field values, e.g. ``budget=2e5``
        :raises ValueError: for a name that is not a field of :attr:`config_class`
        """
        unknown = sorted(set(changes) - set(cls.config_fields()))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} of {cls.config_class.__name__}; the options are {sorted(cls.config_fields())}")
        config = dataclasses.replace(cls.config_class(), **changes)
        return config.quick() if quick else config

    def estimate_wall_time(self, config: ConfigT, seeds: int) -> WallTimeEstimate | None:
        """The expected wall time of ``run(config, seeds, "cpu", ...)`` on a 2-core CPU machine, from
        this experiment's measured wall times (``None``: none on record). ``fedrl reproduce`` prints it
        before a run starts.

        :param config: an instance of :attr:`config_class`
        :param seeds: the number of seeds
        """
        return None

    @abstractmethod
    def run(self, config: ConfigT, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        """Run the experiment with ``config`` on seeds ``0 .. seeds-1``.

        :param config: an instance of :attr:`config_class`
        :param seeds: the number of seeds
        :param device: torch device of the whole program
        :param progress: show a progress bar
        """

    @abstractmethod
    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        """Write the experiment's PNG figures into ``out_dir`` and return their paths (drawn by the
        experiment's module of :mod:`fedrl_algos.reproduce.plots` from ``output``)."""


def progress_bar(total: int, enabled: bool, desc: str, unit: str = "it") -> Any:
    """A tqdm progress bar on stderr (``None`` when disabled); call ``update``/``close`` on it."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # stderr (tqdm's default, said explicitly): stdout carries the results that scripts parse
    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, file=sys.stderr)


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


def quick_run_label(settings: dict[str, Any], seeds: int | None = None) -> str:
    """The line that marks a quick run's report and printed summary, e.g.
    ``QUICK SMOKE RUN: 4 rounds, 2 seeds, not comparable with the paper``.

    :param settings: the run's settings (its ``rounds``, where the config has them, are named)
    :param seeds: the number of seeds, if known
    """
    rounds = settings.get("rounds")
    parts = [f"{rounds} round{'s' if rounds != 1 else ''}"] if isinstance(rounds, int) and not isinstance(rounds, bool) else []
    if seeds is not None:
        parts.append(f"{seeds} seed{'s' if seeds != 1 else ''}")
    return "QUICK SMOKE RUN" + (f": {', '.join(parts)}" if parts else "") + ", not comparable with the paper"


def is_quick_config(config: Any) -> bool:
    """Whether ``config`` is a smoke config: equal to its own ``quick()`` (which every ``quick()`` of
    :mod:`fedrl_algos.reproduce` returns), as ``Experiment.config(quick=True)`` gives it."""
    quick = getattr(config, "quick", None)
    if not callable(quick):
        return False
    try:
        return bool(config == quick())
    except (TypeError, ValueError, RuntimeError):  # fields that do not compare (tensors): not recognisable
        return False


def write_report(
    experiment: Experiment,
    output: ExperimentOutput,
    wall_time: float,
    figures: list[Path],
    out_dir: Path,
    cpu_time: float | None = None,
    machine: dict[str, Any] | None = None,
    *,
    quick: bool = False,
    seeds: int | None = None,
) -> Path:
    """Write ``report.md`` for one experiment run and return its path.

    :param quick: a smoke run: the report opens with :func:`quick_run_label` and its column of this
        run's numbers says "quick smoke", so that they are not read as a reproduction of the paper's
    :param seeds: the number of seeds (named in the quick label)
    """
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
    ]
    if quick:
        lines += [
            f"> **{quick_run_label(output.settings, seeds)}.** This is the configuration's smoke version (`quick()`, "
            "`fedrl reproduce --quick`: a few rounds, few seeds): it checks that the code runs end to end, and its numbers "
            "are not a reproduction of the paper's. Run without `--quick` for numbers to compare.",
            "",
        ]
    lines += [
        f"| quantity | paper | {'this run (quick smoke)' if quick else 'this run'} | ± (seeds) | note |",
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


def config_settings(config: Any) -> dict[str, Any]:
    """A config's fields as JSON values (``dataclasses.asdict``; what JSON cannot hold, e.g. a
    callable schedule, as its ``repr``)."""

    def jsonable(value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [jsonable(v) for v in value]
        return repr(value)

    return jsonable(dataclasses.asdict(config))


def run_experiment(
    experiment: Experiment,
    out: Path,
    seeds: int,
    quick: bool = False,
    device: str = "cpu",
    progress: bool = False,
    config: Any = None,
) -> dict[str, Any]:
    """Run, time and write one experiment; returns the content of its ``results.json``.

    :param experiment: the experiment
    :param out: output directory (the experiment writes into ``out/<name>/``)
    :param seeds: number of seeds
    :param quick: run the quick variant (``config.quick()``) of the config
    :param device: torch device
    :param progress: show progress bars
    :param config: an instance of the experiment's :attr:`~Experiment.config_class` (default: the
        paper's configuration)

    A quick run's report is labelled a smoke run (:func:`quick_run_label`): with ``quick``, or with a
    ``config`` that is already a ``quick()`` one (:func:`is_quick_config`).
    """
    if config is None:
        config = experiment.config_class()
    elif not isinstance(config, experiment.config_class):
        raise TypeError(f"{experiment.name} takes a {experiment.config_class.__name__}, got {type(config).__name__}")
    if quick:
        config = config.quick()
    out_dir = Path(out) / experiment.name
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    start, cpu_start = time.perf_counter(), time.process_time()
    output = experiment.run(config, seeds=seeds, device=device, progress=progress)
    wall_time, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    # The config's fields first; what the run reports (derived values, wall times) after them and
    # where a key is both, as the run wrote it (e.g. a budget it resolved from another field).
    output = dataclasses.replace(output, settings={**config_settings(config), **output.settings})
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
    write_report(experiment, output, wall_time, figures, out_dir, cpu_time=cpu_time, machine=machine,
                 quick=quick or is_quick_config(config), seeds=seeds)
    return payload
