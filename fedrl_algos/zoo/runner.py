"""Train every seed of a ``fedrl train`` run: build or resume the model, log, checkpoint, save.

:func:`train_runs` is ``fedrl train`` from Python. For every seed, one after the other, it builds the
model (or loads the newest checkpoint of an earlier, interrupted or shorter run in the same
directory), attaches SB3's logger (``progress.csv`` always, TensorBoard with ``tensorboard=True``),
runs ``learn`` with a progress bar, evaluates and logs every ``log_interval`` rounds, checkpoints
every ``checkpoint_every`` rounds, and saves the final model; then it writes the learning-curve
figure and the summary tables (:mod:`fedrl_algos.zoo.results`).
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import pathlib
import platform
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from fedrl_algos.zoo.config import TrainConfig, TrainConfigError, resolve_config

__all__ = [
    "CHECKPOINT_DIR",
    "MODEL_FILE",
    "SeedOutcome",
    "TrainResult",
    "build_model",
    "newest_state",
    "seed_dir_name",
    "train_runs",
]

#: the files of a seed's directory
MODEL_FILE = "model.zip"
STATE_FILE = "state.json"
CHECKPOINT_DIR = "checkpoints"
PROGRESS_FILE = "progress.csv"
CONFIG_FILE = "config.json"
#: the logged columns of the step and round counters
STEP_KEY = "time/total_timesteps"
ROUND_KEY = "train/round"
WALL_KEY = "time/wall_seconds"

_CHECKPOINT_NAME = re.compile(r"^model_(\d+)_steps\.zip$")
#: ``learn(log_interval=...)`` that never dumps: the run's own callback logs at absolute rounds
_NEVER = 2**62


def seed_dir_name(seed: int) -> str:
    """The folder of one seed's run inside the run directory: ``seed_<seed>``."""
    return f"seed_{seed}"


def _algorithm_class(config: TrainConfig) -> type:
    from fedrl_algos import ALGORITHMS

    return ALGORITHMS[config.algo]


def build_model(config: TrainConfig, seed: int) -> Any:
    """A new, untrained model of ``config`` with seed ``seed``.

    :raise TrainConfigError: when the algorithm refuses the settings (its message, naming the flags)
    """
    from gymnasium import error as gym_error

    cls = _algorithm_class(config)
    agents = {"agent_kwargs": config.agent_kwargs, "n_agents": config.n_agents}
    try:
        if config.algo == "fedavg_sb3":
            import stable_baselines3

            kwargs = dict(config.algo_kwargs)
            algorithm_class = getattr(stable_baselines3, kwargs.pop("algorithm_class"))
            if config.policy_kwargs is not None:
                kwargs["algorithm_kwargs"] = {**kwargs.get("algorithm_kwargs", {}), "policy_kwargs": config.policy_kwargs}
            return cls(algorithm_class, config.env, seed=seed, device=config.device, policy=config.policy, **agents, **kwargs)
        return cls(config.policy, config.env, seed=seed, device=config.device, policy_kwargs=config.policy_kwargs,
                   eval_trajectories=config.eval_trajectories, **agents, **config.algo_kwargs)
    except (ValueError, TypeError) as err:
        raise TrainConfigError(f"{cls.__name__} on {config.env} refuses these settings (--algo-kwargs, --agent-kwargs, "
                               f"--policy-kwargs, ...): {err}") from None
    except (ImportError, gym_error.DependencyNotInstalled) as err:
        raise TrainConfigError(f"--env: {config.env} needs a package that is not installed: {err}") from None
    except gym_error.Error as err:  # anything else Gymnasium refuses (a bad id version, a bad make argument)
        raise TrainConfigError(f"--env: Gymnasium cannot make {config.env} with these agents: {err}") from None


def _close(model: Any) -> None:
    closer = getattr(model, "close", None)
    env = getattr(model, "fed_env", None)
    if callable(closer):
        closer()
    elif env is not None and callable(getattr(env, "close", None)):
        env.close()


def _write_json(path: pathlib.Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True)
class _SavedState:
    path: pathlib.Path
    num_timesteps: int
    rounds_done: int
    wall_seconds: float


