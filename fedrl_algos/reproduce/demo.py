"""``fedrl demo``: meta-train on the arc, personalize to unseen goals, compare with learning from scratch.

The Per-FedAvg-PG paper's main experiment as a statement over seeds, in seconds on two CPU cores:

1. first-order Per-FedAvg-PG learns a shared initialization on the 6 training goals (the paper's
   K=150 rounds, τ=5, α=1, β=0.2, m_in=m_out=10) with the leave-one-out baseline in its inner step
   and outer gradient, for every seed at once (one batched program,
   :func:`~fedrl_algos.reproduce.neural.meta_train_first_order`, the row of ``fedrl reproduce fewshot
   --adaptation-baseline loo --outer-baseline loo``);
2. one policy-gradient step with that baseline, from 200 trajectories per goal, personalizes each
   seed's initialization to each of the 3 held-out goals (:func:`~fedrl_algos.reproduce.neural.adapt_one_step`);
3. each held-out agent is also trained from a fresh initialization with the same 200 trajectories
   (10 PG steps of 20);
4. a table of held-out return and success over seeds (zero-shot, adapted, from scratch; mean ±
   standard deviation over seeds) and the number of seeds on which adaptation helped.

The batched program is what the library's classes compute, seed by seed: a seed's meta-training
is ``PerFedAvgPG(FastMlpPolicy, "fedrl/ArcNavigation-v0", variant="first_order",
step_size=0.2, m_in=10, m_out=10, adaptation_baseline="loo", outer_baseline="loo", seed=s).learn(total_rounds=150)`` and its
adaptation step is ``model.adapt(heldout_tasks, n_trajectories=200, seed=s)`` (the same numbers,
``tests/test_reproduce_neural.py``). The demo runs that ``adapt`` call for its first seed and draws
the result: ``heldout_rollouts.png``, held-out rollouts before and after adaptation.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from fedrl_envs.validation import check_device

__all__ = [
    "DemoRows",
    "DemoSummary",
    "check_demo_args",
    "conclusion_lines",
    "demo_config",
    "demo_rows",
    "personalize_with_api",
    "report_lines",
    "run_demo",
    "summarize",
]

#: the rows of the demo's table, in order
METHODS = ("zero_shot", "adapted", "from_scratch")
#: trajectories per from-scratch PG step
SCRATCH_BATCH = 20
#: ``--dtype`` choices: the parameters' floating-point type
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def demo_config(rounds: int = 150, adapt_trajectories: int = 200, eval_trajectories: int = 1000):
    """The demo's settings as a :class:`~fedrl_algos.reproduce.neural.FewShotConfig`.

    Meta-training and the held-out step use the leave-one-out baseline (the ``fewshot`` row
    ``--adaptation-baseline loo --outer-baseline loo``); the rollouts run through the torch kernels
    whether or not Numba is installed, so that an optional package does not change the numbers.

    :param rounds: meta-training communication rounds
    :param adapt_trajectories: trajectories per goal of the held-out step, and the from-scratch budget
    :param eval_trajectories: evaluation rollouts per (seed, held-out goal)
    :return: the config
    """
    from fedrl_algos.reproduce.neural import FewShotConfig

    return FewShotConfig(
        rounds=rounds, m_adapt=(adapt_trajectories,), scratch_steps=(max(1, adapt_trajectories // SCRATCH_BATCH),),
        scratch_batch=SCRATCH_BATCH, eval_trajectories=eval_trajectories, adaptation_baseline="loo",
        outer_baseline="loo", kernels="torch", workers=1,
    )


@dataclasses.dataclass(frozen=True)
class DemoRows:
    """The demo's batched results: ``[method, seed, goal]`` rows, methods in :data:`METHODS` order.

    :param seeds: the run seeds ``[R]``
    :param theta_meta: meta-initializations ``[R, d]``
    :param theta: parameters of every row ``[3, R, goals, d]``
    :param returns: discounted held-out return of every row ``[3, R, goals]`` (float64)
    :param success: held-out success rate of every row ``[3, R, goals]`` (float64)
    :param policy: the arc policy they were computed with
    """

    seeds: torch.Tensor
    theta_meta: torch.Tensor
    theta: torch.Tensor
    returns: torch.Tensor
    success: torch.Tensor
    policy: Any


def _adapt_heldout(cfg, policy, seeds: torch.Tensor, theta_meta: torch.Tensor) -> torch.Tensor:
    """One PG step from every seed's meta-initialization on every held-out goal: ``[R, goals, d]``.

    Seed ``s`` draws the trajectories that ``model.adapt(heldout_tasks, n, seed=s)`` draws
    (:func:`~fedrl_algos.common.base_class.adaptation_keys`).
    """
    from fedrl_algos.common.base_class import adaptation_keys
    from fedrl_algos.reproduce.neural import _row_params, adapt_one_step
    from fedrl_envs import ARC_NAVIGATION, RandomStreams, params_to

    heldout, dev = ARC_NAVIGATION.heldout_tasks, policy.theta.device
    n_seeds, n_goals = int(seeds.numel()), len(heldout)
    theta = theta_meta.reshape(1, n_seeds, 1, -1).expand(1, n_seeds, n_goals, -1).contiguous()
    streams = RandomStreams(adaptation_keys(seeds, n_goals).unsqueeze(0), dev)
    params = params_to(_row_params(heldout, n_seeds), dev)
    return adapt_one_step(policy, ARC_NAVIGATION, params, theta, streams, list(cfg.m_adapt), cfg.alpha,
                          cfg.adaptation_baseline)[0]


def _evaluate(cfg, policy, seeds: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Held-out return and success of rows ``theta [3, R, goals, d]`` (``fewshot``'s evaluation streams)."""
    from fedrl_algos.reproduce.neural import _HELDOUT_STREAM, _row_params, evaluate_rows
    from fedrl_envs import ARC_NAVIGATION, RandomStreams, derive_keys, params_to

    n_rows, n_seeds, n_goals = theta.shape[:3]
    keys = derive_keys(seeds.reshape(1, -1, 1), torch.arange(n_goals).reshape(1, 1, -1)
                       + _HELDOUT_STREAM + 4096 + 16 * torch.arange(n_rows).reshape(-1, 1, 1))
    dev = policy.theta.device
    params = params_to(_row_params(ARC_NAVIGATION.heldout_tasks, n_rows * n_seeds), dev)
    return evaluate_rows(ARC_NAVIGATION, params, policy, theta, RandomStreams(keys, dev), cfg.eval_trajectories)


