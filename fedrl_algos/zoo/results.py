"""The results of ``fedrl train`` runs: learning curves over seeds, final returns, figures and tables.

A run directory holds ``config.json`` and one ``seed_<k>/progress.csv`` per seed (SB3's CSV logger,
one row per log: ``time/total_timesteps``, ``train/round``, the ``eval/`` metrics, ...).
:func:`read_run` reads it; :func:`curve` averages a column over seeds (mean ± standard error);
:func:`summary_rows` gives the final evaluation return per agent; :func:`write_run_summary`
(``fedrl train``) and :func:`plot_runs` (``fedrl plot``) write the figure and the tables.

The curve is a column of ``progress.csv`` chosen by name (``key``, default ``eval/return``, the
deployed policy's undiscounted return averaged over agents). Runs of algorithms that do not log that
name yet log an older one (:data:`LEGACY_KEYS`: FedAvg-PG's and Per-FedAvg-PG's
``eval/pre_adaptation_return`` and ``eval/post_adaptation_return``, IndependentPG's ``eval/mc_return``),
which stands in for it: the column read is named in the legend and the tables, and those older
columns are **discounted** (γ) returns, not comparable with an undiscounted ``eval/return``
(:data:`STAND_IN_NOTE`).
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedrl_algos.zoo.config import TrainConfigError

__all__ = [
    "DEFAULT_KEY",
    "LEGACY_KEYS",
    "STAND_IN_NOTE",
    "PlotResult",
    "RunLogs",
    "adapted_key",
    "curve",
    "format_table",
    "plot_runs",
    "read_progress",
    "read_run",
    "resolve_key",
    "summary_rows",
    "write_run_summary",
]

DEFAULT_KEY = "eval/return"
STEP_KEY = "time/total_timesteps"
ROUND_KEY = "train/round"
WALL_KEY = "time/wall_seconds"
#: names an older evaluation logged for a curve: the server policy's Monte Carlo return of FedAvg-PG
#: and Per-FedAvg-PG (``pre_adaptation_return``), IndependentPG's agents' own (``mc_return``), the
#: adapted policies' (``post_adaptation_return``)
LEGACY_KEYS: dict[str, tuple[str, ...]] = {
    "eval/return": ("eval/pre_adaptation_return", "eval/mc_return"),
    "eval/adapted_return": ("eval/post_adaptation_return",),
}
#: what the tables say under a curve read from a :data:`LEGACY_KEYS` column
STAND_IN_NOTE = ("a column not named as asked for is an older evaluation's name standing in for it: a γ-discounted "
                 "Monte Carlo return, not comparable with an undiscounted eval/return")
_AGENT_COLUMN = re.compile(r"^eval/agent_(\d+)/(.+)$")


def read_progress(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """The columns of an SB3 ``progress.csv`` as float arrays (``nan`` where a row has no value)."""
    with pathlib.Path(path).open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        return {}
    header, body = rows[0], rows[1:]
    columns: dict[str, np.ndarray] = {}
    for j, name in enumerate(header):
        values = []
        for row in body:
            text = row[j] if j < len(row) else ""
            try:
                values.append(float(text) if text != "" else math.nan)
            except ValueError:
                values.append(math.nan)
        columns[name] = np.asarray(values, dtype=float)
    return columns


@dataclass
class RunLogs:
    """One run directory's logs.

    :param path: the run directory
    :param label: its name in legends and tables (the directory's name unless given)
    :param settings: ``config.json``'s settings (empty when the directory has none)
    :param seeds: the seeds with a ``progress.csv``, in the run's order
    :param logs: seed → its ``progress.csv`` columns
    :param states: seed → its final ``state.json`` (steps, rounds, wall seconds), when written
    """

    path: pathlib.Path
    label: str
    settings: dict[str, Any]
    seeds: list[int]
    logs: dict[int, dict[str, np.ndarray]]
    states: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def algo(self) -> str:
        return str(self.settings.get("algo", "?"))

    @property
    def env(self) -> str:
        return str(self.settings.get("env", "?"))

    def columns(self) -> list[str]:
        """Every logged column, in first-seen order."""
        seen: dict[str, None] = {}
        for log in self.logs.values():
            seen.update(dict.fromkeys(log))
        return list(seen)


def read_run(run_dir: str | pathlib.Path, label: str | None = None) -> RunLogs:
    """Read a ``fedrl train`` run directory: its ``config.json`` and the ``seed_<k>/progress.csv`` of the seeds it lists.

    :raise TrainConfigError: when the directory holds no ``progress.csv``
    """
    path = pathlib.Path(run_dir)
    settings: dict[str, Any] = {}
    if (path / "config.json").is_file():
        settings = json.loads((path / "config.json").read_text(encoding="utf-8")).get("settings", {})
    order = [int(s) for s in settings.get("seeds", [])]
    found = {int(p.parent.name.removeprefix("seed_")): p for p in path.glob("seed_*/progress.csv")
             if p.parent.name.removeprefix("seed_").isdigit()}
    # the run's seeds (a rerun with fewer seeds leaves the others' folders, which are not its results);
    # every seed folder of a directory without config.json
    seeds = [s for s in order if s in found] if order else sorted(found)
    if not seeds:
        raise TrainConfigError(f"{path}: not a fedrl train run directory (no seed_<k>/progress.csv in it)")
    logs = {s: read_progress(found[s]) for s in seeds}
    states = {}
    for s in seeds:
        state = found[s].parent / "state.json"
        if state.is_file():
            states[s] = json.loads(state.read_text(encoding="utf-8"))
    return RunLogs(path, label or path.resolve().name, settings, seeds, logs, states)


def resolve_key(run: RunLogs, key: str) -> str | None:
    """The column that holds ``key``'s curve in ``run``: ``key`` itself, else its older name
    (:data:`LEGACY_KEYS`), else ``None``."""
    columns = set(run.columns())
    for name in (key, *LEGACY_KEYS.get(key, ())):
        if name in columns and any(np.isfinite(log.get(name, np.array([]))).any() for log in run.logs.values()):
            return name
    return None


def adapted_key(key: str) -> str | None:
    """The adapted policies' counterpart of ``key`` (``eval/return`` → ``eval/adapted_return``), if any."""
    prefix, _, name = key.rpartition("/")
    if prefix != "eval" or name.startswith("adapted_") or name.startswith("exact_"):
        return None
    return f"eval/adapted_{name}"


def agent_columns(run: RunLogs, column: str) -> dict[int, str]:
    """Agent index → the per-agent column of ``column`` (``eval/return`` → ``eval/agent_<i>/return``)."""
    prefix, _, name = column.rpartition("/")
    if prefix != "eval":
        return {}
    found = {}
    for col in run.columns():
        match = _AGENT_COLUMN.match(col)
        if match and match.group(2) == name:
            found[int(match.group(1))] = col
    return dict(sorted(found.items()))


def _x_column(x: str) -> str:
    if x not in ("steps", "rounds"):
        raise TrainConfigError(f"--x: must be steps or rounds, got {x!r}")
    return STEP_KEY if x == "steps" else ROUND_KEY


def curve(run: RunLogs, column: str, x: str = "steps") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``column`` averaged over the run's seeds at each logged step (or round).

    :return: ``x``, the mean over seeds, its standard error (sample standard deviation / √n; ``nan``
        where fewer than two seeds logged that point) and ``n``, the seeds at each point
    """
    x_col = _x_column(x)
    by_x: dict[float, list[float]] = {}
    for log in run.logs.values():
        if column not in log or x_col not in log:
            continue
        for xv, yv in zip(log[x_col], log[column], strict=True):
            if np.isfinite(xv) and np.isfinite(yv):
                by_x.setdefault(float(xv), []).append(float(yv))
    xs = np.asarray(sorted(by_x), dtype=float)
    mean = np.asarray([np.mean(by_x[v]) for v in xs], dtype=float)
    se = np.asarray([np.std(by_x[v], ddof=1) / math.sqrt(len(by_x[v])) if len(by_x[v]) > 1 else math.nan for v in xs], dtype=float)
    n = np.asarray([len(by_x[v]) for v in xs], dtype=int)
    return xs, mean, se, n


def _final(log: dict[str, np.ndarray], column: str) -> tuple[float, float, float] | None:
    """The last logged value of ``column`` with its step and round."""
    if column not in log:
        return None
    ok = np.flatnonzero(np.isfinite(log[column]))
    if not len(ok):
        return None
    i = ok[-1]
    steps = log.get(STEP_KEY, np.full_like(log[column], math.nan))[i]
    rounds = log.get(ROUND_KEY, np.full_like(log[column], math.nan))[i]
    return float(log[column][i]), float(steps), float(rounds)


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    if not len(arr):
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else math.nan


def _span(values: Sequence[float]) -> str:
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return "—"
    low, high = int(min(finite)), int(max(finite))
    return str(low) if low == high else f"{low}–{high}"


def summary_rows(run: RunLogs, key: str = DEFAULT_KEY) -> list[dict[str, Any]]:
    """The final evaluation return of ``run``, mean ± standard error over seeds: one row for the
    mean over agents and one per agent (where per-agent columns were logged), for ``key`` and, when
    logged, its adapted counterpart (:func:`adapted_key`).

    Each row: ``run``, ``algo``, ``env``, ``curve`` (the column read), ``agent`` (``"mean"`` or the
    index), ``final_mean``, ``final_se`` (``nan`` for one seed), ``seeds``, ``env_steps`` and
    ``rounds`` (of the final values; ``a–b`` when seeds differ), ``wall_seconds`` (mean per seed),
    ``stand_in`` (the curve is an older column standing in for the one asked for, :data:`LEGACY_KEYS`).
    """
    rows = []
    walls = [float(run.states[s]["wall_seconds"]) for s in run.seeds if s in run.states and "wall_seconds" in run.states[s]]
    if not walls:
        walls = [float(np.nanmax(log[WALL_KEY])) for log in run.logs.values() if WALL_KEY in log and np.isfinite(log[WALL_KEY]).any()]
    wall = float(np.mean(walls)) if walls else math.nan
    keys = [key] + ([adapted_key(key)] if adapted_key(key) else [])
    for wanted in keys:
        column = resolve_key(run, wanted)
        if column is None:
            continue
        targets: list[tuple[str, str]] = [("mean", column)]
        targets += [(str(i), col) for i, col in agent_columns(run, column).items()]
        for agent, col in targets:
            finals = [f for f in (_final(run.logs[s], col) for s in run.seeds) if f is not None]
            if not finals:
                continue
            mean, se = _mean_se([f[0] for f in finals])
            rows.append({
                "run": run.label, "algo": run.algo, "env": run.env, "curve": col, "agent": agent, "stand_in": column != wanted,
                "final_mean": mean, "final_se": se, "seeds": len(finals),
                "env_steps": _span([f[1] for f in finals]), "rounds": _span([f[2] for f in finals]), "wall_seconds": wall,
            })
    return rows


def _number(value: float) -> str:
    if not np.isfinite(value):
        return "—"
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of :func:`summary_rows` rows (with :data:`STAND_IN_NOTE` under it where a row's
    curve is an older column standing in for the one asked for)."""
    header = "| run | algo | curve | agent | final return (mean ± s.e.) | seeds | env steps | rounds | wall time per seed |"
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        value = _number(r["final_mean"]) + ("" if not np.isfinite(r["final_se"]) else f" ± {_number(r['final_se'])}")
        wall = "—" if not np.isfinite(r["wall_seconds"]) else f"{r['wall_seconds']:.1f} s"
        lines.append(f"| {r['run']} | {r['algo']} | {r['curve']} | {r['agent']} | {value} | {r['seeds']} | {r['env_steps']} | "
                     f"{r['rounds']} | {wall} |")
    if any(r.get("stand_in") for r in rows):
        lines += ["", f"Note: {STAND_IN_NOTE}."]
    return "\n".join(lines)


def _write_csv(path: pathlib.Path, rows: Sequence[dict[str, Any]]) -> None:
    fields = ["run", "algo", "env", "curve", "agent", "final_mean", "final_se", "seeds", "env_steps", "rounds", "wall_seconds",
              "stand_in"]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if isinstance(r[k], float) and not np.isfinite(r[k]) else r[k]) for k in fields})


