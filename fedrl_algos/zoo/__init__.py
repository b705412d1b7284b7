"""``fedrl train`` and ``fedrl plot`` from Python: the rl-zoo of fedrl.

Train a federation over several seeds into one run directory, with checkpoints, SB3 logs
(``progress.csv``, TensorBoard), a learning-curve figure and a summary table; rerun the same call to
resume it; overlay several runs. ``docs/train.md`` is the reference::

    from fedrl_algos.zoo import plot_runs, train_runs

    train_runs({"algo": "mfpo", "env": "Pendulum-v1", "agent_kwargs": [{"g": 9.0}, {"g": 11.0}],
                "seeds": 3, "budget": 200_000, "device": "cpu", "out": "runs/mfpo"})
    plot_runs(["runs/mfpo", "runs/fedavg_pg"], out="comparison.png")

:mod:`~fedrl_algos.zoo.config` resolves and checks the settings, :mod:`~fedrl_algos.zoo.runner`
trains the seeds, :mod:`~fedrl_algos.zoo.results` reads the logs and writes figures and tables (the
figure itself is drawn by :mod:`fedrl_algos.reproduce.plots.curves`).
"""

from fedrl_algos.zoo.config import TrainConfig, TrainConfigError, load_config_file, merge_settings, resolve_config
from fedrl_algos.zoo.results import PlotResult, plot_runs, read_run, summary_rows, write_run_summary
from fedrl_algos.zoo.runner import SeedOutcome, TrainResult, build_model, train_runs

__all__ = [
    "PlotResult",
    "SeedOutcome",
    "TrainConfig",
    "TrainConfigError",
    "TrainResult",
    "build_model",
    "load_config_file",
    "merge_settings",
    "plot_runs",
    "read_run",
    "resolve_config",
    "summary_rows",
    "train_runs",
    "write_run_summary",
]