def demo_rows(cfg, seeds: torch.Tensor, device: str = "cpu", dtype: torch.dtype = torch.float32,
              progress: bool = False) -> DemoRows:
    """Meta-train, adapt, train from scratch and evaluate every seed, all seeds batched.

    Python loops run over rounds, local steps and from-scratch steps only; each seed is its own
    batch rows (own random streams), so a seed's numbers do not depend on the others.

    :param cfg: the settings (:func:`demo_config`)
    :param seeds: run seeds ``[R]`` (int64)
    :param device: torch device
    :param dtype: the parameters' floating-point type (float32, or float64 to check rounding)
    :param progress: show meta-training's progress bar (stderr)
    :return: the rows of the table
    """
    from fedrl_algos.reproduce.neural import (
        _train_from_scratch,
        arc_policy,
        cpu_threads,
        fresh_initializations,
        meta_train_first_order,
    )

    with cpu_threads(device, cfg.cpu_threads):  # one intra-op thread on CPU, whatever the caller's setting
        policy = arc_policy(device, dtype=dtype, kernels=cfg.kernels)
        theta_meta = meta_train_first_order(policy, seeds, cfg, progress, "demo: meta-training", cfg.objective,
                                            cfg.adaptation_baseline)  # [R, d]
        adapted = _adapt_heldout(cfg, policy, seeds, theta_meta)  # [R, goals, d]
        scratch = _train_from_scratch(cfg, policy, seeds, fresh_initializations(policy, seeds), False)[-1]
        theta = torch.stack([theta_meta.unsqueeze(1).expand_as(adapted), adapted, scratch])
        returns, success = _evaluate(cfg, policy, seeds, theta)
    return DemoRows(seeds, theta_meta, theta, returns, success, policy)


@dataclasses.dataclass(frozen=True)
class DemoSummary:
    """The demo's table: for each method of :data:`METHODS`, statistics over seeds of the seed's
    3-goal mean (mean and population standard deviation over seeds).

    :param n_seeds: number of seeds
    :param returns: ``{method: (mean, std)}`` of the held-out return
    :param success: ``{method: (mean, std)}`` of the held-out success rate
    :param above_zero_shot: ``{method: seeds whose return is above that seed's zero-shot return}``
    :param per_goal: ``{method: [mean over seeds of goal j's return]}``
    :param lowered_goals: (seed, goal) pairs whose return the adaptation step lowered
    """

    n_seeds: int
    returns: dict[str, tuple[float, float]]
    success: dict[str, tuple[float, float]]
    above_zero_shot: dict[str, int]
    per_goal: dict[str, list[float]]
    lowered_goals: int

    @property
    def adaptation_helps(self) -> bool:
        """The demo's conclusion: the seed-mean return after adaptation is above the zero-shot one."""
        return self.returns["adapted"][0] > self.returns["zero_shot"][0]