def _curves(runs: Sequence[RunLogs], key: str, per_agent: bool, x: str, with_run_label: bool) -> list[Any]:
    from fedrl_algos.reproduce.plots.curves import Curve

    curves = []
    for color, run in enumerate(runs):
        for wanted, style in ((key, "main"), (adapted_key(key), "adapted")):
            column = None if wanted is None else resolve_key(run, wanted)
            if column is None:
                continue
            xs, mean, se, n = curve(run, column, x)
            seeds = int(max(n, default=0))
            discounted = ", γ-discounted" if column != wanted else ""
            name = f"{column} (mean of {seeds} seed{'s' if seeds != 1 else ''}{discounted})"
            curves.append(Curve(f"{run.label}: {name}" if with_run_label else name, xs, mean, se, color, style))
            if per_agent and style == "main":
                for i, col in agent_columns(run, column).items():
                    ax, am, _, _ = curve(run, col, x)
                    curves.append(Curve(f"{run.label} agent {i}" if with_run_label else f"agent {i}", ax, am, None, color, "agent"))
    return curves


def _missing_key(runs: Sequence[RunLogs], key: str) -> TrainConfigError:
    available = sorted({c for r in runs for c in r.columns() if c.startswith("eval/")})
    hint = (f"the eval/ columns logged: {available}" if available else
            "no eval/ columns were logged (an evaluation needs --eval-trajectories > 0)")
    return TrainConfigError(f"--key: no run logged {key!r}" + (f" (nor {list(LEGACY_KEYS[key])})" if key in LEGACY_KEYS else "")
                            + f"; {hint}")


