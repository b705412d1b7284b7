"""The tabular gridworld experiments of the Per-FedAvg-PG paper (section 7, appendix C.2–C.4).

* ``personalization`` (figure 1 left, figure 6): the exact variant, the first-order (Hessian-free)
  variant and non-personalized FedAvg-PG on the 8-agent 5 × 5 gridworld, K = 80 rounds of τ = 5
  local steps, α = 2, β = 0.3, m_in = m_h = m_out = 10 (FedAvg-PG: one estimate from 30
  trajectories), every run from θ = 0. The exact meta-objective F(θ) (after the adaptation step)
  and f(θ) (before it) of the server parameters at every round, round 0 included.
* ``alpha`` (figure 1 right): the same three methods for α ∈ {0, 1/4, 1/2, 1, 2, 3}. FedAvg-PG's
  training does not depend on α, so it is trained once per seed and its F is evaluated at every α.

Everything that can be batched is: a method's runs over all seeds — and, for ``alpha``, over all
α values (one batch row per (α, seed), α a per-row tensor) — are one batched program
(:class:`~fedrl_algos.core.federation.Federation`), and the exact evaluation of every round of
every run is one call of :class:`~fedrl_algos.core.exact.TabularEvaluator` per method. Run ``r`` of a
method is seeded by its seed ``s``: its random streams are keyed by ``(s, agent)`` only, so a run
trains to bitwise the same parameters alone or in any batch (and, for ``alpha``, the meta-methods'
runs with the same seed share their random streams across α: common random numbers); its exact F
and f agree to float64 rounding (~1e-16: the evaluator's reductions depend on the batch layout).

Training runs in float32 (:data:`TRAIN_DTYPE`): it is faster than float64 on CPU and equally
faithful (docs/reproduction.md gives the comparison); the evaluation is exact, in float64.

Each experiment's settings are a frozen config (:class:`PersonalizationConfig`, :class:`AlphaConfig`:
the training hyperparameters of :class:`TabularConfig` plus the methods, dtype, CPU threads and α);
``config.quick()`` is the smoke version (4 rounds of 2 local steps).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import torch

from fedrl_algos.core.directions import GradientEstimator, PolicyGradient
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.core.federation import Federation
from fedrl_algos.per_fedavg_pg import ExactMetaGradient, FirstOrderMetaGradient
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import TabularPolicy
from fedrl_algos.policies.kernel_choice import check_policy_kernels, resolve_kernels
from fedrl_algos.reproduce.common import (
    Experiment,
    ExperimentOutput,
    FederatedTrainingConfig,
    TableRow,
    WallTimeEstimate,
    linear_estimate,
    mean_std,
    progress_bar,
)
from fedrl_algos.reproduce.parallel import DEFAULT_WORKERS, balanced_groups, can_fork, check_workers, run_forked
from fedrl_algos.reproduce.plots.tabular import alpha_figures, personalization_figures
from fedrl_envs import GRIDWORLD, params_to, stack_params
from fedrl_envs.threads import intra_op_threads

__all__ = [
    "ALPHAS",
    "METHODS",
    "PAPER",
    "TRAIN_DTYPE",
    "TabularConfig",
    "PersonalizationConfig",
    "AlphaConfig",
    "TabularResult",
    "train_tabular",
    "tabular_records",
    "PersonalizationExperiment",
    "AlphaExperiment",
]

#: the methods, in the order of every table and figure
METHODS = ("exact", "first_order", "fedavg")
#: display names, in the order of METHODS (the figures draw the methods in this order)
LABELS = {"exact": "Per-FedAvg-PG (exact)", "first_order": "Per-FedAvg-PG (first-order)", "fedavg": "FedAvg-PG"}
#: the α sweep of figure 1 (right)
ALPHAS = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0)
#: dtype of the training program (the exact evaluation is always float64)
TRAIN_DTYPE = torch.float32
#: intra-op threads of the tabular programs on CPU. Their tensors are small (a few thousand
#: elements), so a second OpenMP thread costs more in synchronization than it saves, and on a shared
#: machine a busy core stalls every parallel op (docs/reproduction.md gives the measurements).
CPU_THREADS = 1

#: numbers the paper reports (section 7)
PAPER = {
    "personalization": {
        "F": {"exact": 0.79, "first_order": 0.73, "fedavg": 0.68},
        "f_exact": 0.51,
        "uniform": 0.24,
        "budget": 8000,
        "F_at_budget": {"exact": 0.71, "first_order": 0.73},
    },
    "alpha": {
        0.0: {"exact": 0.49, "first_order": 0.49, "fedavg": 0.48},
        3.0: {"exact": 0.92, "first_order": 0.87, "fedavg": 0.78},
    },
}


@dataclass(frozen=True)
class TabularConfig(FederatedTrainingConfig):
    """Training hyperparameters of the tabular experiments (the paper's Table 2 by default); the
    adaptation step size α is the experiment's (:class:`PersonalizationConfig`, :class:`AlphaConfig`)."""

    m_h: int = 10
    """m_h, trajectories of the Hessian estimate (exact variant)"""
    gamma: float = 0.9
    """γ, discount"""

    def quick(self) -> Self:
        """This config as a seconds-long smoke version: 4 rounds of 2 local steps."""
        return dataclasses.replace(self, rounds=4, tau=2)

    def trajectories_per_step(self, method: str) -> int:
        """Per-agent trajectories of one local step (section 7: exact and FedAvg-PG 30, first-order 20)."""
        return self.m_in + self.m_out if method == "first_order" else self.m_in + self.m_h + self.m_out


@dataclass(frozen=True)
class _TabularExperimentConfig(TabularConfig):
    """What both tabular experiments add to the training hyperparameters."""

    methods: tuple[str, ...] = METHODS
    """the methods to train, a subset of :data:`METHODS` (tables and figures keep METHODS' order)"""
    train_dtype: str = str(TRAIN_DTYPE).replace("torch.", "")
    """dtype of the training program (the exact evaluation is always float64)"""
    cpu_threads: int = CPU_THREADS
    """intra-op threads on CPU (see :data:`CPU_THREADS`)"""
    workers: int = DEFAULT_WORKERS
    """parts of the program run at once on CPU: the methods' trainings, then the α values' exact
    evaluations (:mod:`fedrl_algos.reproduce.parallel`); the results do not depend on it"""
    kernels: str = "auto"
    """the tabular policy's rollout loop: ``"numba"`` (one compiled loop on the CPU,
    :mod:`fedrl_algos.policies.tabular_compiled`), ``"torch"``, or ``"auto"`` (``"numba"`` on a CPU
    with Numba installed); the results are bitwise the same"""

    def __post_init__(self) -> None:
        check_workers(self.workers)
        check_policy_kernels(self.kernels)
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {self.methods!r}")
        if not isinstance(getattr(torch, self.train_dtype, None), torch.dtype):
            raise ValueError(f"train_dtype must name a torch dtype (e.g. 'float32'), got {self.train_dtype!r}")

    @property
    def dtype(self) -> torch.dtype:
        """:attr:`train_dtype` as a torch dtype."""
        return getattr(torch, self.train_dtype)


@dataclass(frozen=True)
class PersonalizationConfig(_TabularExperimentConfig):
    """``personalization``: the three methods at one adaptation step size."""

    alpha: float = 2.0
    """α, step size of the adaptation step (training and evaluation)"""


@dataclass(frozen=True)
class AlphaConfig(_TabularExperimentConfig):
    """``alpha``: the three methods for every α of the sweep (FedAvg-PG trained once, evaluated at each)."""

    alphas: tuple[float, ...] = ALPHAS
    """the α values of the sweep"""


@dataclass
class TabularResult:
    """One method's runs: exact F and f of the server parameters at every round.

    :param method: ``exact``, ``first_order`` or ``fedavg``
    :param alphas: the α values ``[n_alpha]`` (rows of ``F``/``f``)
    :param seeds: the seeds ``[n_seeds]`` (columns)
    :param F: post-adaptation objective ``[K + 1, n_alpha, n_seeds]`` (float64)
    :param f: pre-adaptation objective, same shape
    :param trajectories_per_round: per-agent trajectories of one round (``τ ×`` per step)
    :param theta: the server parameters ``[K + 1, n_alpha, n_seeds, d]`` (training dtype; FedAvg-PG's
        are the same for every α)
    """

    method: str
    alphas: list[float]
    seeds: list[int]
    F: torch.Tensor
    f: torch.Tensor
    trajectories_per_round: int
    theta: torch.Tensor


def _estimator(method: str, policy: TabularPolicy, cfg: TabularConfig, alpha: float | torch.Tensor) -> GradientEstimator:
    if method == "exact":
        return ExactMetaGradient(policy, cfg.gamma, alpha, cfg.m_in, cfg.m_h, cfg.m_out)
    if method == "first_order":
        return FirstOrderMetaGradient(policy, cfg.gamma, alpha, cfg.m_in, cfg.m_out)
    if method == "fedavg":
        return PolicyGradient(policy, cfg.gamma, cfg.m_in + cfg.m_h + cfg.m_out, name="fedavg")
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def train_tabular(
    seeds: Sequence[int],
    alphas: Sequence[float],
    cfg: TabularConfig = TabularConfig(),
    methods: Sequence[str] = METHODS,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = TRAIN_DTYPE,
    progress: bool = False,
    desc: str = "tabular",
    workers: int = 1,
    kernels: str = "torch",
) -> dict[str, TabularResult]:
    """Train every method on every (α, seed) and evaluate F and f exactly at every round.

    The meta-methods run ``len(alphas) × len(seeds)`` runs as one federation (run ``a·n_seeds + s``
    has step size ``alphas[a]`` and seed ``seeds[s]``; a single α is passed as a number); FedAvg-PG
    runs ``len(seeds)`` runs and is evaluated at every α.

    With ``workers > 1`` the program runs in parts at the same time
    (:func:`~fedrl_algos.reproduce.parallel.run_forked`): first the trainings, every method's runs
    split between the parts in groups balanced by their sampling cost, one federation per method
    and part (a run's training is bitwise the same alone or in any batch: its streams are keyed by
    its seed and agent only); then the α values' exact evaluations, each in the chunks of the serial program
    (the evaluator's rounding depends on the chunk layout). So the results are bitwise those of
    ``workers = 1``.

    :param workers: parts of the program that may run at once (:mod:`fedrl_algos.reproduce.parallel`)
    :param kernels: the policy's rollout loop (:class:`~fedrl_algos.policies.tabular.TabularPolicy`'s
        ``kernels``; the same numbers)
    :return: one :class:`TabularResult` per method
    """
    device = torch.device(device)
    seeds = [int(s) for s in seeds]
    alphas = [float(a) for a in alphas]
    n_alpha, n_seeds = len(alphas), len(seeds)
    if n_alpha == 0 or n_seeds == 0:
        raise ValueError("seeds and alphas must be non-empty")
    workers = check_workers(workers)
    family = GRIDWORLD
    methods = list(methods)
    # A unit is one federation: (method, its run indices). A meta-method's run r has step size
    # alphas[r // n_seeds] and seed seeds[r % n_seeds] (α-major); FedAvg-PG's run r is seeds[r].
    n_runs = {m: n_seeds if m == "fedavg" else n_alpha * n_seeds for m in methods}
    split = workers if can_fork(device) else 1
    # Balanced run by run (a run costs its trajectories per local step), then each part's runs of a
    # method join into one federation: parts within a run's sampling cost of each other, and no more
    # federations than methods per part.
    runs = [(m, r) for m in methods for r in range(n_runs[m])]
    parts = balanced_groups(runs, lambda run: cfg.trajectories_per_step(run[0]), split)
    groups = [[(m, tuple(r for mm, r in part if mm == m)) for m in methods if any(mm == m for mm, _ in part)] for part in parts]
    tasks = [
        functools.partial(_train_units, group, seeds, alphas, cfg, device, dtype, progress and k == 0, desc, kernels)
        for k, group in enumerate(groups)
    ]
    trained = {unit: h for part in run_forked(tasks, workers, device) for unit, h in part.items()}
    histories = {}  # [K+1, runs, d], runs in order
    for method in methods:
        units = [unit for unit in trained if unit[0] == method]
        order = torch.tensor([r for _, indices in units for r in indices]).argsort()
        histories[method] = torch.cat([trained[unit] for unit in units], dim=1)[:, order]
    # Exact evaluation of every round of every run: one call per α over all methods, rounds and seeds
    # (α passed as a number: the same values as a per-row tensor, without its broadcasting checks).
    evaluator = TabularEvaluator(family, gamma=cfg.gamma, device=device)
    stacked = []
    for method in methods:
        history = histories[method]  # [K+1, runs, d]
        if method == "fedavg":  # trained once per seed, evaluated at every α
            history = history.unsqueeze(1).expand(-1, n_alpha, -1, -1)
        stacked.append(history.reshape(cfg.rounds + 1, n_alpha, n_seeds, -1))
    every = torch.stack(stacked).to(torch.float64)  # [methods, K+1, n_alpha, n_seeds, d]
    # Each α is evaluated in the same chunks whatever the grouping (the evaluator's rounding
    # depends on the chunk layout), so the values are those of the serial program.
    alpha_groups = balanced_groups(list(range(n_alpha)), lambda a: 1.0, workers)
    parts = run_forked(
        [functools.partial(_evaluate_alphas, evaluator, every, alphas, group) for group in alpha_groups], workers, device
    )
    values = {a: v for part in parts for a, v in part.items()}
    big_f = torch.stack([values[a][0] for a in range(n_alpha)], dim=2).cpu()  # [methods, K+1, n_alpha, n_seeds]
    small_f = torch.stack([values[a][1] for a in range(n_alpha)], dim=2).cpu()
    results = {}
    for i, method in enumerate(methods):
        results[method] = TabularResult(
            method=method,
            alphas=alphas,
            seeds=seeds,
            F=big_f[i],
            f=small_f[i],
            trajectories_per_round=cfg.tau * cfg.trajectories_per_step(method),
            theta=stacked[i].cpu(),
        )
    return results


def _train_units(
    units: Sequence[tuple[str, tuple[int, ...]]], seeds: list[int], alphas: list[float], cfg: TabularConfig,
    device: torch.device, dtype: torch.dtype, progress: bool, desc: str, kernels: str = "torch",
) -> dict[tuple[str, tuple[int, ...]], torch.Tensor]:
    """Train each unit ``(method, run indices)`` as one federation and return its server parameters
    ``[K+1, runs, d]`` (a meta-method's run ``r``: step size ``alphas[r // len(seeds)]``, seed
    ``seeds[r % len(seeds)]``; FedAvg-PG's run ``r``: seed ``seeds[r]``)."""
    family = GRIDWORLD
    tasks = family.train_tasks
    n_seeds = len(seeds)
    policy = TabularPolicy(family.observation_space(tasks[0]), family.action_space(tasks[0]), dtype=dtype, kernels=kernels).to(device)
    params = params_to(stack_params(tasks), device)
    histories: dict[tuple[str, tuple[int, ...]], list[torch.Tensor]] = {}
    runs: dict[tuple[str, tuple[int, ...]], tuple[Federation, GradientEstimator, torch.Tensor]] = {}
    for unit in units:
        method, indices = unit
        run_seeds = torch.tensor([seeds[r % n_seeds] for r in indices])
        values = [0.0 if method == "fedavg" else alphas[r // n_seeds] for r in indices]
        # one α for the whole unit is passed as a number (the same values as a per-run tensor)
        alpha = values[0] if len(set(values)) == 1 else torch.tensor(values, dtype=dtype, device=device).reshape(-1, 1, 1)
        federation = Federation(family, params, policy, run_seeds, gamma=cfg.gamma)
        theta = torch.zeros(len(run_seeds), policy.n_params, dtype=dtype, device=device)
        runs[unit] = (federation, _estimator(method, policy, cfg, alpha), theta)
        histories[unit] = [theta]
    bar = progress_bar(cfg.rounds * len(units), progress, desc, unit="round")
    for k in range(cfg.rounds):
        for unit in units:
            federation, estimator, theta = runs[unit]
            theta, _ = per_fedavg_pg_round(federation, theta, estimator, cfg.beta, cfg.tau)
            runs[unit] = (federation, estimator, theta)
            histories[unit].append(theta)
            if bar is not None:
                bar.set_postfix_str(f"round {k + 1}/{cfg.rounds} {unit[0]}", refresh=False)
                bar.update(1)
    if bar is not None:
        bar.close()
    return {unit: torch.stack(history) for unit, history in histories.items()}


def _evaluate_alphas(
    evaluator: TabularEvaluator, every: torch.Tensor, alphas: list[float], indices: Sequence[int]
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Exact (F, f) of ``every[:, :, a]`` at ``alphas[a]`` for each index ``a`` (see :func:`_evaluate`)."""
    return {a: _evaluate(evaluator, every[:, :, a], alphas[a]) for a in indices}


#: parameter vectors per exact-evaluation call: chunks this size keep the dynamic program's
#: intermediates cache-sized (measured: 2430 vectors in one call take ~1.9× as long as in chunks of 512)
EVAL_CHUNK = 512


def _evaluate(evaluator: TabularEvaluator, theta: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (F, f) of ``theta [*B, d]`` in chunks of :data:`EVAL_CHUNK` vectors: ``[*B]`` each."""
    flat = theta.reshape(-1, theta.shape[-1])
    parts = [evaluator.meta_objective(chunk, alpha) for chunk in flat.split(EVAL_CHUNK)]
    shape = theta.shape[:-1]
    return torch.cat([p[0] for p in parts]).reshape(shape), torch.cat([p[1] for p in parts]).reshape(shape)


def tabular_records(experiment: str, results: dict[str, TabularResult]) -> list[dict[str, Any]]:
    """Flat records, one per (method, α, seed, round); fields documented in docs/reproduction.md."""
    records = []
    for method, res in results.items():
        big_f, small_f = res.F.tolist(), res.f.tolist()
        for k, (fk, sk) in enumerate(zip(big_f, small_f)):
            for a, alpha in enumerate(res.alphas):
                for s, seed in enumerate(res.seeds):
                    records.append(
                        {
                            "experiment": experiment,
                            "method": method,
                            "seed": seed,
                            "alpha": alpha,
                            "round": k,
                            "trajectories": k * res.trajectories_per_round,
                            "F": fk[a][s],
                            "f": sk[a][s],
                        }
                    )
    return records


def _uniform_values(cfg: TabularConfig, alpha: float) -> tuple[float, float]:
    """Exact (F, f) of the uniform-random policy θ = 0."""
    evaluator = TabularEvaluator(GRIDWORLD, gamma=cfg.gamma)
    big_f, small_f = evaluator.meta_objective(torch.zeros(evaluator.dim, dtype=torch.float64), alpha)
    return float(big_f), float(small_f)


def _value_at_budget(res: TabularResult, budget: int, alpha_index: int = 0) -> tuple[torch.Tensor, str]:
    """F per seed at ``budget`` per-agent trajectories (linear in trajectories between two rounds)."""
    per_round = res.trajectories_per_round
    last = res.F.shape[0] - 1
    x = min(budget / per_round, float(last))
    lo = int(math.floor(x))
    hi = min(lo + 1, last)
    w = x - lo
    values = res.F[lo, alpha_index] * (1 - w) + res.F[hi, alpha_index] * w
    if budget > last * per_round:
        how = f"this run is shorter than the budget: its last round ({last * per_round} trajectories)"
    elif w == 0:
        how = f"round {lo} ({lo * per_round} trajectories)"
    else:
        how = f"interpolated between rounds {lo} and {hi} ({lo * per_round} and {hi * per_round} trajectories)"
    return values, how


def _seed_list(seeds: int) -> list[int]:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a positive int, got {seeds!r}")
    return list(range(seeds))


def _settings(cfg: _TabularExperimentConfig, seeds: list[int], alphas: Sequence[float], device: str) -> dict[str, Any]:
    return {
        "family": GRIDWORLD.env_id,
        "n_agents": len(GRIDWORLD.train_tasks),
        "K": cfg.rounds,
        "tau": cfg.tau,
        "alpha": list(alphas) if len(alphas) > 1 else alphas[0],
        "beta": cfg.beta,
        "m_in": cfg.m_in,
        "m_h": cfg.m_h,
        "m_out": cfg.m_out,
        "fedavg_m": cfg.m_in + cfg.m_h + cfg.m_out,
        "gamma": cfg.gamma,
        "horizon": GRIDWORLD.train_tasks[0].horizon,
        "theta0": "zeros (uniform policy)",
        "seed_list": seeds,
        "train_dtype": cfg.train_dtype,
        "eval": "exact dynamic programming (float64), every round",
        "cpu_threads": cfg.cpu_threads,
        "kernels": resolve_kernels(cfg.kernels, device),
    }


def _run_training(seeds: list[int], alphas: Sequence[float], cfg: _TabularExperimentConfig, device: str, progress: bool,
                  desc: str) -> dict[str, TabularResult]:
    threads = cfg.cpu_threads if torch.device(device).type == "cpu" else None
    with intra_op_threads(threads):
        return train_tabular(seeds, alphas, cfg, methods=cfg.methods, device=device, dtype=cfg.dtype, progress=progress, desc=desc,
                             workers=cfg.workers, kernels=resolve_kernels(cfg.kernels, device))


class PersonalizationExperiment(Experiment):
    """Figure 1 (left) and figure 6: F and f against trajectories and rounds, three methods."""

    name = "personalization"
    description = "tabular personalization: exact vs first-order Per-FedAvg-PG vs FedAvg-PG (fig. 1 left, fig. 6)"
    paper_reference = "Per-FedAvg-PG, section 7 'Personalization within federation', figure 1 (left) and figure 6"
    config_class = PersonalizationConfig

    def estimate_wall_time(self, config: PersonalizationConfig, seeds: int) -> WallTimeEstimate:
        # docs/reproduction.md: 3.6 s wall for 10 seeds, the paper's 80 rounds and 3 methods
        return linear_estimate(self.name, 3.6, {"seeds": (seeds, 10), "rounds": (config.rounds, 80),
                                                "methods": (len(config.methods), len(METHODS))}, "docs/reproduction.md")

    def run(self, config: PersonalizationConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        cfg, seed_list = config, _seed_list(seeds)
        results = _run_training(seed_list, [cfg.alpha], cfg, device, progress, self.name)
        records = tabular_records(self.name, results)
        paper = PAPER["personalization"]
        table: list[TableRow] = []
        final = {m: mean_std(r.F[-1, 0]) for m, r in results.items()}
        for m in METHODS:
            if m in final:
                table.append(TableRow(f"F after K={cfg.rounds} rounds, {LABELS[m]}", paper["F"][m], *final[m], "mean over seeds"))
        uniform_F, uniform_f = _uniform_values(cfg, cfg.alpha)
        table.append(
            TableRow(
                "uniform-random policy (θ = 0), J without adaptation",
                paper["uniform"],
                uniform_f,
                None,
                f"exact; the paper's 0.24 is f(0) = mean_i J_i(0); with one adaptation step at α={cfg.alpha:g} it would be F(0) = {uniform_F:.3f}",
            )
        )
        if "exact" in results:
            table.append(
                TableRow(
                    "f (before adaptation) of the exact variant's initialization",
                    paper["f_exact"],
                    *mean_std(results["exact"].f[-1, 0]),
                    "F − f is the value of the single local adaptation step",
                )
            )
        for m in ("first_order", "fedavg"):
            if m in results:
                table.append(TableRow(f"f (before adaptation), {LABELS[m]}", None, *mean_std(results[m].f[-1, 0])))
        budget = paper["budget"]
        for m in ("first_order", "exact"):
            if m in results:
                values, how = _value_at_budget(results[m], budget)
                table.append(
                    TableRow(f"F at the matched budget of {budget} trajectories per agent, {LABELS[m]}", paper["F_at_budget"][m], *mean_std(values), how)
                )
        if all(m in results for m in METHODS):
            means = torch.stack([results[m].F[1:, 0].mean(-1) for m in METHODS])  # [3, K]
            ordered = int(((means[0] > means[1]) & (means[1] > means[2])).sum())
            first_gap = next((k + 1 for k in range(cfg.rounds) if not (means[0, k] > means[1, k] > means[2, k])), None)
            table.append(
                TableRow(
                    "rounds 1..K where the seed-mean F orders exact > first-order > FedAvg-PG",
                    "all (fig. 6)",
                    f"{ordered}/{cfg.rounds}",
                    None,
                    "every round" if first_gap is None else f"first round out of order: {first_gap}",
                )
            )
        notes = [
            "F(θ) = (1/n) Σ_i J_i(θ + α∇J_i(θ)) and f(θ) = (1/n) Σ_i J_i(θ) of the server parameters, by exact dynamic programming (no sampling noise).",
            "Spreads are population standard deviations over seeds (the figures' bands are ± 1 of them).",
            f"Trajectories per agent per round: exact and FedAvg-PG {cfg.tau * cfg.trajectories_per_step('exact')}, first-order {cfg.tau * cfg.trajectories_per_step('first_order')}.",
            "Seed s keys the random streams of run s (per agent), so a seed's result is the same alone or in a batch; methods run with the same seed share their first random numbers (common random numbers).",
        ]
        return ExperimentOutput(records, table, _settings(cfg, seed_list, [cfg.alpha], device), notes)

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        uniform = next((r.ours for r in output.table if r.quantity.startswith("uniform-random")), None)
        return personalization_figures(output.records, out_dir, LABELS, uniform, PAPER["personalization"]["budget"])


class AlphaExperiment(Experiment):
    """Figure 1 (right): final F against the adaptation step size α."""

    name = "alpha"
    description = "tabular α sweep: final F of the three methods for α ∈ {0, 1/4, 1/2, 1, 2, 3} (fig. 1 right)"
    paper_reference = "Per-FedAvg-PG, section 7 'The adaptation step size α', figure 1 (right)"
    config_class = AlphaConfig

    def estimate_wall_time(self, config: AlphaConfig, seeds: int) -> WallTimeEstimate:
        # docs/benchmarks.md (reproduction wall times): 6.4 s program wall for 10 seeds, 80 rounds, 3 methods,
        # the 6 α of the sweep, workers=2
        return linear_estimate(self.name, 6.4, {"seeds": (seeds, 10), "rounds": (config.rounds, 80),
                                                 "methods": (len(config.methods), len(METHODS)),
                                                 "alphas": (len(config.alphas), len(ALPHAS))}, "docs/benchmarks.md")

    def run(self, config: AlphaConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        cfg, seed_list = config, _seed_list(seeds)
        alphas = cfg.alphas
        results = _run_training(seed_list, alphas, cfg, device, progress, self.name)
        records = tabular_records(self.name, results)
        paper = PAPER["alpha"]
        table = []
        for a, alpha in enumerate(alphas):
            for m in METHODS:
                if m in results:
                    p = paper.get(alpha, {}).get(m)
                    table.append(TableRow(f"F after K={cfg.rounds}, α={alpha:g}, {LABELS[m]}", p, *mean_std(results[m].F[-1, a])))
        if all(m in results for m in METHODS):
            final = torch.stack([results[m].F[-1].mean(-1) for m in METHODS])  # [3, n_alpha]
            if 0.0 in alphas:  # Proposition 3 is a statement about α = 0 only
                i0 = alphas.index(0.0)
                spread0 = float(final[:, i0].max() - final[:, i0].min())
                table.append(TableRow("α = 0: largest difference between the three methods", "≤ 0.01", spread0, None, "Proposition 3: the methods coincide at α = 0"))
            gain = [float(final[0, a] - final[2, a]) for a in range(len(alphas))]
            table.append(
                TableRow(
                    "exact − FedAvg-PG gap, by α",
                    "grows with α",
                    ", ".join(f"{g:+.3f}" for g in gain),
                    None,
                    "α = " + ", ".join(f"{a:g}" for a in alphas),
                )
            )
        notes = [
            "One batched program per method: the meta-methods run len(α) × seeds runs (α a per-run tensor), FedAvg-PG runs one training per seed and is evaluated at every α.",
            "At α = 0 the three directions have the same expectation ∇J_i (Proposition 3), so the methods differ only by sampling noise: the exact variant's first local step even equals the first-order one (same streams), later steps differ because it also draws the Hessian batch.",
            "Spreads are population standard deviations over seeds.",
        ]
        return ExperimentOutput(records, table, _settings(cfg, seed_list, list(alphas), device), notes)

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        return alpha_figures(output.records, out_dir, LABELS, int(output.settings.get("workers", 1)))