def newest_state(seed_dir: pathlib.Path) -> _SavedState | None:
    """The model file of ``seed_dir`` that got furthest: the final ``model.zip`` or a checkpoint,
    whichever has more environment steps (``None``: nothing saved yet)."""
    found: list[tuple[int, int, _SavedState]] = []
    candidates = [(seed_dir / MODEL_FILE, seed_dir / STATE_FILE, 1)]
    checkpoints = seed_dir / CHECKPOINT_DIR
    if checkpoints.is_dir():
        candidates += [(p, p.with_suffix(".json"), 0) for p in checkpoints.iterdir() if _CHECKPOINT_NAME.match(p.name)]
    for path, side, preference in candidates:
        if not path.is_file():
            continue
        state: dict[str, Any] = {}
        if side.is_file():
            try:
                state = json.loads(side.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                state = {}
        match = _CHECKPOINT_NAME.match(path.name)
        steps = state.get("num_timesteps", int(match.group(1)) if match else None)
        if steps is None:
            continue  # a model.zip without its state.json (killed between the two writes): the checkpoints know more
        saved = _SavedState(path, int(steps), int(state.get("rounds_done", -1)), float(state.get("wall_seconds", 0.0)))
        found.append((saved.num_timesteps, preference, saved))
    if not found:
        return None
    return max(found, key=lambda item: item[:2])[2]


def _read_rows(path: pathlib.Path) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        return [], []
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else ([], [])


def _kept_rows(path: pathlib.Path, num_timesteps: int) -> tuple[list[str], list[list[str]]]:
    """The rows of an earlier ``progress.csv`` up to ``num_timesteps`` (those of the rounds a resumed
    run does not redo); rows logged after the checkpoint it resumes from are dropped."""
    header, rows = _read_rows(path)
    if STEP_KEY not in header:
        return [], []
    col = header.index(STEP_KEY)
    kept = [r for r in rows if len(r) > col and r[col] != "" and float(r[col]) <= num_timesteps]
    return header, kept


def _make_logger(seed_dir: pathlib.Path, config: TrainConfig, keep: tuple[list[str], list[list[str]]]) -> Any:
    """SB3's logger on ``seed_dir``: CSV (``progress.csv``, starting with the kept rows of an earlier
    run), TensorBoard event files with ``tensorboard``, the table on stdout with ``verbose``."""
    from stable_baselines3.common.logger import CSVOutputFormat, configure

    formats = ["csv"] + (["stdout"] if config.verbose else []) + (["tensorboard"] if config.tensorboard else [])
    logger = configure(str(seed_dir), formats)
    header, rows = keep
    if header:
        csv_format = next(f for f in logger.output_formats if isinstance(f, CSVOutputFormat))
        writer = csv.writer(csv_format.file, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        csv_format.file.flush()
        csv_format.keys = list(header)
    return logger


class TrainCallback(BaseCallback):
    """Logs at absolute rounds, checkpoints, and keeps the wall time (``on_step`` runs once per round).

    It logs (and so evaluates) at round 0 of a fresh run, at every ``log_interval``-th round counted
    from the start of the run (not of this ``learn`` call, so a resumed run logs at the same rounds as
    an uninterrupted one) and at the last round; then, every ``checkpoint_every`` rounds, it saves
    ``checkpoints/model_<steps>_steps.zip`` with a ``.json`` of its counters and wall time beside it.
    The evaluation runs before the save, so a resumed run's later evaluations are the uninterrupted
    run's.
    """

    def __init__(self, config: TrainConfig, seed_dir: pathlib.Path, target: int, wall_before: float, log_start: bool) -> None:
        super().__init__()
        self.config = config
        self.seed_dir = seed_dir
        self.target = target
        self.wall_before = wall_before
        self.log_start = log_start
        self.started = time.perf_counter()

    def wall_seconds(self) -> float:
        """Training time of this seed so far, over every (resumed) session."""
        return self.wall_before + time.perf_counter() - self.started

    def _on_training_start(self) -> None:
        self.started = time.perf_counter()
        if self.log_start:
            self._log()

    def _on_step(self) -> bool:
        rounds = int(self.model.rounds_done)
        if rounds % self.config.log_interval == 0 or self.model.num_timesteps >= self.target:
            self._log()
        if self.config.checkpoint_every and rounds % self.config.checkpoint_every == 0:
            self._checkpoint()
        return True

    def _log(self) -> None:
        model, logger = self.model, self.model.logger
        if hasattr(model, "evaluate_round"):  # the policy-gradient federations: their own round record
            model._log_round()
        else:  # FedAvgSB3 records its round itself; its evaluation is the driver's
            logger.record(STEP_KEY, model.num_timesteps, exclude="tensorboard")
            if self.config.eval_trajectories > 0:
                returns = model.evaluate(self.config.eval_trajectories)
                logger.record("eval/return", float(returns.mean()))
                for i, value in enumerate(returns):
                    logger.record(f"eval/agent_{i}/return", float(value))
        logger.record(ROUND_KEY, int(model.rounds_done))
        logger.record(WALL_KEY, round(self.wall_seconds(), 3), exclude="tensorboard")
        logger.dump(step=model.num_timesteps)

    def _checkpoint(self) -> None:
        folder = self.seed_dir / CHECKPOINT_DIR
        folder.mkdir(exist_ok=True)
        path = folder / f"model_{self.model.num_timesteps}_steps.zip"
        _save(self.model, path)
        _write_json(path.with_suffix(".json"), _state(self.model, self.wall_seconds()))


def _save(model: Any, path: pathlib.Path) -> None:
    if getattr(model, "replay_buffer", None) is not None or type(model).__name__ == "FedAvgSB3":
        model.save(path, save_replay_buffer=True)  # off-policy agents resume bitwise only with their buffers
    else:
        model.save(path)


def _state(model: Any, wall_seconds: float) -> dict[str, Any]:
    return {"num_timesteps": int(model.num_timesteps), "rounds_done": int(model.rounds_done), "wall_seconds": round(wall_seconds, 3)}


@dataclass(frozen=True)
class SeedOutcome:
    """What happened to one seed: ``how`` is ``"trained"``, ``"resumed"`` or ``"done"`` (nothing to do)."""

    seed: int
    how: str
    from_rounds: int
    rounds_done: int
    num_timesteps: int
    wall_seconds: float


@dataclass(frozen=True)
class TrainResult:
    """The outcome of :func:`train_runs`: the run directory, each seed's outcome, and the files written."""

    out: pathlib.Path
    seeds: list[SeedOutcome]
    figure: pathlib.Path | None
    summary_md: pathlib.Path
    summary_csv: pathlib.Path
    table: str


def _versions() -> dict[str, str]:
    import gymnasium
    import numpy
    import stable_baselines3
    import torch

    try:
        from importlib.metadata import version

        fedrl = version("fedrl")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a plain checkout on PYTHONPATH)
        fedrl = "unknown"
    return {"fedrl": fedrl, "python": platform.python_version(), "torch": torch.__version__, "stable_baselines3": stable_baselines3.__version__,
            "gymnasium": gymnasium.__version__, "numpy": numpy.__version__, "platform": platform.platform()}


def _check_existing(out: pathlib.Path, config: TrainConfig) -> None:
    """Refuse a run directory that holds a run of other settings (resuming it would mix two runs)."""
    path = out / CONFIG_FILE
    if not path.is_file():
        if out.exists() and any(out.iterdir()):
            raise TrainConfigError(f"--out: {out} exists and is not a fedrl train run directory (no {CONFIG_FILE}); "
                                   "give a new or empty directory")
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("identity", {})
    except (OSError, json.JSONDecodeError) as err:
        raise TrainConfigError(f"--out: cannot read {path} ({err})") from None
    now = config.identity()
    differ = [key for key in now if saved.get(key) != now[key]]
    if differ:
        details = "; ".join(f"{key}: {saved.get(key)!r} there, {now[key]!r} now" for key in differ)
        raise TrainConfigError(f"--out: {out} holds a run of other settings ({details}). Rerunning a run directory resumes "
                               "that run: give another --out for a new run (or delete the directory to start over)")


def _plan(config: TrainConfig, model: Any) -> tuple[int, int]:
    """The run's target in environment steps and rounds, from one model's steps per round."""
    per_round = int(model.timesteps_per_round)
    if config.rounds is not None:
        return config.rounds * per_round, config.rounds
    if config.budget < per_round:
        raise TrainConfigError(
            f"--budget: {config.budget} environment steps is less than one round: a round of {type(model).__name__} on "
            f"{config.env} takes {per_round} steps summed over its {model.n_agents} agents; give --budget >= {per_round} "
            "or --rounds N")
    rounds = -(-config.budget // per_round)
    return config.budget, rounds


def train_runs(
    config: TrainConfig | Mapping[str, Any],
    argv: Sequence[str] | None = None,
    print_fn: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train every seed of ``config`` into its run directory, or resume them, then write the summary.

    Everything is checked before any training starts (the settings, the first seed's model, the budget
    against one round, an existing directory's settings). Rerunning on an existing run directory
    resumes each seed from its newest checkpoint (or final model, when the budget grew) and skips
    the seeds that are done; the rounds already trained are not redone.

    :param config: a :class:`~fedrl_algos.zoo.config.TrainConfig`, or settings for
        :func:`~fedrl_algos.zoo.config.resolve_config` (the keys of a config file)
    :param argv: the command line, recorded in ``config.json``
    :param print_fn: where the per-seed lines and the summary table go (``None``: nowhere)
    :return: each seed's outcome, the figure and the summary files
    :raise TrainConfigError: for unusable settings, before anything is trained or written
    """
    from fedrl_algos.zoo.results import write_run_summary

    say = print_fn or (lambda _text: None)
    if not isinstance(config, TrainConfig):
        config = resolve_config(config)
    out = pathlib.Path(config.out)
    _check_existing(out, config)
    if config.tensorboard:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise TrainConfigError("--tensorboard: the tensorboard package is not installed (pip install tensorboard)")
    probe = build_model(config, config.seeds[0])  # every setting the algorithm checks, before any work
    target, rounds = _plan(config, probe)
    per_round = int(probe.timesteps_per_round)
    n_agents = int(probe.n_agents)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    previous = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8")) if (out / CONFIG_FILE).is_file() else {}
    _write_json(out / CONFIG_FILE, {
        "settings": config.to_json(),
        "identity": config.identity(),
        "algorithm_class": type(probe).__name__,
        "n_agents": n_agents,
        "timesteps_per_round": per_round,
        "target_timesteps": target,
        "target_rounds": rounds,
        "versions": _versions(),
        "command": list(argv) if argv is not None else None,
        "created": previous.get("created", now),
        "updated": now,
    })
    say(f"fedrl train: {type(probe).__name__} on {config.env}, {n_agents} agents, {len(config.seeds)} seed(s); "
        f"{rounds} rounds of {per_round} environment steps = {rounds * per_round} steps per seed -> {out}")
    outcomes = []
    for k, seed in enumerate(config.seeds):
        fresh = probe if k == 0 else None  # the first seed's model is the one built to check the settings
        outcomes.append(_train_seed(config, seed, out / seed_dir_name(seed), target, fresh, say, f"[{k + 1}/{len(config.seeds)}]"))
    summary = write_run_summary(out, per_agent=config.per_agent)
    say(summary.table)
    say(f"wrote {summary.summary_md}, {summary.summary_csv}" + (f" and {summary.figure}" if summary.figure else ""))
    return TrainResult(out, outcomes, summary.figure, summary.summary_md, summary.summary_csv, summary.table)


def _train_seed(config: TrainConfig, seed: int, seed_dir: pathlib.Path, target: int, fresh: Any, say: Callable[[str], None],
                tag: str) -> SeedOutcome:
    seed_dir.mkdir(parents=True, exist_ok=True)
    saved = newest_state(seed_dir)
    if saved is not None:
        if fresh is not None:
            _close(fresh)
        cls = _algorithm_class(config)
        model = cls.load(saved.path, device=config.device)
        if int(model.num_timesteps) != saved.num_timesteps:  # the file is the truth; its side file was stale
            saved = _SavedState(saved.path, int(model.num_timesteps), int(model.rounds_done), saved.wall_seconds)
    else:
        model = fresh if fresh is not None else build_model(config, seed)
    from_rounds = int(model.rounds_done)
    wall_before = saved.wall_seconds if saved is not None else 0.0
    if model.num_timesteps >= target:
        if saved is not None and saved.path != seed_dir / MODEL_FILE:  # finished but killed before the final save
            _save(model, seed_dir / MODEL_FILE)
            _write_json(seed_dir / STATE_FILE, _state(model, wall_before))
        say(f"{tag} seed {seed}: done ({from_rounds} rounds, {model.num_timesteps} steps); nothing to train")
        _close(model)
        return SeedOutcome(seed, "done", from_rounds, from_rounds, int(model.num_timesteps), wall_before)
    how = "resumed" if saved is not None else "trained"
    if saved is not None:
        say(f"{tag} seed {seed}: resuming from {saved.path.relative_to(seed_dir)} (round {from_rounds}, {model.num_timesteps} steps)")
    else:
        say(f"{tag} seed {seed}: training")
    keep = _kept_rows(seed_dir / PROGRESS_FILE, int(model.num_timesteps)) if saved is not None else ([], [])
    model.set_logger(_make_logger(seed_dir, config, keep))
    callback = TrainCallback(config, seed_dir, target, wall_before, log_start=saved is None)
    try:
        model.learn(total_timesteps=target - int(model.num_timesteps), callback=callback, log_interval=_NEVER,
                    reset_num_timesteps=saved is None, progress_bar=config.progress)
        wall = callback.wall_seconds()
        _save(model, seed_dir / MODEL_FILE)
        _write_json(seed_dir / STATE_FILE, _state(model, wall))
    finally:
        model.logger.close()
        _close(model)
    say(f"{tag} seed {seed}: {model.rounds_done} rounds, {model.num_timesteps} steps, {wall:.1f} s in all; saved {seed_dir / MODEL_FILE}")
    sys.stdout.flush()
    return SeedOutcome(seed, how, from_rounds, int(model.rounds_done), int(model.num_timesteps), wall)