@dataclass(frozen=True)
class PlotResult:
    """What :func:`write_run_summary` and :func:`plot_runs` wrote: the figure (``None`` when no run
    logged the curve), the summary files (``None`` for :func:`plot_runs`), the rows and their table."""

    figure: pathlib.Path | None
    summary_md: pathlib.Path | None
    summary_csv: pathlib.Path | None
    rows: list[dict[str, Any]]
    table: str


def write_run_summary(run_dir: str | pathlib.Path, key: str = DEFAULT_KEY, per_agent: bool = False) -> PlotResult:
    """Write a run directory's ``learning_curve.png`` (``key`` and its adapted counterpart against
    environment steps, mean ± s.e. over seeds; per-agent lines with ``per_agent``), ``summary.md`` and
    ``summary.csv`` (:func:`summary_rows`).

    Without any evaluation column (``eval_trajectories=0`` on a Gymnasium env) the figure is skipped
    and the summary says so.
    """
    from fedrl_algos.reproduce.plots.curves import learning_curves_figure

    run = read_run(run_dir)
    rows = summary_rows(run, key)
    figure = None
    curves = _curves([run], key, per_agent, "steps", with_run_label=False)
    if curves:
        seeds = len(run.seeds)
        figure = learning_curves_figure(curves, run.path / "learning_curve.png",
                                        f"{run.algo} on {run.env}: mean ± s.e. over {seeds} seed{'s' if seeds != 1 else ''}",
                                        "environment steps (summed over agents)", "evaluation return")
    table = format_table(rows) if rows else f"(no {key} logged: nothing to summarize; --eval-trajectories > 0 evaluates)"
    md = run.path / "summary.md"
    n_agents = len(run.settings.get("agent_kwargs") or []) or run.settings.get("n_agents") or "the family's"
    md.write_text(
        f"# {run.algo} on {run.env}\n\n"
        f"{n_agents} agents, seeds {', '.join(map(str, run.seeds))}. Final evaluation return: mean ± standard error over "
        f"seeds of each seed's last logged `{key}` (the undiscounted return of the deployed policy, "
        f"{run.settings.get('eval_trajectories', '?')} episodes per agent; rows `agent i` for each agent's own "
        "environment; the adapted rows after the algorithm's adaptation step). Env steps are summed over agents; wall "
        f"time is training and evaluation per seed.\n\n{table}\n", encoding="utf-8")
    csv_path = run.path / "summary.csv"
    _write_csv(csv_path, rows)
    return PlotResult(figure, md, csv_path, rows, table)


