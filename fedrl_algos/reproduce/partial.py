"""Partial participation on the tabular gridworld: client sampling, with and without SCAFFOLD.

Not an experiment of the Per-FedAvg-PG paper (all its runs use full participation); its conclusion
names client sampling with a control-variate correction as future work. ``partial`` trains the
paper's tabular configuration (8-agent 5 × 5 gridworld, K = 80 rounds of τ = 5 local steps, α = 2,
β = 0.3, m_in = m_h = m_out = 10; the ``personalization`` experiment's protocol) with

* ``r = n`` (full participation) and ``r = n/4`` agents sampled per round without replacement,
* without and with SCAFFOLD's control variates (:mod:`fedrl_algos.core.control_variates`),

and reports the exact F(θ^K) (:class:`~fedrl_algos.core.exact.TabularEvaluator`, every round), F at a
matched total-trajectory budget, and the wall time per round. At ``r < n`` only the sampled agents
are computed (:meth:`~fedrl_algos.core.federation.Federation.local_round`); the timing section also
runs the previous masked path (every agent computed, the others masked out of the average) for
comparison, on one intra-op thread.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import torch

from fedrl_algos.core.aggregation import aggregate_valid
from fedrl_algos.core.control_variates import ControlVariates
from fedrl_algos.core.directions import GradientEstimator, local_update
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.core.federation import Federation
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import TabularPolicy
from fedrl_algos.reproduce.common import (
    Experiment,
    ExperimentOutput,
    TableRow,
    WallTimeEstimate,
    linear_estimate,
    mean_std,
    progress_bar,
)
from fedrl_algos.reproduce.plots.partial import partial_figures
from fedrl_algos.reproduce.tabular import (
    CPU_THREADS,
    LABELS,
    METHODS,
    TRAIN_DTYPE,
    TabularConfig,
    _estimator,
    _evaluate,
    _seed_list,
)
from fedrl_envs import GRIDWORLD, params_to, stack_params
from fedrl_envs.threads import intra_op_threads

__all__ = ["PartialConfig", "PartialExperiment", "train_partial", "time_rounds"]

#: the participation settings' display names
PATHS = ("full", "subset", "masked")


@dataclass(frozen=True)
class PartialConfig(TabularConfig):
    """``partial``: the tabular configuration at full and at ``n / fraction`` participation, with and
    without control variates."""

    alpha: float = 2.0
    """α, step size of the adaptation step (training and evaluation)"""
    methods: tuple[str, ...] = METHODS
    """the methods to train, a subset of ``exact``, ``first_order``, ``fedavg``"""
    fraction: int = 4
    """agents per round r = n / fraction (n = 8 agents: r = 2)"""
    control_variates: tuple[bool, ...] = (False, True)
    """train without and/or with SCAFFOLD's control variates"""
    timing_agents: tuple[int, ...] = (8, 32, 128)
    """federation sizes n of the wall-time section (the gridworld's 8 goals, repeated for n > 8)"""
    timing_rounds: int = 30
    """rounds timed per timing setting and path (the median is reported; one warm-up round before)"""
    timing_method: str = "exact"
    """the method of the wall-time section"""
    train_dtype: str = str(TRAIN_DTYPE).replace("torch.", "")
    """dtype of the training program (the exact evaluation is always float64)"""
    cpu_threads: int = CPU_THREADS
    """intra-op threads on CPU (wall times are measured on this many)"""

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {self.methods!r}")
        if self.timing_method not in METHODS:
            raise ValueError(f"timing_method must be one of {METHODS}, got {self.timing_method!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, int) or not 1 <= self.fraction <= len(GRIDWORLD.train_tasks):
            raise ValueError(f"fraction must be an int in [1, {len(GRIDWORLD.train_tasks)}], got {self.fraction!r}")
        if not self.control_variates or any(not isinstance(c, bool) for c in self.control_variates):
            raise ValueError(f"control_variates must be a non-empty tuple of bools, got {self.control_variates!r}")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < self.fraction for n in self.timing_agents):
            raise ValueError(f"timing_agents must be ints >= fraction ({self.fraction}), got {self.timing_agents!r}")
        if isinstance(self.timing_rounds, bool) or not isinstance(self.timing_rounds, int) or self.timing_rounds < 1:
            raise ValueError(f"timing_rounds must be a positive int, got {self.timing_rounds!r}")
        if not isinstance(getattr(torch, self.train_dtype, None), torch.dtype):
            raise ValueError(f"train_dtype must name a torch dtype (e.g. 'float32'), got {self.train_dtype!r}")

    def quick(self) -> Self:
        """The smoke version: 4 rounds of 2 local steps, 2 timed rounds of the 8-agent federation."""
        return dataclasses.replace(self, rounds=4, tau=2, timing_agents=(8,), timing_rounds=2)

    @property
    def dtype(self) -> torch.dtype:
        """:attr:`train_dtype` as a torch dtype."""
        return getattr(torch, self.train_dtype)