def summarize(rows: DemoRows) -> DemoSummary:
    """Reduce the batched rows to the demo's table.

    :param rows: the result of :func:`demo_rows`
    :return: the summary
    """
    from fedrl_algos.reproduce.common import mean_std

    seed_ret, seed_succ = rows.returns.mean(-1), rows.success.mean(-1)  # [3, R]
    return DemoSummary(
        n_seeds=int(rows.seeds.numel()),
        returns={m: mean_std(seed_ret[i]) for i, m in enumerate(METHODS)},
        success={m: mean_std(seed_succ[i]) for i, m in enumerate(METHODS)},
        above_zero_shot={m: int((seed_ret[i] > seed_ret[0]).sum()) for i, m in enumerate(METHODS)},
        per_goal={m: rows.returns[i].mean(0).tolist() for i, m in enumerate(METHODS)},
        lowered_goals=int((rows.returns[1] < rows.returns[0]).sum()),
    )


def personalize_with_api(cfg, theta_meta: torch.Tensor, seed: int, device: str, dtype: torch.dtype) -> list[Any]:
    """One seed's adaptation through the library API: ``PerFedAvgPG`` holding ``theta_meta``, then ``adapt``.

    ``theta_meta`` is what ``model.learn(total_rounds=cfg.rounds)`` computes for this seed (the
    batched meta-training's row, tested); ``adapt`` then draws the trajectories of the batched step.

    :param cfg: the settings (:func:`demo_config`)
    :param theta_meta: the seed's meta-initialization ``[d]``
    :param seed: the seed of the model and of the adaptation trajectories
    :param device: torch device
    :param dtype: the parameters' floating-point type
    :return: the adapted policies, one per held-out goal
    """
    from fedrl_algos import PerFedAvgPG
    from fedrl_algos.policies import FastMlpPolicy
    from fedrl_envs import ARC_NAVIGATION

    model = PerFedAvgPG(
        FastMlpPolicy, "fedrl/ArcNavigation-v0", variant="first_order", alpha=cfg.alpha, step_size=cfg.beta,
        local_steps=cfg.tau, m_in=cfg.m_in, m_out=cfg.m_out, adaptation_baseline=cfg.adaptation_baseline,
        outer_baseline=cfg.outer_baseline, seed=seed, device=device, policy_kwargs=dict(dtype=dtype, kernels=cfg.kernels),
    )
    model.set_parameters({"policy": {"theta": theta_meta}})  # stands for model.learn(total_rounds=cfg.rounds)
    return model.adapt(list(ARC_NAVIGATION.heldout_tasks), n_trajectories=cfg.m_adapt[0], seed=seed)


def _table_lines(summary: DemoSummary, cfg) -> list[str]:
    """The printed table: one line per method, mean ± std over seeds."""
    m, steps = cfg.m_adapt[0], cfg.scratch_steps[0]
    names = {
        "zero_shot": "meta-init, zero-shot",
        "adapted": f"meta-init + 1 PG step ({m} traj., loo)",
        "from_scratch": f"from scratch ({steps} PG steps × {cfg.scratch_batch} = {steps * cfg.scratch_batch} traj.)",
    }
    width = max(len(n) for n in names.values())
    lines = [f"  {'':{width}}  {'return':>13}  {'success':>11}  {'return above zero-shot':>22}"]
    for method, name in names.items():
        (r, r_sd), (s, s_sd) = summary.returns[method], summary.success[method]
        above = "" if method == "zero_shot" else f"{summary.above_zero_shot[method]} of {summary.n_seeds} seeds"
        lines.append(f"  {name:{width}}  {r:6.2f} ± {r_sd:4.2f}  {s:4.0%} ± {s_sd:3.0%}  {above:>22}".rstrip())
    return lines


