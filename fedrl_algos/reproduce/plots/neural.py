"""Figures of the arc-navigation experiments (:mod:`fedrl_algos.reproduce.neural`): figure 2, figure 7
and figure 8, and :func:`draw_arc_rollouts`, which ``fedrl demo`` draws with too.

``curvature`` and ``rollouts`` draw from the records of ``results.json``; ``fewshot`` from the seed
means and spreads the experiment computes for its table (:meth:`FewShotExperiment.plot
<fedrl_algos.reproduce.neural.FewShotExperiment.plot>`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedrl_algos.reproduce.common import median
from fedrl_algos.reproduce.parallel import run_forked
from fedrl_algos.reproduce.plots import pyplot, save
from fedrl_envs import ARC_NAVIGATION

__all__ = ["curvature_figures", "fewshot_figures", "rollouts_figures", "draw_arc_rollouts"]


def curvature_figures(records: list[dict[str, Any]], out_dir: Path, paper: Mapping[int, float]) -> list[Path]:
    """Figure 2 (left): each seed's final post-adaptation return and the median per Hessian batch m_h,
    the first-order reference beside them (``curvature.png``); the median against rounds
    (``curvature_curves.png``). With several curvature estimators (records with ``estimator``) each has
    its colour.

    :param records: the ``curvature`` records
    :param out_dir: where the PNGs go
    :param paper: the paper's median by m_h (drawn as crosses)
    """
    plt = pyplot()
    final_round = max(r["round"] for r in records)
    final = [r for r in records if r["round"] == final_round]
    m_hs = sorted({r["m_h"] for r in final if r["m_h"] is not None})
    # records of a run with several estimators carry "estimator"; the default run has none (paper)
    estimators = list(dict.fromkeys(r.get("estimator") or "paper" for r in final if r["m_h"] is not None))
    colors = {"paper": "tab:blue", "causal": "tab:purple", "lvc": "tab:orange"}
    width = 0.6 / max(1, len(estimators))

    def of(recs, estimator, m_h):
        return [r for r in recs if r["m_h"] == m_h and (r.get("estimator") or "paper") == estimator]

    fig, ax = plt.subplots(figsize=(5.2 + 0.6 * (len(estimators) - 1), 3.6 + 0.6 * (len(estimators) > 1)))
    gen = torch.Generator().manual_seed(0)
    for k, estimator in enumerate(estimators):
        offset = (k - (len(estimators) - 1) / 2) * width
        color = colors.get(estimator, "tab:blue")
        for i, m_h in enumerate(m_hs):
            vals = [r["return"] for r in of(final, estimator, m_h)]
            if not vals:
                continue
            jitter = (torch.rand(len(vals), generator=gen) - 0.5) * 0.3 * min(1.0, width / 0.6)
            ax.scatter([i + offset + float(j) for j in jitter], vals, s=14, color=color, alpha=0.6, zorder=2,
                       label=f"{estimator} curvature (seeds)" if i == 0 and len(estimators) > 1 else None)
            ax.scatter([i + offset], [median(vals)], s=90, marker="_", color="black", linewidths=2.5, zorder=3)
    paper_x = [i for i, m_h in enumerate(m_hs) if m_h in paper]
    ax.scatter(paper_x, [paper[m_hs[i]] for i in paper_x], s=40, marker="x", color="tab:red", zorder=4,
               label="paper median (eq. (3))")
    fo = [r["return"] for r in final if r["m_h"] is None]
    if fo:
        med = median(fo)
        ax.axhline(med, color="tab:green", ls="--", lw=1.2, label=f"first-order reference (median {med:.2f})")
        ax.scatter([len(m_hs) + float(j) for j in (torch.rand(len(fo), generator=gen) - 0.5) * 0.3], fo,
                   s=14, color="tab:green", alpha=0.6)
    ax.set_xticks(list(range(len(m_hs))) + ([len(m_hs)] if fo else []))
    ax.set_xticklabels([str(m) for m in m_hs] + (["FO"] if fo else []))
    ax.set_xlabel("Hessian batch $m_h$")
    ax.set_ylabel("post-adaptation return (training goals)")
    ax.set_title("Curvature bottleneck: medians (—) and seeds (•)")
    if len(estimators) > 1:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=7)
    else:
        ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    path = save(fig, out_dir / "curvature.png", dpi=130)
    # learning curves: median over seeds of the post-adaptation return against rounds
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    cmap = plt.get_cmap("viridis")
    # one estimator: colour by m_h (the paper's figure); several: colour by estimator, line style by m_h
    dashes = ["-", "-.", ":", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1))]
    curves_of = [(e, m_h) for e in estimators for m_h in m_hs] + [(None, None)]
    for estimator, m_h in curves_of:
        recs = [r for r in records if r["m_h"] is None] if m_h is None else of(records, estimator, m_h)
        rounds = sorted({r["round"] for r in recs})
        if not rounds:
            continue
        med = [median([r["return"] for r in recs if r["round"] == k]) for k in rounds]
        if m_h is None:
            style = dict(color="tab:green", ls="--", label="first order")
        else:
            i = m_hs.index(m_h)
            if len(estimators) == 1:
                style = dict(color=cmap(i / max(1, len(m_hs) - 1)), label=f"exact, $m_h$={m_h}")
            else:
                style = dict(color=colors.get(estimator, "tab:blue"), ls=dashes[i % len(dashes)],
                             label=f"{estimator}, $m_h$={m_h}")
        ax.plot(rounds, med, marker="o", ms=3, **style)
    ax.set_xlabel("communication round")
    ax.set_ylabel("median post-adaptation return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    curves = save(fig, out_dir / "curvature_curves.png", dpi=130)
    return [path, curves]


def fewshot_figures(summary: Mapping[str, Mapping[str, Sequence[tuple[int, float, float]]]], out_dir: Path,
                    paper: Mapping[str, Sequence[tuple[int, float]]], workers: int = 1) -> list[Path]:
    """Figure 2 (right) and figure 7: held-out return (``fewshot_return.png``) and success rate
    (``fewshot_success.png``) against the adaptation trajectories, meta-initialization + one PG step
    against training from scratch, with the random policy's level.

    :param summary: by metric (``"return"``, ``"success"``), by method (``"meta_init"``,
        ``"from_scratch"``, ``"random"``), ``(trajectories, mean, std)`` over seeds at each budget
    :param out_dir: where the PNGs go
    :param paper: by metric, the paper's reported ``(trajectories, value)`` points (drawn as crosses)
    :param workers: with ``workers > 1`` the second figure is drawn in a forked child
        (:func:`~fedrl_algos.reproduce.parallel.run_forked`)
    """
    plt = pyplot()

    def figure(metric: str, fname: str, ylabel: str) -> Path:
        fig, ax = plt.subplots(figsize=(5.4, 3.6))
        for method, color, label in (("meta_init", "tab:blue", "meta-init + one PG step"),
                                     ("from_scratch", "tab:orange", "from scratch (PG, batch 20)")):
            points = summary[metric][method]
            xs = [x for x, _, _ in points]
            mean = torch.tensor([m for _, m, _ in points])
            std = torch.tensor([sd for _, _, sd in points])
            ax.plot(xs, mean, marker="o", color=color, label=label)
            ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.2)
        rnd = summary[metric]["random"][0][1]
        ax.axhline(rnd, color="gray", ls=":", label=f"random policy ({rnd:.2f})")
        points = paper[metric]
        ax.scatter([x for x, _ in points], [y for _, y in points], marker="x", s=40, color="black", zorder=4,
                   label="paper (reported values)")
        ax.set_xscale("symlog", linthresh=20)
        ticks = [0, 20, 50, 100, 200, 500, 1000, 2000, 4000]
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks], fontsize=7)
        ax.set_xlim(-2, 4600)
        ax.set_xlabel("adaptation trajectories on the held-out agent")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return save(fig, out_dir / fname, dpi=130)

    return run_forked([functools.partial(figure, "return", "fewshot_return.png", "held-out return (γ=0.9)"),
                       functools.partial(figure, "success", "fewshot_success.png", "held-out success rate")], workers)


def rollouts_figures(records: list[dict[str, Any]], settings: dict[str, Any], out_dir: Path) -> list[Path]:
    """Figure 8: the drawn held-out rollouts of the ``rollouts`` records (those with ``drawn``), before
    and after the adaptation step (``rollouts.png``, :func:`draw_arc_rollouts`); each panel also gives
    the drawn seed's evaluated success rate when ``settings`` has ``eval_trajectories``.

    :param records: the ``rollouts`` records
    :param settings: the run's settings
    :param out_dir: where the PNG goes
    """
    drawn = [r for r in records if "drawn" in r]
    counts = sorted({r["m_adapt"] for r in drawn})
    goals = sorted({r["goal"] for r in drawn})
    n = max(r["drawn"] for r in drawn) + 1
    pos = [[[None] * n for _ in goals] for _ in counts]
    ok = [[[False] * n for _ in goals] for _ in counts]
    for r in drawn:
        c = counts.index(r["m_adapt"])
        pos[c][r["goal"]][r["drawn"]] = r["path"]
        ok[c][r["goal"]][r["drawn"]] = bool(r["success"])
    heldout, train = ARC_NAVIGATION.heldout_tasks, ARC_NAVIGATION.train_tasks
    info = {
        "positions": pos,
        "success": ok,
        "goals": [t.goal.tolist() for t in heldout],
        "train_goals": [t.goal.tolist() for t in train],
        "radius": float(heldout[0].goal_radius),
        "m_adapt": counts[-1],
    }
    # the table's success rates of the drawn seed, so that each panel also shows the evaluation count
    evaluated = [r for r in records if "drawn" not in r and r["seed"] == 0]
    if "eval_trajectories" in settings and len(evaluated) == len(counts) * len(goals):
        rate = {(r["m_adapt"], r["goal"]): r["success"] for r in evaluated}
        info["eval_success"] = [[rate[m, j] for j in goals] for m in counts]
        info["eval_trajectories"] = settings["eval_trajectories"]
    path = out_dir / "rollouts.png"
    draw_arc_rollouts(info, path)
    return [path]


def draw_arc_rollouts(drawn: dict[str, Any], path: Path, titles: Sequence[str] | None = None) -> Path:
    """Draw held-out rollouts before (top row) and after adaptation (bottom row), one column per goal.

    Each panel's title counts the drawn rollouts that reach the goal region (``k of n drawn``)
    and, when ``drawn`` has ``eval_success``, the success rate over the evaluation rollouts of the
    printed table, so that the panel and the table are not read as the same count.

    :param drawn: ``positions`` ``[2, goals, n, T, 2]``, ``success`` ``[2, goals, n]``, ``goals``,
        ``train_goals``, ``radius`` and ``m_adapt``; optionally ``eval_success`` ``[2, goals]``
        (success rates) with ``eval_trajectories`` (the rollouts they are counted over)
    :param path: the PNG to write
    :param titles: the two rows' titles (default: zero-shot, after one PG step of ``m_adapt`` traj.)
    :return: ``path``
    """
    plt = pyplot()
    from matplotlib.patches import Circle

    pos = torch.tensor(drawn["positions"])
    success = torch.tensor(drawn["success"])
    n_phase, n_goals, n_drawn = pos.shape[0], pos.shape[1], pos.shape[2]
    eval_success = drawn.get("eval_success")
    fig, axes = plt.subplots(n_phase, n_goals, figsize=(3.2 * n_goals, 3.3 * n_phase), squeeze=False)
    arc = torch.linspace(-0.5, 0.5, 100)
    titles = titles or ["zero-shot (meta-init)", f"after one PG step of {drawn['m_adapt']} traj."]
    ticks = [-1.0, -0.5, 0.0, 0.5, 1.0]
    for p in range(n_phase):
        for j in range(n_goals):
            ax = axes[p][j]
            ax.plot(0.8 * torch.cos(arc), 0.8 * torch.sin(arc), color="0.6", lw=1, ls="--")
            for g in drawn["train_goals"]:
                ax.scatter(g[0], g[1], s=30, marker="+", color="0.35", zorder=2)
            ax.add_patch(Circle(drawn["goals"][j], drawn["radius"], color="tab:green", alpha=0.35, zorder=1))
            for k in range(n_drawn):
                xy = pos[p, j, k]
                color = "tab:blue" if bool(success[p, j, k]) else "tab:red"
                ax.plot(xy[:, 0], xy[:, 1], color=color, lw=1.0, alpha=0.75)
                ax.scatter(xy[0, 0], xy[0, 1], s=12, color=color, marker="o", zorder=3)
                ax.scatter(xy[-1, 0], xy[-1, 1], s=16, color=color, marker="x", zorder=3)
            ax.set_xlim(-1.02, 1.02)
            ax.set_ylim(-1.02, 1.02)
            ax.set_aspect("equal")
            # the arena's own coordinates: the box [-1, 1]² in which positions live
            ax.set_xticks(ticks)
            ax.set_yticks(ticks)
            ax.tick_params(labelsize=6)
            ax.set_xlabel("x (arena units)", fontsize=7)
            ax.set_ylabel("y (arena units)", fontsize=7)
            ax.grid(alpha=0.15)
            reached = int(success[p, j].sum())
            count = f"{reached} of {n_drawn} drawn rollouts reach the goal"
            if eval_success is not None:
                count += f"\n{float(eval_success[p][j]):.0%} of {drawn['eval_trajectories']} evaluation rollouts"
            ax.set_title(f"held-out goal {j}: {titles[p]}\n{count}", fontsize=7)
    fig.text(0.5, 0.005, "• start, × last position; blue: reaches the goal region, red: does not; "
             "+: training goals; green disc: the held-out goal region", ha="center", fontsize=7)
    return save(fig, path, rect=(0, 0.03, 1, 1))