def _policy(dtype: torch.dtype, device: torch.device) -> TabularPolicy:
    task = GRIDWORLD.train_tasks[0]
    return TabularPolicy(GRIDWORLD.observation_space(task), GRIDWORLD.action_space(task), dtype=dtype).to(device)


def _masked_round(federation: Federation, theta: torch.Tensor, estimator: GradientEstimator, beta: float, tau: int,
                  agents_per_round: int) -> torch.Tensor:
    """The previous client sampling: every agent computed, the unsampled ones masked out of the average."""

    def steps(sampler: Any, start: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return local_update(estimator, sampler, start, beta, tau)

    local, mask = federation.local_round(theta, steps, agents_per_round, per_agent_state=True)
    return aggregate_valid(local, theta, mask)[0]


def train_partial(seeds: list[int], cfg: PartialConfig, device: str | torch.device = "cpu", progress: bool = False) -> list[dict[str, Any]]:
    """Train every (method, r, control variates) on all seeds as one batched program each; the
    exact F and f at every round and the wall time of every round.

    :return: one dict per setting: ``method``, ``agents_per_round``, ``control_variates``, ``F`` and
        ``f`` ``[K + 1, seeds]`` (float64), ``round_s`` (wall seconds of each round), ``words``
        (random words the agents' streams drew, all runs)
    """
    device = torch.device(device)
    n = len(GRIDWORLD.train_tasks)
    params = params_to(stack_params(GRIDWORLD.train_tasks), device)
    policy = _policy(cfg.dtype, device)
    settings = [(m, r, c) for m in cfg.methods for r in (n, n // cfg.fraction) for c in cfg.control_variates]
    evaluator = TabularEvaluator(GRIDWORLD, gamma=cfg.gamma, device=device)
    bar = progress_bar(cfg.rounds * len(settings), progress, "partial", unit="round")
    out = []
    for method, r, cv in settings:
        federation = Federation(GRIDWORLD, params, policy, torch.tensor(seeds), gamma=cfg.gamma)
        estimator = _estimator(method, policy, cfg, cfg.alpha)
        theta = torch.zeros(len(seeds), policy.n_params, dtype=cfg.dtype, device=device)
        control = ControlVariates.zeros(len(seeds), n, policy.n_params, cfg.dtype, device) if cv else None
        history, times = [theta], []
        for _ in range(cfg.rounds):
            start = time.perf_counter()
            theta, _ = per_fedavg_pg_round(federation, theta, estimator, cfg.beta, cfg.tau, None if r == n else r, control=control)
            times.append(time.perf_counter() - start)
            history.append(theta)
            if bar is not None:
                bar.set_postfix_str(f"{method} r={r}{' +cv' if cv else ''}", refresh=False)
                bar.update(1)
        big_f, small_f = _evaluate(evaluator, torch.stack(history).to(torch.float64), cfg.alpha)  # [K+1, seeds]
        out.append({"method": method, "agents_per_round": r, "control_variates": cv, "F": big_f.cpu(), "f": small_f.cpu(),
                    "round_s": times, "words": int(federation.streams.counters.sum())})
    if bar is not None:
        bar.close()
    return out


def time_rounds(n_agents: int, n_runs: int, cfg: PartialConfig, device: str | torch.device = "cpu") -> dict[str, dict[str, list[float]]]:
    """Seconds per round of ``n_runs`` runs of an ``n_agents``-agent gridworld federation on each
    path of :data:`PATHS`: ``"full"`` (r = n), ``"subset"`` (r = n/fraction, only the sampled agents
    computed) and ``"masked"`` (r = n/fraction, every agent computed, the previous path).

    The paths take their rounds in turn (the order rotating every round) after one warm-up round
    each, so that a change of the machine's load falls on all of them alike.

    :return: by path, ``wall`` and ``cpu`` (this thread's CPU time) seconds of each of ``cfg.timing_rounds`` rounds
    """
    device = torch.device(device)
    tasks = [GRIDWORLD.train_tasks[i % len(GRIDWORLD.train_tasks)] for i in range(n_agents)]
    policy = _policy(cfg.dtype, device)
    params = params_to(stack_params(tasks), device)
    estimator = _estimator(cfg.timing_method, policy, cfg, cfg.alpha)
    r = n_agents // cfg.fraction
    federations = {path: Federation(GRIDWORLD, params, policy, torch.arange(n_runs), gamma=cfg.gamma) for path in PATHS}
    thetas = {path: torch.zeros(n_runs, policy.n_params, dtype=cfg.dtype, device=device) for path in PATHS}
    times: dict[str, dict[str, list[float]]] = {path: {"wall": [], "cpu": []} for path in PATHS}
    for k in range(cfg.timing_rounds + 1):
        for j in range(len(PATHS)):
            path = PATHS[(j + k) % len(PATHS)]
            federation, theta = federations[path], thetas[path]
            wall, cpu = time.perf_counter(), time.thread_time()
            if path == "masked":
                theta = _masked_round(federation, theta, estimator, cfg.beta, cfg.tau, r)
            else:
                theta, _ = per_fedavg_pg_round(federation, theta, estimator, cfg.beta, cfg.tau, None if path == "full" else r)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            thetas[path] = theta
            if k > 0:
                times[path]["wall"].append(wall)
                times[path]["cpu"].append(cpu)
    return times


def _label(r: int, n: int, cv: bool) -> str:
    part = "full participation (r = n)" if r == n else f"r = n/{n // r} = {r}"
    return part + (", SCAFFOLD" if cv else "")


class PartialExperiment(Experiment):
    """Client sampling at r = n/4 against full participation, with and without control variates."""

    name = "partial"
    description = "tabular partial participation: F and wall time per round at r = n/4 vs n, with/without SCAFFOLD (beyond the paper)"
    paper_reference = ("no figure of the paper (its runs use full participation; its conclusion names client sampling with "
                       "control variates as future work); the protocol of section 7's tabular experiments")
    config_class = PartialConfig

    def estimate_wall_time(self, config: PartialConfig, seeds: int) -> WallTimeEstimate:
        # docs/reproduction.md: 80 s wall for 10 seeds, 80 rounds, 3 methods × 2 r × 2 control settings
        # (and the timing section at n = 8, 32, 128), on 2 busy cores
        settings = len(config.methods) * 2 * len(config.control_variates)
        return linear_estimate(self.name, 80.0, {"seeds": (seeds, 10), "rounds": (config.rounds, 80), "settings": (settings, 12)},
                               "docs/reproduction.md")

    def run(self, config: PartialConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        cfg, seed_list = config, _seed_list(seeds)
        n = len(GRIDWORLD.train_tasks)
        r_small = n // cfg.fraction
        threads = cfg.cpu_threads if torch.device(device).type == "cpu" else None
        with intra_op_threads(threads):
            results = train_partial(seed_list, cfg, device, progress)
            timing = [(na, runs, path, t) for na in cfg.timing_agents for runs in sorted({1, len(seed_list)})
                      for path, t in time_rounds(na, runs, cfg, device).items()]
        per_step = cfg.trajectories_per_step
        records: list[dict[str, Any]] = []
        for res in results:
            r = res["agents_per_round"]
            per_round = cfg.tau * per_step(res["method"])
            for k in range(cfg.rounds + 1):
                for s, seed in enumerate(seed_list):
                    records.append({"experiment": self.name, "kind": "curve", "method": res["method"], "seed": seed, "alpha": cfg.alpha,
                                    "agents_per_round": r, "control_variates": res["control_variates"], "round": k,
                                    "trajectories": k * per_round * r / n, "trajectories_total": k * per_round * r,
                                    "F": float(res["F"][k, s]), "f": float(res["f"][k, s])})
        for na, runs, path, times in timing:
            records.append({"experiment": self.name, "kind": "timing", "method": cfg.timing_method, "n_agents": na, "runs": runs,
                            "path": path, "agents_per_round": na if path == "full" else na // cfg.fraction,
                            "round_s_median": statistics.median(times["wall"]), "round_s": times["wall"],
                            "round_cpu_s_median": statistics.median(times["cpu"]), "round_cpu_s": times["cpu"]})
        table: list[TableRow] = []
        by_key = {(res["method"], res["agents_per_round"], res["control_variates"]): res for res in results}
        for res in results:
            m, r, cv = res["method"], res["agents_per_round"], res["control_variates"]
            table.append(TableRow(f"F after K={cfg.rounds} rounds, {LABELS[m]}, {_label(r, n, cv)}", None, *mean_std(res["F"][-1]),
                                  f"wall time per round {1e3 * statistics.median(res['round_s']):.1f} ms ({len(seed_list)} seeds batched)"))
        # Equal total trajectories: full participation after K·r/n rounds spends what r agents spend in K rounds.
        k_match = cfg.rounds * r_small // n
        for m in cfg.methods:
            for cv in cfg.control_variates:
                if (m, n, cv) in by_key and (m, r_small, cv) in by_key and r_small < n:
                    full, part = by_key[(m, n, cv)], by_key[(m, r_small, cv)]
                    gap = part["F"][-1] - full["F"][k_match]
                    table.append(TableRow(
                        f"matched total budget, {LABELS[m]}{', SCAFFOLD' if cv else ''}: F(r={r_small}, K={cfg.rounds}) − F(r=n, K={k_match})",
                        None, *mean_std(gap), f"F(r=n, round {k_match}) = {float(full['F'][k_match].mean()):.3f}; both spent "
                        f"{cfg.rounds * r_small * cfg.tau * per_step(m)} trajectories in all"))
        for m in cfg.methods:
            for r in sorted({n, r_small}, reverse=True):
                if (m, r, False) in by_key and (m, r, True) in by_key:
                    gain = by_key[(m, r, True)]["F"][-1] - by_key[(m, r, False)]["F"][-1]
                    table.append(TableRow(f"SCAFFOLD − plain, F after K={cfg.rounds}, {LABELS[m]}, {_label(r, n, False)}", None,
                                          *mean_std(gain), "paired by seed"))
        for m in cfg.methods:
            if (m, n, False) in by_key and (m, r_small, False) in by_key and r_small < n:
                ratio = by_key[(m, r_small, False)]["words"] / by_key[(m, n, False)]["words"]
                table.append(TableRow(f"random words drawn by the agents' streams, r={r_small} / r=n, {LABELS[m]}", None, ratio, None,
                                      f"the sampled work; r/n = {r_small / n:g}"))
        medians = {(na, runs, path): (statistics.median(t["wall"]), statistics.median(t["cpu"])) for na, runs, path, t in timing}
        for na in cfg.timing_agents:
            for runs in sorted({1, len(seed_list)}):
                full_wall, full_cpu = medians[(na, runs, "full")]
                for path in PATHS:
                    wall, cpu = medians[(na, runs, path)]
                    what = {"full": "r = n", "subset": f"r = n/{cfg.fraction}, sampled agents only",
                            "masked": f"r = n/{cfg.fraction}, all computed and masked (previous path)"}[path]
                    table.append(TableRow(f"wall time per round (ms), n={na}, {runs} run(s), {what}", None, 1e3 * wall, None,
                                          f"{wall / full_wall:.2f}× full (CPU time {1e3 * cpu:.1f} ms, {cpu / full_cpu:.2f}× full); "
                                          f"median of {cfg.timing_rounds} interleaved rounds, {LABELS[cfg.timing_method]}, "
                                          f"{cfg.cpu_threads} thread(s)"))
        settings = {"family": GRIDWORLD.env_id, "n_agents": n, "agents_per_round": [n, r_small], "K": cfg.rounds, "tau": cfg.tau,
                    "alpha": cfg.alpha, "beta": cfg.beta, "m_in": cfg.m_in, "m_h": cfg.m_h, "m_out": cfg.m_out, "gamma": cfg.gamma,
                    "theta0": "zeros (uniform policy)", "seed_list": seed_list, "eval": "exact dynamic programming (float64), every round",
                    "control_variates_init": "c = c_i = 0"}
        notes = [
            "F(θ) = (1/n) Σ_i J_i(θ + α∇J_i(θ)) of the server parameters, exact (dynamic programming); spreads are population standard deviations over seeds.",
            f"At r = {r_small} only the sampled agents are computed and only their random streams advance; the sampled set is drawn per run from the server stream (uniform without replacement).",
            "SCAFFOLD (Karimireddy et al. 2020): local steps along ∇̂F_i + c − c_i, option II controls c_i⁺ = c_i − c + (y_i − x)/(τβ), c⁺ = c + (1/n) Σ_{i∈S} (c_i⁺ − c_i); controls start at 0, so the first round is the uncorrected one.",
            "'trajectories' in the records are per agent on average (k·τ·m·r/n); 'trajectories_total' are summed over the participating agents.",
            "Wall times are of the batched program on this machine (shared CPUs: the medians over rounds are the robust number); the training wall times in the F rows include all seeds.",
        ]
        return ExperimentOutput(records, table, settings, notes)

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        return partial_figures(output.records, output.settings, out_dir, LABELS, _label, PATHS)