def plot_runs(
    run_dirs: Sequence[str | pathlib.Path],
    out: str | pathlib.Path | None = None,
    key: str = DEFAULT_KEY,
    per_agent: bool = False,
    x: str = "steps",
    labels: Sequence[str] | None = None,
) -> PlotResult:
    """Draw one run's learning curve, or overlay several runs (e.g. algorithms) in one figure, and
    tabulate their final returns.

    :param run_dirs: ``fedrl train`` run directories
    :param out: the PNG (default: ``RUN_DIR/learning_curve.png`` for one run, ``learning_curves.png``
        in the current directory for several)
    :param key: the ``progress.csv`` column to draw (its adapted counterpart is drawn too when logged)
    :param per_agent: also each agent's line (mean over seeds; where per-agent columns were logged)
    :param x: ``"steps"`` (environment steps summed over agents) or ``"rounds"``
    :param labels: legend labels, one per run (default: the directories' names)
    :raise TrainConfigError: for a directory that is not a run, or a key no run logged
    """
    from fedrl_algos.reproduce.plots.curves import learning_curves_figure

    if not run_dirs:
        raise TrainConfigError("give at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise TrainConfigError(f"--labels: give one label per run directory ({len(run_dirs)}), got {len(labels)}")
    runs = [read_run(d, None if labels is None else labels[i]) for i, d in enumerate(run_dirs)]
    names = [r.label for r in runs]
    if labels is None and len(set(names)) < len(names):  # two directories of one name: tell them apart by algorithm
        for r in runs:
            r.label = f"{r.label} ({r.algo})"
    _x_column(x)
    curves = _curves(runs, key, per_agent, x, with_run_label=len(runs) > 1)
    if not curves:
        raise _missing_key(runs, key)
    if out is None:
        out = runs[0].path / "learning_curve.png" if len(runs) == 1 else pathlib.Path("learning_curves.png")
    envs = sorted({r.env for r in runs})
    title = (f"{runs[0].algo} on {runs[0].env}" if len(runs) == 1 else f"{', '.join(envs)}: {len(runs)} runs") + ": mean ± s.e. over seeds"
    figure = learning_curves_figure(curves, pathlib.Path(out), title,
                                    "environment steps (summed over agents)" if x == "steps" else "communication rounds",
                                    "evaluation return")
    rows = [row for r in runs for row in summary_rows(r, key)]
    return PlotResult(figure, None, None, rows, format_table(rows))
