"""``fedrl plot``: redraw a ``fedrl train`` run's learning curve, or overlay several runs, with a summary table.

The work is :func:`fedrl_algos.zoo.plot_runs`.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _cmd_plot(args: argparse.Namespace) -> int:
    from fedrl_algos.zoo import TrainConfigError, plot_runs

    try:
        result = plot_runs(args.run_dirs, out=args.out, key=args.key, per_agent=args.per_agent, x=args.x, labels=args.labels)
    except TrainConfigError as err:
        args.parser.error(str(err))
    print(result.table)
    print(f"wrote {result.figure}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl plot`` to the ``fedrl`` parser."""
    plot = subparsers.add_parser(
        "plot",
        help="draw or overlay the learning curves of fedrl train runs, with a table of their final returns",
        description="Draw the learning curve of one fedrl train run directory (mean +- standard error over its seeds) or "
        "overlay several runs, e.g. different algorithms on one federation, in one figure with a legend; print the final "
        "evaluation return of each run per agent (mean +- s.e. over seeds). Reads OUT/config.json and "
        "OUT/seed_<k>/progress.csv.",
    )
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by fedrl train")
    plot.add_argument("--key", default="eval/return",
                      help="the progress.csv column to draw (default eval/return, the deployed policy's return averaged "
                      "over agents; its adapted counterpart eval/adapted_return is drawn dashed where logged)")
    plot.add_argument("--per-agent", action="store_true", help="also each agent's curve (mean over seeds), where logged")
    plot.add_argument("--x", choices=("steps", "rounds"), default="steps",
                      help="x axis: environment steps summed over agents (default) or communication rounds")
    plot.add_argument("--out", metavar="PNG", help="the figure (default: RUN_DIR/learning_curve.png for one run, "
                      "learning_curves.png here for several)")
    plot.add_argument("--labels", nargs="+", metavar="LABEL", help="legend labels, one per run (default: the directory names)")
    plot.set_defaults(func=_cmd_plot, parser=plot)