def report_lines(summary: DemoSummary, cfg) -> list[str]:
    """The printed report: what the numbers are, the table and the conclusion.

    :param summary: the demo's table
    :param cfg: the settings (:func:`demo_config`)
    :return: the lines to print
    """
    intro = (
        f"Held-out goals (never seen in training). A seed's number is its mean over the 3 goals of {cfg.eval_trajectories} "
        f"evaluation rollouts per goal; the table gives the mean ± standard deviation over the {summary.n_seeds} seeds. "
        "Return: discounted (γ=0.9) count of steps in the goal region; success: share of episodes that enter it."
    )
    return [*textwrap.wrap(intro, width=110), *_table_lines(summary, cfg), "", *conclusion_lines(summary, cfg)]


def conclusion_lines(summary: DemoSummary, cfg) -> list[str]:
    """The printed conclusion, computed from ``summary`` (it says so when adaptation did not help).

    :param summary: the demo's table
    :param cfg: the settings (:func:`demo_config`)
    :return: the lines to print
    """
    zero, adapted, scratch = (summary.returns[k][0] for k in METHODS)
    n, k = summary.n_seeds, summary.above_zero_shot["adapted"]
    m = cfg.m_adapt[0]
    verdict = "" if summary.adaptation_helps else ", not above zero-shot: on this run adaptation did not help on the mean"
    goals = "; ".join(f"goal {j} {a:.2f} -> {b:.2f}" for j, (a, b) in
                      enumerate(zip(summary.per_goal["zero_shot"], summary.per_goal["adapted"], strict=True)))
    text = (
        f"Adaptation helped on {k} of {n} seeds: one policy-gradient step from {m} trajectories per goal takes the "
        f"seed-mean held-out return from {zero:.2f} (zero-shot) to {adapted:.2f}{verdict}; "
        f"training from scratch with the same {m} trajectories reaches {scratch:.2f}. Per goal (mean over seeds): {goals}; "
        f"the step lowered {summary.lowered_goals} of {n * len(summary.per_goal['adapted'])} (seed, goal) returns."
    )
    return textwrap.wrap(text, width=110, break_on_hyphens=False)


def _api_lines(adapted: torch.Tensor, batched: torch.Tensor, seed: int, m: int) -> list[str]:
    """The lines that compare ``model.adapt``'s parameters ``[goals, d]`` with the batched step's for one seed."""
    diff = float((adapted.to(batched.device) - batched).abs().max())
    same = "bitwise the batched step's parameters" if diff == 0 else f"max |Δθ| = {diff:.1e} from the batched step"
    text = f"Seed {seed} through the library API, PerFedAvgPG(...).adapt(heldout_tasks, n_trajectories={m}, seed={seed}): {same}."
    return textwrap.wrap(text, width=110, break_on_hyphens=False)


def _draw(rows: DemoRows, adapted_theta: torch.Tensor, cfg, n_drawn: int, out: Path, seed: int) -> Path:
    """Draw ``n_drawn`` held-out rollouts of the first seed before and after adaptation (same random numbers)."""
    from fedrl_algos.reproduce.neural import _HELDOUT_STREAM, episode_success, fast_rollout
    from fedrl_algos.reproduce.plots.neural import draw_arc_rollouts
    from fedrl_envs import ARC_NAVIGATION, RandomStreams, derive_keys, index_params, params_to, stack_params

    heldout, policy = ARC_NAVIGATION.heldout_tasks, rows.policy
    n_goals, dev = len(heldout), policy.theta.device
    theta = torch.stack([rows.theta[0, 0], adapted_theta.to(dev)])  # [2, goals, d]
    params = params_to(index_params(stack_params(list(heldout)), torch.arange(n_goals).repeat(2)), dev)
    keys = derive_keys(seed, torch.arange(n_goals).reshape(1, n_goals).expand(2, n_goals) + _HELDOUT_STREAM + 8192)
    traj = fast_rollout(ARC_NAVIGATION, params, policy, theta, RandomStreams(keys, dev), n_drawn)
    success = episode_success(ARC_NAVIGATION, dataclasses.replace(params, goal=params.goal.reshape(2, n_goals, 2)), traj)
    out.mkdir(parents=True, exist_ok=True)
    drawn = {
        "positions": traj.obs.cpu().tolist(), "success": success.cpu().tolist(),
        "goals": [t.goal.tolist() for t in heldout], "train_goals": [t.goal.tolist() for t in ARC_NAVIGATION.train_tasks],
        "radius": float(heldout[0].goal_radius), "m_adapt": cfg.m_adapt[0],
        # the table's success rates of this seed next to the drawn rollouts' count
        "eval_success": rows.success[:2, 0].cpu().tolist(), "eval_trajectories": cfg.eval_trajectories,
    }
    titles = [f"seed {seed}, zero-shot (meta-init)", f"seed {seed}, after one PG step of {cfg.m_adapt[0]} traj."]
    return draw_arc_rollouts(drawn, out / "heldout_rollouts.png", titles)


