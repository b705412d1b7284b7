"""``fedrl flower simulate`` and ``fedrl flower app``: fedrl federations on Flower from the shell.

This module imports Flower only when a command runs, so ``fedrl --help`` works without the extra.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
from typing import Any

from fedrl_algos.cli.args import positive_int

__all__ = ["register", "flower_algorithms"]


def flower_algorithms() -> dict[str, type]:
    """``--algo`` names → the library's algorithms that run on Flower (those declaring a ``round_protocol``)."""
    from fedrl_algos import ALGORITHMS

    return {name: cls for name, cls in ALGORITHMS.items() if getattr(cls, "round_protocol", None) is not None}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of keyword arguments")
    return value


def _user_errors(command: Any) -> Any:
    """``command`` with what a user's input causes (an unknown env, a missing or foreign file, a
    refused option, a federation whose rounds all failed) reported as ``fedrl flower: error: ...``
    instead of a traceback."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (ValueError, TypeError, FileNotFoundError, RuntimeError) as err:
            raise SystemExit(f"fedrl flower {args.flower_command}: error: {err}") from None

    return run


def _model_from_args(args: argparse.Namespace) -> Any:
    from fedrl_algos.flower.task import import_env_modules

    import_env_modules(args.env_module)  # the user's registrations, before --env is looked up
    if args.model is not None:
        from fedrl_algos.flower import load_model

        return load_model(args.model)
    if args.algo is None:
        raise SystemExit("fedrl flower: give --model PATH (a saved fedrl model) or --algo NAME to build one")
    cls = flower_algorithms()[args.algo]
    return cls(args.policy, args.env, seed=args.seed, device="cpu", verbose=1 if getattr(args, "verbose", False) else 0, **args.kwargs)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from fedrl_algos.flower import simulate

    model = _model_from_args(args)
    if args.verbose:
        model.verbose = 1
    stats: list[dict[str, Any]] = []
    model = simulate(model, args.rounds, round_timeout=args.round_timeout, min_train_nodes=args.min_train_nodes,
                     checkpoint_path=args.checkpoint, eval_trajectories=args.eval_trajectories, progress_bar=not args.no_progress,
                     round_stats=stats, env_modules=args.env_module)
    for s in stats:
        failures = "; ".join(f"agent {a}: {why}" for a, why in sorted(s["failures"].items())) or "none"
        print(f"round {s['round']}: {s['replies']} replies, {'skipped' if s['skipped'] else 'aggregated'}, "
              f"{s['bytes_sent'] + s['bytes_received']} bytes, {s['seconds']:.2f} s; failures: {failures}")
    if args.out:
        model.save(args.out)
        print(f"saved the trained model to {args.out}")
    return 0


def _cmd_app(args: argparse.Namespace) -> int:
    from fedrl_algos.flower.app_dir import write_app

    model_path = pathlib.Path(args.model)
    if args.algo is not None:  # build the model and save it where the app will read it
        model = _model_from_args(argparse.Namespace(**{**vars(args), "model": None}))
        model.save(model_path)
    directory = write_app(args.directory, model_path, num_rounds=args.rounds, output_path=args.out, checkpoint_path=args.checkpoint,
                          round_timeout=args.round_timeout, min_train_nodes=args.min_train_nodes or 1, env_modules=args.env_module)
    n = _n_agents(model_path)
    print(f"wrote the Flower App {directory} (model {model_path.resolve()}, {n} agents, {args.rounds} rounds)")
    print("run it on a local deployment (insecure mode, for a local try only; docs/flower.md has the TLS set-up):")
    print("  flower-superlink --insecure --disable-runtime-dependency-installation &")
    for i in range(n):
        print(f"  flower-supernode --insecure --superlink 127.0.0.1:8000 --port {9094 + i} --node-config 'partition-id={i} num-partitions={n}' &")
    print(f"  flwr run {directory} <superlink-connection> --stream")
    return 0


def _cmd_robust(args: argparse.Namespace) -> int:
    import torch

    from fedrl_algos.flower.robust import comparison_table, gridworld_comparison

    torch.set_num_threads(1)
    records = gridworld_comparison(seeds=tuple(range(args.seeds)), rounds=args.rounds, progress=None if args.quiet else print)
    table = comparison_table(records)
    print(table)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "robust.json").write_text(json.dumps(records, indent=1))
        (out / "robust.md").write_text(table)
        print(f"wrote {out / 'robust.md'} and {out / 'robust.json'}")
    return 0


def _n_agents(path: pathlib.Path) -> int:
    from fedrl_algos.flower import load_model

    return int(load_model(path).n_agents)


def _add_model_args(p: argparse.ArgumentParser, model_required: bool = False) -> None:
    p.add_argument("--model", required=model_required, metavar="PATH", help="a saved fedrl model file (model.save)")
    p.add_argument("--algo", choices=sorted(flower_algorithms()), help="build a new model of this algorithm instead of --model")
    p.add_argument("--env", default="fedrl/GridWorld-v0", help="with --algo: a fedrl task family id (default fedrl/GridWorld-v0)")
    p.add_argument("--policy", default="TabularPolicy", help="with --algo: TabularPolicy or MlpPolicy (default TabularPolicy)")
    p.add_argument("--seed", type=int, default=0, help="with --algo: the seed (default 0)")
    p.add_argument("--env-module", action="append", default=[], metavar="MODULE",
                   help="a module that registers an env of your own (gymnasium.register at import); imported here and in every "
                   "ClientApp (repeatable)")
    p.add_argument("--kwargs", type=_json_object, default={}, help="with --algo: constructor keyword arguments as JSON")
    p.add_argument("--rounds", type=positive_int, default=5, help="communication rounds in total (default 5)")
    p.add_argument("--out", metavar="PATH", help="save the trained model here")
    p.add_argument("--checkpoint", metavar="PATH", help="save the server's model after every round; resume from it if it exists")
    p.add_argument("--round-timeout", type=float, default=600.0, help="seconds the server waits for a round's replies (default 600)")
    p.add_argument("--min-train-nodes", type=positive_int, default=None, help="valid replies a round needs, else it is skipped (default 1)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl flower simulate|app`` to the ``fedrl`` parser."""
    flower = subparsers.add_parser(
        "flower", help="run a federation on Flower (simulation, or a Flower App for a deployment)",
        description="fedrl federations on Flower (the flower extra): one agent per SuperNode, the algorithm's server side "
        "as the ServerApp's Strategy; the same numbers as in one process. See docs/flower.md.",
    )
    commands = flower.add_subparsers(dest="flower_command", required=True, metavar="COMMAND",
                                     help="simulate, app (a Flower App directory) or robust (aggregator comparison)")
    sim = commands.add_parser("simulate", help="train through Flower's simulation engine (Ray)",
                              description="Train a fedrl model through Flower's simulation engine (Ray backend), one virtual "
                              "SuperNode per agent, and print each round's replies, failures, bytes and time.")
    _add_model_args(sim)
    sim.add_argument("--eval-trajectories", type=int, default=0, help="client-side evaluation rollouts per agent after each round")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.add_argument("--verbose", action="store_true", help="the model's logger on stdout (per-round metrics)")
    sim.set_defaults(func=_user_errors(_cmd_simulate))
    app = commands.add_parser("app", help="write a Flower App directory for flwr run",
                              description="Write a Flower App directory (pyproject.toml with [tool.flwr.app], server_app.py, "
                              "client_app.py) that trains a fedrl model file with flwr run, and print the commands of a "
                              "local deployment. With --algo the model is built and saved to --model first.")
    app.add_argument("directory", help="the app directory to write")
    _add_model_args(app, model_required=True)
    app.set_defaults(func=_user_errors(_cmd_app))
    robust = commands.add_parser("robust", help="FedPG-BR's filter against Flower's Krum, MultiKrum, FedMedian, FedTrimmedAvg",
                                 description="FedPG-BR federations of the gridworld (3 of 8 agents Byzantine) trained through the "
                                 "Flower round with FedPG-BR's filter or a Flower strategy's robust aggregation in its place, "
                                 "under each attack; a markdown table of the exact return of the server's policy.")
    robust.add_argument("--rounds", type=positive_int, default=50, help="rounds per run (default 50)")
    robust.add_argument("--seeds", type=positive_int, default=3, help="seeds per cell (default 3)")
    robust.add_argument("--out", metavar="DIR", help="write robust.md and robust.json here")
    robust.add_argument("--quiet", action="store_true", help="no line per run")
    robust.set_defaults(func=_cmd_robust)
