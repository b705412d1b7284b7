"""``fedrl reproduce <experiment>|all``: rerun the papers' experiments from the command line.

:func:`register` adds the sub-command to a parser; :mod:`fedrl_algos.cli` lists it among its commands.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fedrl_algos.cli.args import positive_float, positive_int
from fedrl_algos.core.attacks import ATTACKS
from fedrl_algos.core.critic import check_gae_lambda
from fedrl_algos.core.curvature import CURVATURES, check_curvature_clip
from fedrl_algos.reproduce import EXPERIMENTS, run_experiment
from fedrl_algos.reproduce.common import config_settings, format_duration, quick_run_label
from fedrl_algos.reproduce.mfpo import PAPER_BUDGET, REDUCED_BUDGETS, SB3_REDUCED_BUDGETS

__all__ = ["register", "cmd_reproduce", "budget_value", "DEFAULT_SEEDS", "QUICK_SEEDS"]

#: seeds of a full run (the paper's 10) and of a ``--quick`` run
DEFAULT_SEEDS = 10
QUICK_SEEDS = 2


def budget_value(text: str) -> float:
    """``argparse`` type of ``--budget`` / ``--sb3-budget``: ``paper`` (the paper's 1e6 steps per agent)
    or a number > 0 of steps per agent."""
    if text.strip().lower() == "paper":
        return PAPER_BUDGET
    return positive_float(text)


def _steps(value: float) -> str:
    """``1e6``, ``2e4``: a step count as the docs write it."""
    return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")


def _print_estimates(names: list[str], configs: dict[str, Any], seeds: int, quick: bool) -> None:
    """Print the expected wall time of each experiment before any runs (stderr: stdout keeps the results)."""
    if quick:
        # the smoke configs have no measured wall times; their cost is start-up and a few rounds
        print("fedrl reproduce: --quick smoke runs take seconds to a few minutes each (mfpo's Fed-DQN phase the longest)",
              file=sys.stderr)
        return
    total, known = 0.0, True
    for name in names:
        estimate = EXPERIMENTS[name].estimate_wall_time(configs[name], seeds)
        if estimate is None or estimate.seconds is None:
            known = False
        else:
            total += estimate.seconds
        text = "unknown: no measured rate on record" if estimate is None else estimate.describe()
        basis = f"; from {estimate.basis}" if estimate is not None else ""
        print(f"fedrl reproduce {name}: expected wall time {text} with {seeds} seeds on CPU{basis}. "
              "The progress bars (stderr) show each phase's own ETA.", file=sys.stderr)
    if len(names) > 1:
        print(f"fedrl reproduce: expected wall time of the {len(names)} experiments "
              f"{'≈ ' + format_duration(total) if known else 'unknown (at least ' + format_duration(total) + ')'}", file=sys.stderr)


def _flag_fields(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The flags that set a config field, by flag: ``(field, value)``, ``value`` ``None`` when not given."""
    return {"--env": ("env", args.env), "--budget": ("budget", args.budget), "--sb3-budget": ("sb3_budget", args.sb3_budget),
            "--no-sweeps": ("sweeps", False if args.no_sweeps else None), "--attacks": ("attacks", args.attacks),
            "--objective": ("objective", args.objective),
            # "none" is the config's default (None), so it sets nothing
            "--adaptation-baseline": ("adaptation_baseline", None if args.adaptation_baseline in (None, "none") else args.adaptation_baseline),
            "--inner-baseline": ("inner_baseline", None if args.inner_baseline in (None, "none") else args.inner_baseline),
            "--outer-baseline": ("outer_baseline", None if args.outer_baseline in (None, "none") else args.outer_baseline),
            "--curvature-clip": ("curvature_clip", getattr(args, "curvature_clip", None)),
            "--estimator": ("estimators", getattr(args, "estimator", None)), "--m-hs": ("m_hs", getattr(args, "m_hs", None)),
            "--kernels": ("kernels", getattr(args, "kernels", None)),
            "--mfpo-optimizer": ("mfpo_optimizer", getattr(args, "mfpo_optimizer", None)),
            "--baseline": ("baseline", getattr(args, "baseline", None)),
            "--normalize-returns": ("normalize_returns", True if getattr(args, "normalize_returns", False) else None),
            "--critic-time-aware": ("critic_time_aware", True if getattr(args, "critic_time_aware", False) else None),
            "--gae-lambda": ("gae_lambda", getattr(args, "gae_lambda", None)),
            "--normalize-observations": ("normalize_observations", True if getattr(args, "normalize_observations", False) else None)}


def _attack_list(text: str) -> tuple[str, ...]:
    """``--attacks``: ``"all"`` or comma-separated names of :data:`fedrl_algos.core.attacks.ATTACKS`."""
    if text == "all":
        return ("none", *sorted(a for a in ATTACKS if a != "none"))
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in names if a not in ATTACKS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"attacks must be 'all' or comma-separated names of {sorted(ATTACKS)}, got {text!r}")
    return names


