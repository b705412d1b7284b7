"""``fedrl bench reference``: fedrl's training rounds against the papers' reference implementations.

The same configuration runs on both sides, alternating, ``repeats`` times: MFPO on CartPole against
HansenHua/MFPO-INFOCOM24 and FedPG-BR on CartPole against flint-xf-fan/Byzantine-Federated-RL,
10 homogeneous agents with Gymnasium's CartPole parameters, a (16, 16) ReLU policy and the
references' batch sizes. The reference code is not part of fedrl: pass the directories of its
checkouts (``--mfpo-dir``, ``--fedpgbr-dir``). Each reference run is a fresh subprocess
(:mod:`fedrl_algos.bench._reference_runner`, which lists what it substitutes to run the code here) that
counts every env step the reference takes; fedrl's side counts the steps inside episodes
(``env_steps_per_agent`` and the server's ``server_env_steps``), the same quantity. The figures are
env steps per second and rounds per second of whole rounds, after the warm-up rounds; the speed-up
is fedrl's median steps/s over the reference's median.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedrl_algos.cli.args import finish_bench, positive_int, print_columns, set_threads

__all__ = ["ReferenceConfig", "ReferenceBenchRecord", "CONFIGS", "bench_reference", "fedrl_rate", "reference_rate", "reference_code_dir", "add_reference_target"]

N_AGENTS = 10
POLICY_KWARGS: dict[str, Any] = {"net_arch": (16, 16), "activation": "relu"}  # both references' CartPole network


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """One comparison: fedrl's algorithm and keyword arguments, the reference and its runner arguments.

    :param algorithm: class name in :mod:`fedrl_algos`
    :param fedrl_kwargs: the fedrl model's keyword arguments (besides policy, env, seed, device)
    :param reference: ``"mfpo"`` or ``"fedpg_br"`` (which runner of :mod:`fedrl_algos.bench._reference_runner`)
    :param repository: the reference's GitHub repository
    :param code_subdir: the reference's code directory inside its checkout
    :param marker_files: files that identify that code directory
    :param runner_args: the runner's configuration arguments
    :param rounds: default timed rounds
    :param reference_warmup: warm-up rounds of the reference before its clock starts
    """

    algorithm: str
    fedrl_kwargs: dict[str, Any]
    reference: str
    repository: str
    code_subdir: str
    marker_files: tuple[str, ...]
    runner_args: tuple[str, ...]
    rounds: int
    reference_warmup: int


#: name -> configuration; fedrl always runs one warm-up round (its first MFPO round also draws the
#: D̃ = K·D trajectories of the initial direction, so it is not a typical round).
CONFIGS: dict[str, ReferenceConfig] = {
    "mfpo-cartpole": ReferenceConfig(
        algorithm="MFPO",
        fedrl_kwargs={"local_steps": 10, "n_trajectories": 20, "gamma": 0.99},
        reference="mfpo",
        repository="HansenHua/MFPO-INFOCOM24",
        code_subdir="code",
        marker_files=("main.py", "server/server.py", "agent/worker_discrete.py"),
        runner_args=("--agents", str(N_AGENTS), "--trajectories", "20", "--local-steps", "10"),
        rounds=1,
        # A reference round is 20 s of identical iterations with nothing to compile or cache.
        reference_warmup=0,
    ),
    "fedpg_br-cartpole": ReferenceConfig(
        algorithm="FedPGBR",
        fedrl_kwargs={"batch_range": (14, 18), "inner_batch_size": 4, "step_size": 1e-3, "server_optimizer": "adam", "gamma": 0.99},
        reference="fedpg_br",
        repository="flint-xf-fan/Byzantine-Federated-RL",
        code_subdir="codes",
        marker_files=("run.py", "agent.py", "worker.py", "options.py"),
        runner_args=("--agents", str(N_AGENTS), "--batch-range", "14", "18", "--gamma", "0.99"),
        rounds=5,
        reference_warmup=1,
    ),
}


@dataclasses.dataclass
class ReferenceBenchRecord:
    """One configuration of ``fedrl bench reference``: medians over the repeats, and every repeat."""

    config: str
    rounds: int
    fedrl_steps_per_s: float
    fedrl_rounds_per_s: float
    reference_steps_per_s: float
    reference_rounds_per_s: float
    fedrl_runs: list[dict[str, float]]
    reference_runs: list[dict[str, float]]

    @property
    def speedup(self) -> float:
        """fedrl's median env steps/s over the reference's."""
        return self.fedrl_steps_per_s / self.reference_steps_per_s


def reference_code_dir(config: str, path: str | os.PathLike | None, argument: str) -> Path:
    """The reference's code directory for ``config``, given its checkout (or that directory itself).

    :param config: a name from :data:`CONFIGS`
    :param path: the checkout's directory
    :param argument: the argument's name, for the error message
    :raises ValueError: when ``path`` is missing or is not a checkout of the reference
    """
    cfg = CONFIGS[config]
    expected = f"a checkout of github.com/{cfg.repository} (a directory whose {cfg.code_subdir}/ holds {', '.join(cfg.marker_files)})"
    if path is None:
        raise ValueError(f"{argument} is required for {config}: pass {expected}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"{argument} must be {expected}; {str(path)!r} is not a directory")
    for candidate in (root / cfg.code_subdir, root):
        if all((candidate / f).is_file() for f in cfg.marker_files):
            return candidate.resolve()
    raise ValueError(f"{argument} must be {expected}; {str(path)!r} does not hold {cfg.code_subdir}/{cfg.marker_files[0]}")


def _env_steps(model: Any) -> float:
    """Env steps inside episodes so far: every agent's, plus the server's own (FedPG-BR)."""
    return model.env_steps_per_agent * model.n_agents + getattr(model, "server_env_steps", 0.0)


def fedrl_rate(config: str, rounds: int, seed: int = 0, device: str = "cpu") -> dict[str, float]:
    """Time ``rounds`` whole rounds of fedrl's side of ``config`` after one warm-up round.

    :param config: a name from :data:`CONFIGS`
    :param rounds: timed rounds
    :param seed: seed of the model
    :param device: torch device
    :return: ``rounds``, ``seconds``, ``env_steps`` (inside episodes), ``steps_per_s``, ``rounds_per_s``
    """
    import fedrl_algos

    cfg = CONFIGS[config]
    model = getattr(fedrl_algos, cfg.algorithm)(
        "MlpPolicy", "fedrl/CartPole-v0", agent_kwargs=[{}] * N_AGENTS, policy_kwargs=dict(POLICY_KWARGS),
        seed=seed, device=device, **cfg.fedrl_kwargs,
    )  # fmt: skip
    model.learn(total_rounds=1)
    steps, start = _env_steps(model), time.perf_counter()
    model.learn(total_rounds=rounds, reset_num_timesteps=False)
    seconds = time.perf_counter() - start
    return _rates(rounds, seconds, round(_env_steps(model) - steps))


def _rates(rounds: int, seconds: float, env_steps: int) -> dict[str, float]:
    return {"rounds": rounds, "seconds": seconds, "env_steps": env_steps, "steps_per_s": env_steps / seconds, "rounds_per_s": rounds / seconds}


def reference_rate(config: str, code_dir: Path, rounds: int, threads: int = 1, seed: int = 0, timeout: float | None = None) -> dict[str, float]:
    """Time ``rounds`` rounds of the reference's own training loop in a subprocess.

    :param config: a name from :data:`CONFIGS`
    :param code_dir: the reference's code directory (:func:`reference_code_dir`)
    :param rounds: timed rounds
    :param threads: torch intra-op (and OpenMP) threads of the subprocess
    :param seed: the reference's ``--seed``
    :param timeout: seconds before the subprocess is stopped (``None``: no limit)
    :return: as :func:`fedrl_rate`
    :raises RuntimeError: when the reference fails, with the end of its output
    """
    cfg = CONFIGS[config]
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="fedrl_reference_") as scratch:
        out, log = Path(scratch) / "result.json", Path(scratch) / "output.log"
        command = [
            sys.executable, "-m", "fedrl_algos.bench._reference_runner", cfg.reference, str(code_dir), *cfg.runner_args,
            "--rounds", str(rounds), "--warmup", str(cfg.reference_warmup), "--threads", str(threads),
            "--seed", str(seed), "--out", str(out),
        ]  # fmt: skip
        with open(log, "w") as stream:
            # The references print every round (and tqdm bars); their output goes to the log.
            done = subprocess.run(command, cwd=scratch, env=env, stdout=stream, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        if done.returncode != 0 or not out.is_file():
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the {cfg.repository} run failed (exit status {done.returncode}): {' '.join(command)}\n{tail}")
        result = json.loads(out.read_text())
    return _rates(int(result["rounds"]), float(result["seconds"]), int(result["env_steps"]))


def bench_reference(
    mfpo_dir: str | os.PathLike | None = None,
    fedpgbr_dir: str | os.PathLike | None = None,
    configs: Sequence[str] = tuple(CONFIGS),
    rounds: int | None = None,
    repeats: int = 3,
    threads: int = 1,
    seed: int = 0,
    show: bool = True,
) -> list[ReferenceBenchRecord]:
    """Run fedrl and the reference implementations in the same configuration, alternating.

    :param mfpo_dir: checkout of HansenHua/MFPO-INFOCOM24 (needed for ``mfpo-cartpole``)
    :param fedpgbr_dir: checkout of flint-xf-fan/Byzantine-Federated-RL (needed for ``fedpg_br-cartpole``)
    :param configs: names from :data:`CONFIGS`
    :param rounds: timed rounds on each side (default: each configuration's ``rounds``)
    :param repeats: runs of each side; the table shows medians
    :param threads: torch threads of both sides
    :param seed: seed of both sides
    :param show: print the table
    :raises ValueError: for an unknown configuration, a bad count, or a missing or wrong directory
    """
    from fedrl_envs.validation import check_int

    for name in configs:
        if name not in CONFIGS:
            raise ValueError(f"configs must be among {list(CONFIGS)}, got {name!r}")
    if rounds is not None:
        rounds = check_int("rounds", rounds, 1)
    repeats = check_int("repeats", repeats, 1)
    threads = check_int("threads", threads, 1)
    given = {"mfpo": (mfpo_dir, "mfpo_dir"), "fedpg_br": (fedpgbr_dir, "fedpgbr_dir")}
    code_dirs = {name: reference_code_dir(name, *given[CONFIGS[name].reference]) for name in configs}
    set_threads(threads)
    records = []
    for name in configs:
        n_rounds = rounds or CONFIGS[name].rounds
        fedrl_runs, reference_runs = [], []
        for _ in range(repeats):
            reference_runs.append(reference_rate(name, code_dirs[name], n_rounds, threads, seed))
            fedrl_runs.append(fedrl_rate(name, n_rounds, seed))
        records.append(
            ReferenceBenchRecord(
                config=name,
                rounds=n_rounds,
                fedrl_steps_per_s=statistics.median(r["steps_per_s"] for r in fedrl_runs),
                fedrl_rounds_per_s=statistics.median(r["rounds_per_s"] for r in fedrl_runs),
                reference_steps_per_s=statistics.median(r["steps_per_s"] for r in reference_runs),
                reference_rounds_per_s=statistics.median(r["rounds_per_s"] for r in reference_runs),
                fedrl_runs=fedrl_runs,
                reference_runs=reference_runs,
            )
        )
    if show:
        print_reference_table(records)
    return records


def print_reference_table(records: Sequence[ReferenceBenchRecord]) -> None:
    """Print the medians and fedrl's speed-up."""
    header = ["config", "rounds", "reference steps/s", "fedrl steps/s", "reference rounds/s", "fedrl rounds/s", "speed-up"]
    lines = [header] + [
        [r.config, str(r.rounds), f"{r.reference_steps_per_s:.3g}", f"{r.fedrl_steps_per_s:.3g}",
         f"{r.reference_rounds_per_s:.3g}", f"{r.fedrl_rounds_per_s:.3g}", f"{r.speedup:.1f}x"]
        for r in records
    ]  # fmt: skip
    print_columns(lines)
    repeats = len(records[0].fedrl_runs) if records else 0
    print(f"medians of {repeats} alternating runs; env steps inside episodes per second of whole rounds after warm-up; "
          "method: fedrl_algos/bench/reference.py")  # fmt: skip


def _cmd(args: argparse.Namespace) -> int:
    given = {"mfpo": (args.mfpo_dir, "--mfpo-dir"), "fedpg_br": (args.fedpgbr_dir, "--fedpgbr-dir")}
    try:
        for name in args.configs:  # the same checks, naming the options
            reference_code_dir(name, *given[CONFIGS[name].reference])
        records = bench_reference(args.mfpo_dir, args.fedpgbr_dir, configs=args.configs, rounds=args.rounds,
                                  repeats=args.repeats, threads=args.threads, seed=args.seed)  # fmt: skip
    except ValueError as err:
        print(f"fedrl bench reference: error: {err}", file=sys.stderr)
        return 2
    finish_bench(args.json, [dataclasses.asdict(r) | {"speedup": r.speedup} for r in records])
    return 0


def add_reference_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench reference`` to the bench sub-commands."""
    p = targets.add_parser(
        "reference",
        help="fedrl's training rounds vs the papers' reference implementations (their checkouts needed)",
        description="Env steps/s and rounds/s of MFPO and FedPG-BR on CartPole, fedrl against the reference implementations "
        "(HansenHua/MFPO-INFOCOM24, flint-xf-fan/Byzantine-Federated-RL) in the same configuration, alternating runs; "
        "prints medians and fedrl's speed-up. Give the directories of the references' checkouts.",
    )
    p.add_argument("--mfpo-dir", metavar="PATH", help="checkout of HansenHua/MFPO-INFOCOM24 (for mfpo-cartpole)")
    p.add_argument("--fedpgbr-dir", metavar="PATH", help="checkout of flint-xf-fan/Byzantine-Federated-RL (for fedpg_br-cartpole)")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="configurations to compare")
    p.add_argument("--rounds", type=positive_int, default=None, help="timed rounds on each side (default: MFPO 1, FedPG-BR 5)")
    p.add_argument("--repeats", type=positive_int, default=3, help="alternating runs of each side; the table shows medians (default 3)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch and OpenMP threads of both sides (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of both sides")
    p.add_argument("--json", metavar="PATH", help="also write the records (every run) as JSON")
    p.set_defaults(func=_cmd)