def check_demo_args(rounds: int = 150, seeds: int = 10, seed: int = 0, adapt_trajectories: int = 200,
                    eval_trajectories: int = 1000, n_drawn: int = 12, dtype: str | torch.dtype = "float32") -> torch.dtype:
    """Validate :func:`run_demo`'s arguments (``ValueError`` naming the bad one); returns the dtype.

    :param rounds: ≥ 1
    :param seeds: ≥ 1
    :param seed: ≥ 0, with ``seed + seeds ≤ 2**63``
    :param adapt_trajectories: ≥ 2 (the leave-one-out baseline needs another trajectory)
    :param eval_trajectories: ≥ 1
    :param n_drawn: ≥ 1
    :param dtype: ``"float32"``, ``"float64"`` or that torch dtype
    """
    from fedrl_envs.validation import check_int

    check_int("rounds", rounds, 1)
    check_int("seeds", seeds, 1)
    check_int("seed", seed, 0, 2**63 - seeds)
    check_int("adapt_trajectories", adapt_trajectories, 2)
    check_int("eval_trajectories", eval_trajectories, 1)
    check_int("n_drawn", n_drawn, 1)
    resolved = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if resolved not in DTYPES.values():
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return resolved


def run_demo(
    rounds: int = 150,
    seeds: int = 10,
    seed: int = 0,
    device: str = "cpu",
    out: str | Path = "fedrl-demo",
    adapt_trajectories: int = 200,
    eval_trajectories: int = 1000,
    n_drawn: int = 12,
    dtype: str | torch.dtype = "float32",
    progress_bar: bool = True,
    verbose: bool = True,
) -> DemoSummary:
    """Run the demo; returns its table and writes ``out/heldout_rollouts.png``.

    :param rounds: meta-training communication rounds
    :param seeds: number of seeds, all trained in one batch
    :param seed: the first seed: the seeds are ``seed, ..., seed + seeds - 1``; the figure draws ``seed``
    :param device: torch device (``"cpu"``, ``"cuda"``, ``"auto"``)
    :param out: output directory
    :param adapt_trajectories: trajectories per goal of the adaptation step (and the from-scratch budget)
    :param eval_trajectories: evaluation rollouts per (seed, held-out goal)
    :param n_drawn: rollouts drawn per goal in the figure
    :param dtype: the parameters' floating-point type, ``"float32"`` or ``"float64"``
    :param progress_bar: show meta-training's progress bar (stderr)
    :param verbose: print the table (stdout)
    :return: the table (:class:`DemoSummary`)
    """
    from fedrl_algos.reproduce.neural import cpu_threads

    torch_dtype = check_demo_args(rounds, seeds, seed, adapt_trajectories, eval_trajectories, n_drawn, dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(check_device(device))
    say = print if verbose else (lambda *a, **k: None)
    start = time.perf_counter()
    cfg = demo_config(rounds, adapt_trajectories, eval_trajectories)
    seed_t = torch.arange(seed, seed + seeds, dtype=torch.int64)
    say(f"Meta-training first-order Per-FedAvg-PG with leave-one-out baselines on the 6 training goals: "
        f"{seeds} seed{'s' if seeds > 1 else ''} ({seed}..{seed + seeds - 1}) in one batch, {rounds} rounds ({device}, "
        f"{str(torch_dtype).removeprefix('torch.')})")
    with cpu_threads(device, cfg.cpu_threads):
        rows = demo_rows(cfg, seed_t, device, torch_dtype, progress_bar)
        compute_time = time.perf_counter() - start
        adapted = personalize_with_api(cfg, rows.theta_meta[0], seed, device, torch_dtype)
        adapted_theta = torch.stack([p.theta.detach() for p in adapted])
        path = _draw(rows, adapted_theta, cfg, n_drawn, Path(out), seed)
    summary = summarize(rows)
    for line in ["", *report_lines(summary, cfg), "", *_api_lines(adapted_theta, rows.theta[1, 0], seed, adapt_trajectories)]:
        say(line)
    say(f"Held-out rollouts of seed {seed} before/after adaptation: {path}")
    say(f"Batched program of all seeds {compute_time:.1f} s, total {time.perf_counter() - start:.1f} s.")
    return summary
