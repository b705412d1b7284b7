"""``fedrl reproduce <experiment>|all``: rerun the papers' experiments from the command line.

:func:`register` adds the sub-command to a parser; :mod:`fedrl_algos.cli` lists it among its commands.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fedrl_algos._cli_args import positive_float, positive_int
from fedrl_algos.core.attacks import ATTACKS
from fedrl_algos.reproduce import EXPERIMENTS, run_experiment

__all__ = ["register", "cmd_reproduce", "DEFAULT_SEEDS", "QUICK_SEEDS"]

#: seeds of a full run (the paper's 10) and of a ``--quick`` run
DEFAULT_SEEDS = 10
QUICK_SEEDS = 2


def _flag_fields(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The flags that set a config field, by flag: ``(field, value)``, ``value`` ``None`` when not given."""
    return {"--env": ("env", args.env), "--budget": ("budget", args.budget), "--sb3-budget": ("sb3_budget", args.sb3_budget),
            "--no-sweeps": ("sweeps", False if args.no_sweeps else None), "--attacks": ("attacks", args.attacks)}


def _attack_list(text: str) -> tuple[str, ...]:
    """``--attacks``: ``"all"`` or comma-separated names of :data:`fedrl_algos.core.attacks.ATTACKS`."""
    if text == "all":
        return ("none", *sorted(a for a in ATTACKS if a != "none"))
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in names if a not in ATTACKS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"attacks must be 'all' or comma-separated names of {sorted(ATTACKS)}, got {text!r}")
    return names


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Run one experiment or all of them; print where the results went."""
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("fedrl reproduce: --device cuda was requested but CUDA is not available", file=sys.stderr)
            return 2
    if args.experiment == "all":
        names = [name for name, exp in EXPERIMENTS.items() if exp.include_in_all]
    else:
        names = [args.experiment]
    chosen = {flag: pair for flag, pair in _flag_fields(args).items() if pair[1] is not None}
    # A flag applies to the experiments whose config has its field; check all before running any.
    for name in names:
        fields = EXPERIMENTS[name].config_fields()
        for flag, (key, _) in chosen.items():
            if key not in fields:
                takers = sorted(n for n, e in EXPERIMENTS.items() if key in e.config_fields())
                print(f"fedrl reproduce: {flag} applies to {', '.join(takers)}, not {name}", file=sys.stderr)
                return 2
    changes = dict(chosen.values())
    # The flags change the paper's config; --quick then shrinks it (run_experiment applies quick()).
    configs = {name: EXPERIMENTS[name].config(**changes) for name in names}
    seeds = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    out = Path(args.out)
    progress = not args.no_progress
    start = time.perf_counter()
    for name in names:
        payload = run_experiment(EXPERIMENTS[name], out, seeds=seeds, quick=args.quick, device=args.device, progress=progress,
                                 config=configs[name])
        print(f"{name}: {payload['wall_time_s']:.1f} s, {len(payload['records'])} records -> {out / name}/ (results.json, report.md, figures)")
    if len(names) > 1:
        print(f"all {len(names)} experiments: {time.perf_counter() - start:.1f} s")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl reproduce`` to the ``fedrl`` parser."""
    lines = [f"  {name:16s} {exp.description}" for name, exp in EXPERIMENTS.items()]
    excluded = [name for name, exp in EXPERIMENTS.items() if not exp.include_in_all]
    parser = subparsers.add_parser(
        "reproduce",
        help="rerun an experiment of the Per-FedAvg-PG or MFPO paper (results.json, PNG figures, report.md)",
        description="Rerun an experiment of the Per-FedAvg-PG or MFPO paper with its configuration, batched over seeds. "
        "Writes results.json (flat records), PNG figures and report.md (this run next to the paper's numbers) "
        "under OUT/<experiment>/.",
        epilog="experiments:\n" + "\n".join(lines) + f"\n  all              every experiment above except {' and '.join(excluded)} (hours at full size), in this order",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("experiment", choices=[*EXPERIMENTS, "all"], metavar="EXPERIMENT", help="an experiment name or 'all'")
    parser.add_argument(
        "--seeds", type=positive_int, default=None, metavar="N",
        help=f"number of seeds 0..N-1 (default {DEFAULT_SEEDS}, or {QUICK_SEEDS} with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke version (few seeds, few rounds)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="torch device (default cpu)")
    parser.add_argument("--out", default="fedrl_out", metavar="DIR", help="output directory (default fedrl_out)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--env", choices=["cartpole", "pendulum", "halfcheetah", "hopper", "pong", "breakout"], default=None,
                        help="environment of the mfpo / byzantine experiments: a Table I row (default cartpole)")
    parser.add_argument("--budget", type=positive_float, default=None, metavar="STEPS",
                        help="environment steps per agent of the mfpo / byzantine runs (default 1e6)")
    parser.add_argument("--sb3-budget", type=positive_float, default=None, metavar="STEPS",
                        help="steps per agent of mfpo's Fed-DQN / Fed-SAC (default: --budget)")
    parser.add_argument("--no-sweeps", action="store_true", help="mfpo: the comparison only, without the agents / local-steps sweeps")
    parser.add_argument("--attacks", type=_attack_list, default=None, metavar="LIST",
                        help="byzantine: comma-separated attacks to run, 'none' included for the attack-free run, or 'all' "
                        "(default none,random_noise,sign_flip)")
    parser.set_defaults(func=cmd_reproduce)