def _estimator_list(text: str) -> tuple[str, ...]:
    """``--estimator``: comma-separated curvature estimators of :data:`fedrl_algos.core.curvature.CURVATURES`."""
    names = tuple(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    unknown = [e for e in names if e not in CURVATURES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"estimator must be comma-separated names of {list(CURVATURES)}, got {text!r}")
    return names


def _gae_lambda(text: str) -> float:
    """``--gae-lambda``: a number in [0, 1] (:func:`~fedrl_algos.core.critic.check_gae_lambda`)."""
    try:
        value = float(text)
        check_gae_lambda(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}") from None
    return value


def _curvature_clip(text: str) -> float:
    """``--curvature-clip``: a positive finite number (:func:`~fedrl_algos.core.curvature.check_curvature_clip`)."""
    try:
        return check_curvature_clip(float(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from error


def _int_list(text: str) -> tuple[int, ...]:
    """``--m-hs``: comma-separated positive integers."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"m-hs must be comma-separated positive integers, got {text!r}")
    return values


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
    try:
        configs = {name: EXPERIMENTS[name].config(**changes) for name in names}
    except (TypeError, ValueError) as error:  # flags that clash, e.g. --gae-lambda without --baseline critic
        print(f"fedrl reproduce: {error}", file=sys.stderr)
        return 2
    seeds = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    out = Path(args.out)
    progress = not args.no_progress
    _print_estimates(names, configs, seeds, args.quick)
    start = time.perf_counter()
    for name in names:
        payload = run_experiment(EXPERIMENTS[name], out, seeds=seeds, quick=args.quick, device=args.device, progress=progress,
                                 config=configs[name])
        # a quick run says so on the line that reports it, as its report.md does
        label = f"{quick_run_label(config_settings(configs[name].quick()), seeds)}; " if args.quick else ""
        print(f"{name}: {label}{payload['wall_time_s']:.1f} s, {len(payload['records'])} records -> {out / name}/ "
              "(results.json, report.md, figures)")
    if len(names) > 1:
        print(f"all {len(names)} experiments: {time.perf_counter() - start:.1f} s")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl reproduce`` to the ``fedrl`` parser."""
    lines = [f"  {name:16s} {exp.description}" for name, exp in EXPERIMENTS.items()]
    estimates = [e.estimate_wall_time(e.config(), DEFAULT_SEEDS) for e in EXPERIMENTS.values()]
    default_all = sum((est.seconds or 0.0) if est is not None else 0.0 for est in estimates)
    parser = subparsers.add_parser(
        "reproduce",
        help="rerun an experiment of the Per-FedAvg-PG or MFPO paper (results.json, PNG figures, report.md)",
        description="Rerun an experiment of the Per-FedAvg-PG or MFPO paper with its configuration, batched over seeds. "
        "Writes results.json (flat records), PNG figures and report.md (this run next to the paper's numbers) "
        "under OUT/<experiment>/.",
        epilog="experiments:\n" + "\n".join(lines) + "\n  all              every experiment above, in this order "
        f"(≈ {format_duration(default_all)} at the defaults on a 2-core CPU machine)\n\n"
        "Before it starts, a run prints its expected wall time (from wall times measured on a 2-core machine) "
        "and every phase shows a progress bar with an ETA, on stderr.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("experiment", choices=[*EXPERIMENTS, "all"], metavar="EXPERIMENT", help="an experiment name or 'all'")
    parser.add_argument(
        "--seeds", type=positive_int, default=None, metavar="N",
        help=f"number of seeds 0..N-1 (default {DEFAULT_SEEDS}, or {QUICK_SEEDS} with --quick)",
    )
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long smoke version (few seeds, few rounds), labelled QUICK SMOKE RUN in its report and "
                        "summary line: not comparable with the paper")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="torch device (default cpu)")
    parser.add_argument("--out", default="fedrl_out", metavar="DIR", help="output directory (default fedrl_out)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (the expected wall time is still printed)")
    parser.add_argument("--env", choices=["cartpole", "pendulum", "halfcheetah", "hopper", "pong", "breakout"], default=None,
                        help="environment of the mfpo / byzantine experiments: a Table I row (default cartpole)")
    reduced_pg = ", ".join(f"{env} {_steps(steps)}" for env, steps in REDUCED_BUDGETS.items())
    parser.add_argument("--budget", type=budget_value, default=None, metavar="STEPS",
                        help=f"environment steps per agent of the mfpo / byzantine runs, or 'paper' ({_steps(PAPER_BUDGET)}); default: the paper's "
                        f"on cartpole/pendulum, on mfpo's MuJoCo/Atari rows the reduced run that fits a 2-core machine ({reduced_pg})")
    reduced = ", ".join(f"{env} {_steps(steps)}" for env, steps in SB3_REDUCED_BUDGETS.items())
    parser.add_argument("--sb3-budget", type=budget_value, default=None, metavar="STEPS",
                        help=f"steps per agent of mfpo's Fed-DQN / Fed-SAC, or 'paper' ({_steps(PAPER_BUDGET)}; ≈ 11 h for CartPole's "
                        f"Fed-DQN at 10 seeds); default: the reduced run that fits a 2-core machine ({reduced}), at most --budget")
    parser.add_argument("--no-sweeps", action="store_true", help="mfpo: the comparison only, without the agents / local-steps sweeps")
    parser.add_argument("--mfpo-optimizer", choices=["sgd", "adam"], default=None,
                        help="mfpo: MFPO's step rule, the paper's plain steps (sgd, default) or Adam steps along its momentum direction "
                        "with the row's measured settings (adam; not the paper's: docs/algorithms/mfpo.md)")
    parser.add_argument("--baseline", choices=["loo", "linear", "critic"], default=None,
                        help="mfpo: MFPO's baseline in the comparison and the sweeps: loo (leave-one-out, default), linear (garage's "
                        "linear feature baseline, cross-fitted) or critic (a learned value function per agent, GAE with λ = 1 or "
                        "--gae-lambda, kept local); only MFPO's rows: FedAvg-PG and FedPG-BR keep the leave-one-out baseline")
    parser.add_argument("--normalize-returns", action="store_true",
                        help="mfpo: MFPO standardises every episode's returns-to-go before its baseline (the MFPO authors' code; "
                        "not an unbiased estimate of the gradient); only MFPO's rows")
    parser.add_argument("--critic-time-aware", action="store_true",
                        help="mfpo: with --baseline critic, the critic also takes the step's fraction of the horizon (the value to go "
                        "on a fixed horizon depends on the time left); only MFPO's rows")
    parser.add_argument("--gae-lambda", type=_gae_lambda, default=None, metavar="LAMBDA",
                        help="mfpo: with --baseline critic, the GAE λ of MFPO's advantages (default 1: the critic as a baseline of "
                        "the returns to go, unbiased; below 1 biased and less noisy, SB3's default 0.95); only MFPO's rows")
    parser.add_argument("--normalize-observations", action="store_true",
                        help="mfpo: every method reads observations normalized with SB3 VecNormalize's rule, the moments pooled over "
                        "each seed's agents once per round (not the paper's; the MuJoCo rows learn faster with it)")
    parser.add_argument("--attacks", type=_attack_list, default=None, metavar="LIST",
                        help="byzantine: comma-separated attacks to run, 'none' included for the attack-free run, or 'all' "
                        "(default none,random_noise,sign_flip)")
    parser.add_argument("--estimator", type=_estimator_list, default=None, metavar="LIST",
                        help="curvature: comma-separated curvature estimators of the exact variant, each run at every m_h: "
                        "paper (eq. (3)), causal (unbiased, baseline-corrected), lvc (ProMP's, biased) (default paper)")
    parser.add_argument("--m-hs", type=_int_list, default=None, metavar="LIST",
                        help="curvature: comma-separated Hessian batches m_h (default 10,50,100,200,500,1000)")
    parser.add_argument("--objective", choices=["paper", "debiased"], default=None,
                        help="fewshot: meta-training objective, the paper's first-order variant (default) or SG-MRL's debiased "
                        "E[J(θ + α ĝ_in)] with its unbiased meta-gradient (beyond the paper)")
    parser.add_argument("--adaptation-baseline", choices=["none", "loo", "mean"], default=None,
                        help="fewshot: baseline of the adaptation gradient (meta-training's inner step and the held-out step): "
                        "none (the paper's, default), loo (leave-one-out time-dependent mean reward-to-go, unbiased) or mean")
    parser.add_argument("--inner-baseline", choices=["none", "loo", "mean"], default=None,
                        help="curvature: baseline of meta-training's inner step ĝ_in (the evaluation's step stays the paper's): "
                        "none (default), loo (leave-one-out, unbiased) or mean (beyond the paper)")
    parser.add_argument("--outer-baseline", choices=["none", "loo", "mean"], default=None,
                        help="curvature, fewshot, rollouts: baseline of meta-training's outer gradient ĝ_out, which the exact "
                        "variant multiplies by I + αĤ: none (default), loo (leave-one-out, unbiased) or mean (beyond the paper)")
    parser.add_argument("--curvature-clip", type=_curvature_clip, default=None, metavar="C",
                        help="curvature: trust region of the exact variant's curvature term, ‖αĤĝ_out‖ ≤ C‖ĝ_out‖ (biased where "
                        "it acts; default none: the paper's eq. (7); beyond the paper)")
    parser.add_argument("--kernels", choices=["auto", "torch", "numba"], default=None,
                        help="the kernels on CPU: numba (compiled loops, pip install 'fedrl[fast]'), torch, or auto (default: numba "
                        "where Numba is installed). fewshot, curvature, rollouts: the arc policy's rollouts and gradients (the two give "
                        "statistically the same results, not bitwise the same numbers); alpha, personalization: the tabular policy's "
                        "rollout loop (bitwise the same numbers)")
    parser.set_defaults(func=cmd_reproduce)

