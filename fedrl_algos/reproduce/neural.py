"""The neural arc-navigation experiments of the Per-FedAvg-PG paper (section 7, appendix C.5–C.6).

* ``curvature`` (figure 2, left): the exact variant for a sweep of Hessian batches m_h, against the
  first-order variant as the curvature-free reference; post-adaptation return on the 6 training
  goals, medians with per-seed points.
* ``fewshot`` (figure 2, right and figure 7): first-order meta-training on the 6 training goals,
  then one policy-gradient adaptation step of m_adapt trajectories on each of the 3 held-out goals,
  against from-scratch training of each held-out agent and a random policy.
* ``rollouts`` (figure 8): held-out rollouts before and after adaptation, drawn on the arc.

Every seed, every m_h setting, every goal and every budget is a batch row of one tensor program
(:class:`MetaSweep` trains ``settings × seeds`` federations of 6 agents at once); Python loops run
over rounds, local steps and policy-gradient steps only, plus — inside a local step of the exact
variant — one Hessian-batch rollout and Hessian-vector product per m_h setting, because m_h (the
number of trajectories of a row) differs between settings and a batched rollout needs one count.

Protocol (appendix C.2–C.3): γ = 0.9, horizon 20, returns discounted (the largest possible return
is Σ_{h≤20} 0.9^h ≈ 8.91); meta-training of every seed starts from the same shared initialization
(``MlpPolicy``'s default ``init_seed``); from-scratch agents and the random-policy reference start
from a fresh initialization per seed drawn the same way (:meth:`MlpPolicy.initial_parameters` with
seed ``FRESH_INIT_OFFSET + seed``). "Success" is the fraction of evaluation episodes whose visited
positions s_0..s_H enter the goal region (``family.in_goal``) at some step.

Each experiment's settings are a frozen config (:class:`CurvatureConfig`, :class:`FewShotConfig`,
:class:`RolloutsConfig`, over the meta-training fields of :class:`MetaTrainingConfig`); its
``quick()`` is the seconds-long smoke version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

import torch

from fedrl_algos.core.adaptation import adaptation_gradient, check_adaptation_baseline
from fedrl_algos.core.curvature import (
    check_curvature,
    check_curvature_clip,
    clip_curvature_term,
    curvature_vector_product,
)
from fedrl_algos.core.estimators import policy_gradient
from fedrl_algos.core.federation import Federation
from fedrl_algos.core.sampling import rollout
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.per_fedavg_pg import FirstOrderMetaGradient
from fedrl_algos.per_fedavg_pg.debiased import DebiasedMetaGradient
from fedrl_algos.policies import FastMlpPolicy, is_softmax_mlp
from fedrl_algos.policies.kernel_choice import check_policy_kernels, resolve_kernels
from fedrl_algos.policies.mlp.kernels import mlp_rollout
from fedrl_algos.reproduce.common import (
    Experiment,
    ExperimentOutput,
    FederatedTrainingConfig,
    TableRow,
    WallTimeEstimate,
    linear_estimate,
    mean_std,
    median,
)
from fedrl_algos.reproduce.parallel import (
    DEFAULT_WORKERS,
    balanced_groups,
    can_fork,
    check_workers,
    run_forked,
    run_threaded,
)
from fedrl_algos.reproduce.plots.neural import curvature_figures, fewshot_figures, rollouts_figures
from fedrl_envs import ARC_NAVIGATION, RandomStreams, derive_keys, index_params, params_to, stack_params
from fedrl_envs.threads import intra_op_threads

__all__ = [
    "MetaTrainingConfig",
    "CurvatureConfig",
    "FewShotConfig",
    "RolloutsConfig",
    "CurvatureExperiment",
    "FewShotExperiment",
    "RolloutsExperiment",
    "MetaSweep",
    "FastSampler",
    "arc_policy",
    "fast_rollout",
    "episode_success",
    "evaluate_rows",
    "FRESH_INIT_OFFSET",
    "CPU_THREADS",
    "cpu_threads",
]

GAMMA = 0.9
#: fresh initializations (from-scratch, random policy) use ``initial_parameters(FRESH_INIT_OFFSET + seed)``
FRESH_INIT_OFFSET = 1_000_000
# Stream indices (within a seed) of the consumers this module adds; the federation's own streams
# use agent indices and 2**40, 2**41 offsets.
_HESSIAN_STREAM = 1 << 44
_HELDOUT_STREAM = 1 << 45


# ------------------------------------------------------------------------------------------------
# shared pieces
# ------------------------------------------------------------------------------------------------


def fast_rollout(family, params, policy, theta: torch.Tensor, streams: RandomStreams, n: int) -> Trajectories:
    """:func:`~fedrl_algos.core.sampling.rollout`, through the fused MLP kernel where it applies (same result)."""
    if is_softmax_mlp(policy):
        return mlp_rollout(family, params, policy.softmax_mlp, theta, streams, n)
    return rollout(family, params, policy, theta, streams, n)


@dataclasses.dataclass
class FastSampler:
    """A sampler (:class:`~fedrl_algos.core.sampling.Sampler` interface) that rolls out through :func:`fast_rollout`."""

    family: Any
    params: Any
    policy: Any
    streams: RandomStreams

    def __call__(self, theta: torch.Tensor, n: int) -> Trajectories:
        return fast_rollout(self.family, self.params, self.policy, theta, self.streams, n)


def arc_policy(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, kernels: str = "torch") -> FastMlpPolicy:
    """The paper's 2 → 32 tanh → 8 softmax network (d = 360) on the arc family, shared init.

    :param kernels: the policy's rollout and gradient kernels (``FastMlpPolicy``'s ``kernels``)
    """
    one = ARC_NAVIGATION.train_tasks[0]
    policy = FastMlpPolicy(ARC_NAVIGATION.observation_space(one), ARC_NAVIGATION.action_space(one), dtype=dtype,
                           kernels=kernels)
    return policy.to(device)


def episode_success(family, params, traj: Trajectories) -> torch.Tensor:
    """Whether each episode enters the goal region at some visited step: bool ``[*B, m]``.

    :param params: task parameters with ``goal`` of shape ``[*B, 2]`` (one task per batch row)
    """
    batch = traj.rewards.shape[:-2]
    goal = params.goal.to(traj.obs.device).reshape(*batch, 1, 1, 2)
    hit = family.in_goal(traj.obs, dataclasses.replace(params, goal=goal))
    return (hit & (traj.mask > 0)).any(-1)


def evaluate_rows(
    family, params, policy, theta: torch.Tensor, streams: RandomStreams, n: int, chunk: int = 250
) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo discounted return and success rate of every row: two ``[*B]`` tensors.

    ``params`` are stacked over the flattened rows ``[prod(B)]``; ``n`` rollouts per row are drawn
    in chunks of ``chunk`` to bound memory (the streams advance exactly as one call would).
    """
    batch = theta.shape[:-1]
    goals = params.goal.reshape(*batch, 2)
    ret = torch.zeros(batch, dtype=torch.float64, device=theta.device)
    succ = torch.zeros(batch, dtype=torch.float64, device=theta.device)
    done = 0
    while done < n:
        size = min(chunk, n - done)
        traj = fast_rollout(family, params, policy, theta, streams, size)
        ret += traj.returns(GAMMA).to(torch.float64).sum(-1)
        succ += episode_success(family, dataclasses.replace(params, goal=goals), traj).to(torch.float64).sum(-1)
        done += size
    return ret / n, succ / n


def _row_params(tasks: Sequence[Any], n_rows_before: int) -> Any:
    """Task parameters for rows ``[n_rows_before, len(tasks)]`` flattened (task index fastest)."""
    stacked = stack_params(list(tasks))
    index = torch.arange(len(tasks)).repeat(n_rows_before)
    return index_params(stacked, index)


#: intra-op threads of the neural programs on CPU. One thread: their ops are small to medium and
#: serial in time; on the shared 2-core machine two OpenMP threads made a round of the curvature
#: sweep 10× slower (spin-waiting), and a fixed thread count keeps reductions, hence runs, identical.
CPU_THREADS = 1


@contextlib.contextmanager
def cpu_threads(device: str | torch.device, n: int | None = CPU_THREADS) -> Iterator[None]:
    """Run with ``n`` intra-op threads when ``device`` is a CPU, restoring the setting afterwards."""
    with intra_op_threads(n if torch.device(device).type == "cpu" else None):
        yield


@dataclasses.dataclass(frozen=True)
class MetaTrainingConfig(FederatedTrainingConfig):
    """Per-FedAvg-PG meta-training on the 6 training goals (appendix C.5–C.6 by default: τ = 5,
    m_in = m_out = 10 as in the tabular column); the base of the neural experiments' configs."""

    rounds: int = 150
    """K, communication rounds (the neural column of Table 2)"""
    beta: float = 0.2
    """β, local (outer) step size (the neural column of Table 2)"""
    alpha: float = 1.0
    """α, step size of the adaptation step (training and evaluation)"""
    cpu_threads: int = CPU_THREADS
    """intra-op threads on CPU (see :data:`CPU_THREADS`)"""
    kernels: str = "auto"
    """the arc policy's kernels: ``"numba"`` (compiled rollouts and policy gradients on the CPU,
    :mod:`fedrl_algos.policies.mlp.compiled`), ``"torch"``, or ``"auto"`` (``"numba"`` on a CPU with
    Numba installed); the two give statistically the same results, not bitwise the same numbers"""
    workers: int = DEFAULT_WORKERS
    """parts of the program run at once on CPU (:mod:`fedrl_algos.reproduce.parallel`): curvature's
    Hessian batches beside the first-order estimate, fewshot's seeds split into that many groups;
    the results do not depend on it"""
    outer_baseline: str | None = None
    """baseline of meta-training's outer gradient ĝ_out (:mod:`fedrl_algos.core.adaptation`):
    ``None`` (the paper's eq. (2)), ``"loo"`` (leave-one-out, unbiased) or ``"mean"``; beyond the paper"""

    def __post_init__(self) -> None:
        check_workers(self.workers)
        check_policy_kernels(self.kernels)
        check_adaptation_baseline(self.outer_baseline, "outer_baseline")


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="round", leave=False)


# ------------------------------------------------------------------------------------------------
# batched meta-training over settings × seeds
# ------------------------------------------------------------------------------------------------


class MetaSweep:
    """``S × R`` federations of the 6 training agents trained as one batched program.

    Setting ``s`` is the exact variant with Hessian batch ``m_hs[s]``, or the first-order variant
    where ``m_hs[s] is None``. All settings share the inner/outer batches (m_in, m_out), α, β and τ,
    so ``ĝ_out`` is estimated for every ``(setting, seed, agent)`` row in one call; the curvature
    term ``α Ĥ ĝ_out`` is then added per exact setting (a rollout of ``m_hs[s]`` trajectories per
    row and a closed-form Hessian-vector product). Settings with the same seed share random
    streams (paired comparison); the Hessian batches have streams of their own.

    :param seeds: run seeds ``[R]``
    :param m_hs: one entry per setting: an int m_h (exact variant) or ``None`` (first order)
    :param objective: ``"paper"``, or ``"debiased"`` (every setting is then the debiased
        meta-gradient of :mod:`fedrl_algos.per_fedavg_pg.debiased`; ``m_hs`` must be ``[None]``)
    :param inner_baseline: baseline of the inner step ĝ_in (:mod:`fedrl_algos.core.adaptation`)
    :param outer_baseline: baseline of the outer gradient ĝ_out (which the exact settings multiply by ``αĤ``)
    :param estimators: one curvature estimator per setting (:data:`~fedrl_algos.core.curvature.CURVATURES`;
        default ``"paper"`` for every setting; ignored for first-order settings)
    :param workers: threads of a local step: the exact settings' Hessian batches run beside the
        first-order estimate (:meth:`direction`; the results do not depend on it)
    :param curvature_clip: trust region of the exact settings' curvature term, ``‖αĤĝ_out‖ ≤ c‖ĝ_out‖``
        (:func:`~fedrl_algos.core.curvature.clip_curvature_term`; ``None``: eq. (7))
    """

    def __init__(
        self,
        policy: FastMlpPolicy,
        seeds: Sequence[int],
        m_hs: Sequence[int | None],
        alpha: float = 1.0,
        beta: float = 0.2,
        tau: int = 5,
        m_in: int = 10,
        m_out: int = 10,
        gamma: float = GAMMA,
        family=ARC_NAVIGATION,
        objective: str = "paper",
        inner_baseline: str | None = None,
        estimators: Sequence[str] | None = None,
        workers: int = 1,
        outer_baseline: str | None = None,
        curvature_clip: float | None = None,
    ) -> None:
        self.policy, self.family = policy, family
        self.curvature_clip = check_curvature_clip(curvature_clip)
        self.workers = check_workers(workers)
        self.device = policy.theta.device
        self.seeds = torch.as_tensor(list(seeds), dtype=torch.int64)
        self.m_hs = list(m_hs)
        self.estimators = ["paper"] * len(self.m_hs) if estimators is None else [check_curvature(e) for e in estimators]
        if len(self.estimators) != len(self.m_hs):
            raise ValueError(f"estimators must have one entry per setting ({len(self.m_hs)}), got {len(self.estimators)}")
        self.alpha, self.beta, self.tau, self.gamma = float(alpha), float(beta), int(tau), float(gamma)
        self.n_settings, self.n_seeds = len(self.m_hs), int(self.seeds.numel())
        tasks = family.train_tasks
        self.n_agents = len(tasks)
        agent_params = params_to(stack_params(tasks), self.device)
        # rows (setting, seed) flattened setting-major; every setting reuses the seeds' streams
        self.federation = Federation(family, agent_params, policy, self.seeds.repeat(self.n_settings), gamma)
        if objective == "debiased":
            if any(m_h is not None for m_h in self.m_hs):
                raise ValueError(f"m_hs must be [None] with objective='debiased' (it draws no Hessian batch), got {self.m_hs}")
            # the curvature-free direction of every row: here the whole debiased meta-gradient
            self.first_order = DebiasedMetaGradient(policy, gamma, alpha, m_in, m_out, inner_baseline, outer_baseline=outer_baseline)
        elif objective == "paper":
            self.first_order = FirstOrderMetaGradient(policy, gamma, alpha, m_in, m_out, inner_baseline, outer_baseline)
        else:
            raise ValueError(f"objective must be 'paper' or 'debiased', got {objective!r}")
        hess_params = params_to(_row_params(tasks, self.n_seeds), self.device)
        keys = derive_keys(self.seeds.reshape(-1, 1), torch.arange(self.n_agents).reshape(1, -1) + _HESSIAN_STREAM)
        self.hessian_samplers = {
            s: (hess_params, RandomStreams(keys, self.device)) for s, m_h in enumerate(self.m_hs) if m_h is not None
        }
        self.sampler = FastSampler(family, self.federation.row_params, policy, self.federation.streams)
        self.eval_sampler = FastSampler(family, self.federation.row_params, policy, self.federation.eval_streams)
        self.theta = policy.theta.detach().to(self.device).expand(self.n_settings * self.n_seeds, -1).clone()
        self.rounds_done = 0

    def trajectories_per_step(self, s: int) -> int:
        m_h = self.m_hs[s]
        return self.first_order.m_in + self.first_order.m_out + (m_h or 0)

    def direction(self, local: torch.Tensor) -> torch.Tensor:
        """One local step's direction for every row ``[S·R, n, d]``.

        With ``workers > 1`` the exact settings' Hessian batches (rollout, then the curvature
        product once ``ĝ_out`` is known) run on threads while this thread estimates ``ĝ_out``;
        every setting's operations are those of the serial loop, so the direction is bitwise the same.
        """
        if self.alpha == 0.0 or not self.hessian_samplers:
            return self.first_order(self.sampler, local)
        g_out_ready = threading.Event()
        g_out: list[torch.Tensor] = []

        def curvature_terms(settings: Sequence[int]) -> dict[int, torch.Tensor]:
            terms = {}
            for s in settings:
                params, streams = self.hessian_samplers[s]
                rows = slice(s * self.n_seeds, (s + 1) * self.n_seeds)
                traj = fast_rollout(self.family, params, self.policy, local[rows], streams, self.m_hs[s])
                g_out_ready.wait()
                term = self.alpha * curvature_vector_product(
                    self.policy, local[rows], traj, g_out[0][rows], self.gamma, self.estimators[s])
                terms[s] = clip_curvature_term(term, g_out[0][rows], self.curvature_clip)
            return terms

        def first_order_then(settings: Sequence[int]) -> dict[int, torch.Tensor]:
            try:
                g_out.append(self.first_order(self.sampler, local))
            finally:
                g_out_ready.set()  # also on failure, so that no thread waits forever
            return curvature_terms(settings)

        # this thread: ĝ_out, then the lightest group of settings; the others on their own threads
        groups = balanced_groups(list(self.hessian_samplers), lambda s: self.m_hs[s], self.workers)[::-1]
        tasks = [functools.partial(first_order_then, groups[0])]
        tasks += [functools.partial(curvature_terms, group) for group in groups[1:]]
        terms = {s: term for part in run_threaded(tasks, self.workers) for s, term in part.items()}
        direction = g_out[0].clone()
        for s in self.hessian_samplers:
            direction[s * self.n_seeds : (s + 1) * self.n_seeds] += terms[s]
        return direction

    def round(self) -> None:
        """One communication round of every federation: broadcast, τ local steps, average."""
        local = self.federation.broadcast(self.theta)
        for _ in range(self.tau):
            local = local + self.beta * self.direction(local)
        self.theta = local.mean(-2)
        self.rounds_done += 1

    def thetas(self) -> torch.Tensor:
        """Server parameters ``[S, R, d]``."""
        return self.theta.reshape(self.n_settings, self.n_seeds, -1)

    def evaluate(self, adapt_trajectories: int, eval_trajectories: int) -> dict[str, torch.Tensor]:
        """Pre- and post-adaptation return and success on the training goals, ``[S, R, n]`` each.

        The adaptation step (step size α) uses ``adapt_trajectories`` per agent; both evaluations
        average ``eval_trajectories`` rollouts per agent; all from the federation's evaluation streams.
        """
        fed = self.federation
        pre_theta = fed.broadcast(self.theta)
        n_rows = pre_theta.shape[0]

        def evaluate_part(rows: slice) -> tuple[dict[str, torch.Tensor], RandomStreams]:
            # rows (setting, seed) of the federation: their streams copied, their agents' tasks
            streams = fed.eval_streams[rows]
            params = index_params(fed.row_params, torch.arange(rows.start * self.n_agents, rows.stop * self.n_agents,
                                                                   device=self.device))
            pre = pre_theta[rows]
            post = pre
            if self.alpha > 0 and adapt_trajectories > 0:
                traj = fast_rollout(self.family, params, self.policy, pre, streams, adapt_trajectories)
                post = pre + self.alpha * policy_gradient(self.policy, pre, traj, self.gamma)
            part = {}
            for name, theta in (("pre", pre), ("post", post)):
                part[f"return_{name}"], part[f"success_{name}"] = evaluate_rows(
                    self.family, params, self.policy, theta, streams, eval_trajectories)
            return part, streams

        # Every row's rollouts, gradient and evaluation depend on its own streams only, so halves of
        # the rows run on the two threads with the numbers of one batch (tested).
        bounds = [round(k * n_rows / self.workers) for k in range(self.workers + 1)]
        parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
        results = run_threaded([functools.partial(evaluate_part, rows) for rows in parts], self.workers)
        shape = (self.n_settings, self.n_seeds, self.n_agents)
        out = {key: torch.cat([part[key] for part, _ in results]).reshape(shape) for key in results[0][0]}
        fed.eval_streams.counters = torch.cat([streams.counters for _, streams in results])
        return out


# ------------------------------------------------------------------------------------------------
# curvature bottleneck
# ------------------------------------------------------------------------------------------------

PAPER_CURVATURE = {10: 0.2, 50: 0.2, 100: 0.2, 200: 0.2, 500: 0.39, 1000: 1.51}
PAPER_FIRST_ORDER = 1.73
#: a seed "trains" when its final post-adaptation return reaches this (the bimodal outcome's gap)
TRAINED_THRESHOLD = 1.2


@dataclasses.dataclass(frozen=True)
class CurvatureConfig(MetaTrainingConfig):
    """``curvature``: the exact variant for every Hessian batch m_h, and the first-order reference."""

    m_hs: tuple[int, ...] = (10, 50, 100, 200, 500, 1000)
    """the Hessian batches m_h of the exact variant, one setting each"""
    adapt_trajectories: int = 256
    """trajectories per agent of the evaluation's adaptation step"""
    eval_trajectories: int = 512
    """evaluation rollouts per agent, before and after adaptation"""
    eval_every: int = 25
    """rounds between evaluations (round 0 and the last round always)"""
    estimators: tuple[str, ...] = ("paper",)
    """curvature estimators of the exact variant (:data:`~fedrl_algos.core.curvature.CURVATURES`), each run at every m_h"""
    inner_baseline: str | None = None
    """baseline of meta-training's inner step ĝ_in (``None``: the paper's; ``"loo"``, ``"mean"``); the
    evaluation's adaptation step stays the paper's; beyond the paper"""
    curvature_clip: float | None = None
    """trust region of the exact variant's curvature term, ``‖αĤĝ_out‖ ≤ c‖ĝ_out‖`` (``None``: the
    paper's eq. (7); :func:`~fedrl_algos.core.curvature.clip_curvature_term`, biased where it acts); beyond the paper"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_adaptation_baseline(self.inner_baseline, "inner_baseline")
        check_curvature_clip(self.curvature_clip)
        if not self.estimators:
            raise ValueError("estimators must name at least one curvature estimator")
        for e in self.estimators:
            check_curvature(e)
        if len(set(self.estimators)) != len(self.estimators):
            raise ValueError(f"estimators must not repeat, got {self.estimators}")

    @property
    def default_estimators(self) -> bool:
        """Whether only the paper's estimator runs (then records and table are exactly the paper's layout)."""
        return tuple(self.estimators) == ("paper",)

    def quick(self) -> Self:
        """This config as a seconds-long smoke version: m_h ∈ {10, 100} (unless ``m_hs`` was changed), 3 rounds
        of 2 local steps, 32 rollouts."""
        m_hs = (10, 100) if self.m_hs == CurvatureConfig.m_hs else self.m_hs
        return dataclasses.replace(self, m_hs=m_hs, rounds=3, tau=2, adapt_trajectories=32, eval_trajectories=32,
                                   eval_every=3)


class CurvatureExperiment(Experiment[CurvatureConfig]):
    name = "curvature"
    description = "exact variant vs Hessian batch m_h on arc navigation (curvature bottleneck)"
    paper_reference = "figure 2 (left), section 7 and appendix C.5"
    config_class = CurvatureConfig

    def estimate_wall_time(self, config: CurvatureConfig, seeds: int) -> WallTimeEstimate:
        # 10 seeds, 150 rounds, 7 settings (6 m_h and first order): 305-350 s wall with the compiled
        # kernels (docs/benchmarks.md, compiled curvature products), 502 s with the torch kernels (docs/reproduction.md)
        settings = len(config.m_hs) * len(config.estimators) + 1
        scales = {"seeds": (seeds, 10), "rounds": (config.rounds, 150), "settings": (settings, 7)}
        if resolve_kernels(config.kernels) == "numba":
            return linear_estimate(self.name, 320.0, scales, "docs/benchmarks.md, compiled kernels")
        return linear_estimate(self.name, 502.0, scales, "docs/reproduction.md")

    def run(self, config: CurvatureConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        with cpu_threads(device, config.cpu_threads):
            return self._run(config, seeds, device, progress)

    def _run(self, cfg: CurvatureConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        n_seeds = int(seeds)
        policy = arc_policy(device, kernels=resolve_kernels(cfg.kernels, device))
        # one setting per (estimator, m_h), estimator-major, then the first-order reference
        pairs: list[tuple[str | None, int | None]] = [(e, m_h) for e in cfg.estimators for m_h in cfg.m_hs]
        pairs.append((None, None))
        settings = [m_h for _, m_h in pairs]
        sweep = MetaSweep(policy, range(n_seeds), settings, cfg.alpha, cfg.beta, cfg.tau, cfg.m_in, cfg.m_out,
                          inner_baseline=cfg.inner_baseline, estimators=[e or "paper" for e, _ in pairs], workers=cfg.workers,
                          outer_baseline=cfg.outer_baseline, curvature_clip=cfg.curvature_clip)
        records: list[dict[str, Any]] = []

        def log(round_: int) -> dict[str, torch.Tensor]:
            ev = sweep.evaluate(cfg.adapt_trajectories, cfg.eval_trajectories)
            for s, (estimator, m_h) in enumerate(pairs):
                for r in range(n_seeds):
                    record = {
                        "experiment": self.name,
                        "method": "first_order" if m_h is None else "exact",
                        "seed": r,
                        "m_h": m_h,
                        "round": round_,
                        "trajectories": round_ * cfg.tau * sweep.trajectories_per_step(s),
                        "return": float(ev["return_post"][s, r].mean()),
                        "success": float(ev["success_post"][s, r].mean()),
                        "return_pre": float(ev["return_pre"][s, r].mean()),
                        "success_pre": float(ev["success_pre"][s, r].mean()),
                    }
                    if not cfg.default_estimators:
                        record["estimator"] = estimator
                    records.append(record)
            return ev

        bar = _progress(cfg.rounds, progress, "curvature")
        log(0)
        for k in range(1, cfg.rounds + 1):
            sweep.round()
            if bar is not None:
                bar.update(1)
            if k % cfg.eval_every == 0 or k == cfg.rounds:
                log(k)
        if bar is not None:
            bar.close()
        final = [r for r in records if r["round"] == cfg.rounds]
        table = []
        for estimator, m_h in pairs:
            vals = [r["return"] for r in final if r["m_h"] == m_h and r.get("estimator") == (
                None if cfg.default_estimators else estimator)]
            paper = PAPER_FIRST_ORDER if m_h is None else PAPER_CURVATURE.get(m_h)
            trained = sum(v >= TRAINED_THRESHOLD for v in vals)
            if m_h is None:
                label = "first-order reference"
            else:
                label = f"exact, m_h={m_h}" if cfg.default_estimators else f"exact ({estimator} curvature), m_h={m_h}"
            table.append(TableRow(f"median post-adaptation return, {label}", paper, median(vals), None,
                                  f"{trained}/{len(vals)} seeds ≥ {TRAINED_THRESHOLD}; seeds: "
                                  + ", ".join(f"{v:.2f}" for v in sorted(vals))))
        notes = [
            "Median over seeds of the post-adaptation return (one PG step of α=1 from "
            f"{cfg.adapt_trajectories} trajectories, {cfg.eval_trajectories} rollouts per goal), averaged over the "
            "6 training goals; discounted with γ=0.9 (max ≈ 8.91). Every seed starts from the shared initialization.",
            "The paper reports at m_h=1000 six seeds ≥ 1.5 (three matching 1.73) and four ≤ 0.95; the table counts the "
            f"seeds at or above {TRAINED_THRESHOLD} and lists every seed's value (sorted).",
            "Settings are batched; the exact variant's Hessian batch is rolled out per m_h setting (counts differ).",
        ]
        if not cfg.default_estimators:
            notes.append(
                "Curvature estimators (docs/algorithms/per_fedavg_pg.md): paper = eq. (3); causal = Hessian of the "
                "causality-respecting surrogate with a leave-one-out per-step baseline (unbiased); lvc = ProMP's "
                "low-variance curvature (biased). The paper column is the paper's (eq. (3)) median at that m_h for every "
                "estimator. Settings with the same seed share all random streams, Hessian batches included.")
        if cfg.inner_baseline is not None or cfg.outer_baseline is not None:
            notes.append(
                f"Beyond the paper: meta-training's inner step ĝ_in with baseline {cfg.inner_baseline!r} and outer gradient ĝ_out "
                f"with baseline {cfg.outer_baseline!r} (None: the paper's eq. (2); 'loo': leave-one-out, unbiased); the "
                "evaluation's adaptation step is the paper's. The paper column is the paper's estimator without baselines.")
        if cfg.curvature_clip is not None:
            notes.append(
                f"Beyond the paper: the exact variant's curvature term αĤĝ_out is shortened to at most {cfg.curvature_clip:g}·‖ĝ_out‖ "
                "where longer (a trust region on I + αĤ; biased where it acts). The first-order reference has no curvature term.")
        settings_out = {"seeds": n_seeds, "gamma": GAMMA, "dtype": "float32", "n_agents": 6,
                        "kernels": resolve_kernels(cfg.kernels, device)}
        return ExperimentOutput(records=records, table=table, settings=settings_out, notes=notes)

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        return curvature_figures(output.records, out_dir, PAPER_CURVATURE)


# ------------------------------------------------------------------------------------------------
# few-shot personalization
# ------------------------------------------------------------------------------------------------


def fresh_initializations(policy: FastMlpPolicy, seeds: torch.Tensor) -> torch.Tensor:
    """One fresh initialization per seed ``[R, d]`` (from-scratch agents, random-policy reference)."""
    return policy.sample_initializations(seeds + FRESH_INIT_OFFSET).to(policy.theta.device, policy.param_dtype)


def adapt_one_step(policy, family, params, theta: torch.Tensor, streams: RandomStreams, counts: Sequence[int],
                   alpha: float, baseline: str | None = None) -> torch.Tensor:
    """One PG step per row of ``theta [C, *B, d]``: row ``c`` uses the first ``counts[c]`` of its trajectories.

    One rollout of ``max(counts)`` trajectories per row (its own stream) and one closed-form policy
    gradient: trajectories beyond a row's count are masked out and the estimate is rescaled, so a
    row with count m is exactly the m-trajectory estimate. Rows with count 0 are left unchanged.
    ``baseline`` is that of the adaptation gradient (:mod:`fedrl_algos.core.adaptation`); masked-out
    trajectories never enter a row's baseline (it averages running trajectories only).
    """
    m = max(counts)
    if m == 0:
        return theta
    traj = fast_rollout(family, params, policy, theta, streams, m)
    count = torch.tensor(list(counts), device=theta.device).reshape(-1, *([1] * (theta.dim() - 1)))
    keep = (torch.arange(m, device=theta.device) < count).to(traj.mask.dtype)  # [C, *1, m]
    masked = traj._replace(mask=traj.mask * keep.unsqueeze(-1), rewards=traj.rewards * keep.unsqueeze(-1))
    grad = adaptation_gradient(policy, theta, masked, GAMMA, baseline) * (m / count.clamp(min=1).to(theta.dtype))
    return theta + alpha * grad


PAPER_FEWSHOT = {
    "zero_shot_return": 1.53,
    "random_return": 0.27,
    "return_200": 1.94,
    "meta_100_return": 1.52,
    "scratch_100_return": 0.25,
    "zero_shot_success": 0.75,
    "best_success": 0.86,
    "meta_100_success": 0.80,
    "scratch_100_success": 0.18,
    "specialist_success": 0.90,
}


#: the paper's reported (budget, value) points, drawn on the figures: meta-init and from-scratch alike
PAPER_FEWSHOT_POINTS = {
    "return": [(0, 1.53), (100, 1.52), (200, 1.94), (100, 0.25)],
    "success": [(0, 0.75), (100, 0.80), (100, 0.18), (4000, 0.90)],
}


@dataclasses.dataclass(frozen=True)
class FewShotConfig(MetaTrainingConfig):
    """``fewshot``: first-order meta-training, then one PG step on each held-out goal, against from-scratch PG."""

    m_adapt: tuple[int, ...] = (0, 20, 50, 100, 200, 500)
    """trajectories of the meta-initialization's adaptation step, one setting each (0: zero-shot)"""
    scratch_steps: tuple[int, ...] = (1, 5, 25, 100, 200)
    """from-scratch PG steps at which the run is evaluated (budget: steps × scratch_batch)"""
    scratch_batch: int = 20
    """trajectories per from-scratch PG step"""
    scratch_beta: float = 0.2
    """step size of the from-scratch PG steps"""
    eval_trajectories: int = 1000
    """evaluation rollouts per (seed, held-out goal)"""
    objective: str = "paper"
    """meta-training objective: ``"paper"`` (the first-order variant, as the paper) or ``"debiased"``
    (SG-MRL's E_{D_in}[J(θ + α ĝ_in)] with its unbiased meta-gradient, m_in + m_out trajectories per step)"""
    adaptation_baseline: str | None = None
    """baseline of every adaptation gradient (meta-training's inner step and the held-out step):
    ``None`` (the paper's), ``"loo"`` (leave-one-out, unbiased) or ``"mean"``"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.objective not in ("paper", "debiased"):
            raise ValueError(f"objective must be 'paper' or 'debiased', got {self.objective!r}")
        check_adaptation_baseline(self.adaptation_baseline)

    def quick(self) -> Self:
        """This config as a seconds-long smoke version: 4 rounds of 2 local steps, m_adapt ∈ {0, 20, 50}, 1 and 5 steps."""
        return dataclasses.replace(self, rounds=4, tau=2, m_adapt=(0, 20, 50), scratch_steps=(1, 5), eval_trajectories=64)


class FewShotExperiment(Experiment[FewShotConfig]):
    name = "fewshot"
    description = "few-shot personalization of a first-order meta-initialization to held-out arc goals"
    paper_reference = "figure 2 (right), figure 7, section 7 and appendix C.6"
    config_class = FewShotConfig

    def estimate_wall_time(self, config: FewShotConfig, seeds: int) -> WallTimeEstimate:
        # 10 seeds, 150 rounds: 8.5 s wall with the compiled kernels (docs/benchmarks.md), 14 s wall
        # with the torch kernels (docs/reproduction.md)
        scales = {"seeds": (seeds, 10), "rounds": (config.rounds, 150)}
        if resolve_kernels(config.kernels) == "numba":
            return linear_estimate(self.name, 8.5, scales, "docs/benchmarks.md, compiled kernels")
        return linear_estimate(self.name, 14.0, scales, "docs/reproduction.md")

    def run(self, config: FewShotConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        with cpu_threads(device, config.cpu_threads):
            n_seeds = int(seeds)
            result = few_shot(config, n_seeds, device, progress)
        return ExperimentOutput(
            records=result["records"], table=self._table(result["records"], config), notes=result["notes"],
            settings={"seeds": n_seeds, "gamma": GAMMA, "dtype": "float32", "heldout_goals": 3,
                      "kernels": resolve_kernels(config.kernels, device)},
        )

    @staticmethod
    def _summary(records, method: str, key: str, value: int, metric: str) -> tuple[float, float]:
        per_seed: dict[int, list[float]] = {}
        for r in records:
            if r["method"] == method and r.get(key) == value and r.get("round") is None:
                per_seed.setdefault(r["seed"], []).append(r[metric])
        return mean_std([sum(v) / len(v) for v in per_seed.values()])

    def _table(self, records, cfg: FewShotConfig) -> list[TableRow]:
        s = self._summary
        paper = PAPER_FEWSHOT
        rows = []

        def add(q, p, mean_std, note=""):
            rows.append(TableRow(q, p, mean_std[0], mean_std[1], note))

        add("return, meta-init zero-shot", paper["zero_shot_return"], s(records, "meta_init", "m_adapt", 0, "return"))
        add("return, random policy (fresh init)", paper["random_return"], s(records, "random", "budget", 0, "return"))
        for m in cfg.m_adapt[1:]:
            p = paper["return_200"] if m == 200 else paper["meta_100_return"] if m == 100 else (
                "≤ zero-shot" if m == 20 else None)
            add(f"return, meta-init + 1 step of {m} traj.", p, s(records, "meta_init", "m_adapt", m, "return"))
        for g in cfg.scratch_steps:
            b = g * cfg.scratch_batch
            p = paper["scratch_100_return"] if b == 100 else ("≈ zero-shot (1.53)" if b == 2000 else None)
            add(f"return, from scratch, budget {b}", p, s(records, "from_scratch", "budget", b, "return"))
        add("success, meta-init zero-shot", paper["zero_shot_success"], s(records, "meta_init", "m_adapt", 0, "success"))
        best = max((s(records, "meta_init", "m_adapt", m, "success") for m in cfg.m_adapt), key=lambda t: t[0])
        add("success, meta-init best one-step (max over m_adapt)", paper["best_success"], best)
        for m in cfg.m_adapt[1:]:
            p = paper["meta_100_success"] if m == 100 else None
            add(f"success, meta-init + 1 step of {m} traj.", p, s(records, "meta_init", "m_adapt", m, "success"))
        for g in cfg.scratch_steps:
            b = g * cfg.scratch_batch
            p = paper["scratch_100_success"] if b == 100 else (
                paper["specialist_success"] if b == 4000 else ("15–37% (budgets ≤ 500)" if b <= 500 else None))
            add(f"success, from scratch, budget {b}", p, s(records, "from_scratch", "budget", b, "success"))
        add("success, random policy (fresh init)", None, s(records, "random", "budget", 0, "success"))
        return rows

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        # the table's seed statistics (mean, std over seeds) at every budget the records have
        recs = [r for r in output.records if r.get("round") is None]
        summary = {}
        for metric in ("return", "success"):
            summary[metric] = {
                method: [(x, *self._summary(recs, method, key, x, metric)) for x in sorted({r[key] for r in recs if r["method"] == method})]
                for method, key in (("meta_init", "m_adapt"), ("from_scratch", "budget"))
            }
            summary[metric]["random"] = [(0, *self._summary(recs, "random", "budget", 0, metric))]
        return fewshot_figures(summary, out_dir, PAPER_FEWSHOT_POINTS, int(output.settings.get("workers", 1)))


def meta_train_first_order(policy, seeds: torch.Tensor, cfg: MetaTrainingConfig, progress: bool, desc: str,
                           objective: str = "paper", inner_baseline: str | None = None) -> torch.Tensor:
    """First-order Per-FedAvg-PG on the 6 training goals for every seed at once: ``[R, d]``
    (``objective="debiased"``: the debiased meta-gradient instead; ``inner_baseline``: of ĝ_in;
    ``cfg.outer_baseline``: of ĝ_out)."""
    sweep = MetaSweep(policy, seeds.tolist(), [None], cfg.alpha, cfg.beta, cfg.tau, cfg.m_in, cfg.m_out,
                      objective=objective, inner_baseline=inner_baseline, outer_baseline=cfg.outer_baseline)
    bar = _progress(cfg.rounds, progress, desc)
    for _ in range(cfg.rounds):
        sweep.round()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return sweep.thetas()[0]


def _adapt_meta_init(cfg: FewShotConfig, policy, seeds: torch.Tensor, theta_meta: torch.Tensor) -> torch.Tensor:
    """One PG step of the meta-initialization on every held-out goal: rows ``[len(m_adapt), R, goals]``."""
    family, heldout = ARC_NAVIGATION, ARC_NAVIGATION.heldout_tasks
    n_seeds, n_goals, m_adapt = int(seeds.numel()), len(heldout), list(cfg.m_adapt)
    n_m = len(m_adapt)
    keys = derive_keys(seeds.reshape(1, -1, 1), torch.arange(n_goals).reshape(1, 1, -1)
                       + _HELDOUT_STREAM + 16 * torch.arange(n_m).reshape(-1, 1, 1))
    params_m = params_to(_row_params(heldout, n_m * n_seeds), policy.theta.device)
    theta_m = theta_meta.reshape(1, n_seeds, 1, -1).expand(n_m, n_seeds, n_goals, -1).contiguous()
    return adapt_one_step(policy, family, params_m, theta_m, RandomStreams(keys, policy.theta.device), m_adapt,
                          cfg.alpha, cfg.adaptation_baseline)


def _train_from_scratch(cfg: FewShotConfig, policy, seeds: torch.Tensor, init: torch.Tensor, progress: bool) -> list[torch.Tensor]:
    """From-scratch PG on rows ``[R, goals]`` from the fresh ``init [R, d]``: a snapshot after each of ``scratch_steps``."""
    family, heldout = ARC_NAVIGATION, ARC_NAVIGATION.heldout_tasks
    n_seeds, n_goals, steps = int(seeds.numel()), len(heldout), list(cfg.scratch_steps)
    theta_s = init.reshape(n_seeds, 1, -1).expand(n_seeds, n_goals, -1).contiguous()
    params_s = params_to(_row_params(heldout, n_seeds), policy.theta.device)
    streams_s = RandomStreams(derive_keys(seeds.reshape(-1, 1), torch.arange(n_goals).reshape(1, -1)
                                          + _HELDOUT_STREAM + 1024), policy.theta.device)
    snapshots = []
    bar = _progress(max(steps), progress, "fewshot: from scratch")
    for g in range(1, max(steps) + 1):
        traj = fast_rollout(family, params_s, policy, theta_s, streams_s, cfg.scratch_batch)
        theta_s = theta_s + cfg.scratch_beta * policy_gradient(policy, theta_s, traj, GAMMA)
        if g in steps:
            snapshots.append(theta_s)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return snapshots


def _few_shot_part(cfg: FewShotConfig, policy, seeds: torch.Tensor, progress: bool) -> tuple[torch.Tensor, ...]:
    """Everything of ``fewshot`` for some of the seeds: returns and success rates
    ``[n_m + n_steps + 2, R, goals]`` of every evaluated row, and the meta-initializations ``[R, d]``."""
    family = ARC_NAVIGATION
    heldout = family.heldout_tasks
    n_seeds, n_goals = int(seeds.numel()), len(heldout)
    init = fresh_initializations(policy, seeds)  # [R, d]
    theta_meta = meta_train_first_order(policy, seeds, cfg, progress, "fewshot: meta-training", cfg.objective,
                                        cfg.adaptation_baseline)  # [R, d]
    theta_m = _adapt_meta_init(cfg, policy, seeds, theta_meta)
    snapshots = _train_from_scratch(cfg, policy, seeds, init, progress)
    # --- evaluate everything in one batch: [n_m + n_steps + 1 (random) + 1 (uniform), R, goals] -
    uniform = torch.zeros_like(init)
    all_theta = torch.cat([
        theta_m,
        torch.stack(snapshots),
        init.reshape(1, n_seeds, 1, -1).expand(1, n_seeds, n_goals, -1),
        uniform.reshape(1, n_seeds, 1, -1).expand(1, n_seeds, n_goals, -1),
    ])
    n_rows = all_theta.shape[0]
    eval_keys = derive_keys(seeds.reshape(1, -1, 1), torch.arange(n_goals).reshape(1, 1, -1)
                            + _HELDOUT_STREAM + 4096 + 16 * torch.arange(n_rows).reshape(-1, 1, 1))
    params_e = params_to(_row_params(heldout, n_rows * n_seeds), policy.theta.device)
    ret, succ = evaluate_rows(family, params_e, policy, all_theta, RandomStreams(eval_keys, policy.theta.device),
                              cfg.eval_trajectories)
    return ret, succ, theta_meta


def few_shot(cfg: FewShotConfig, n_seeds: int, device: str, progress: bool) -> dict[str, Any]:
    """Meta-train, adapt, train from scratch and evaluate on the held-out goals (all batched).

    Every seed's computation is its own rows of the batch (its own random streams; the kernels
    compute a row alone), so with ``workers > 1`` the seeds are split into that many groups run
    at the same time (:func:`~fedrl_algos.reproduce.parallel.run_forked`), each the whole program
    for its seeds; the records are those of one batch of all seeds (``tests/test_reproduce_parallel.py``).
    """
    family = ARC_NAVIGATION
    policy = arc_policy(device, kernels=resolve_kernels(cfg.kernels, device))
    seeds = torch.arange(n_seeds)
    heldout = family.heldout_tasks
    n_goals = len(heldout)
    steps = list(cfg.scratch_steps)
    workers = cfg.workers if can_fork(device) else 1
    groups = [g for g in seeds.tensor_split(min(workers, n_seeds)) if g.numel()]
    # only the first part (this process) shows progress bars: a forked part's would interleave with them
    parts = run_forked([functools.partial(_few_shot_part, cfg, policy, group, progress and k == 0)
                        for k, group in enumerate(groups)], workers, device)
    ret = torch.cat([part[0] for part in parts], dim=1)
    succ = torch.cat([part[1] for part in parts], dim=1)
    theta_meta = torch.cat([part[2] for part in parts])
    m_adapt = list(cfg.m_adapt)
    n_m = len(m_adapt)
    records: list[dict[str, Any]] = []

    def add(method: str, row: int, **setting: Any) -> None:
        for r in range(n_seeds):
            for j in range(n_goals):
                records.append({"experiment": "fewshot", "method": method, "seed": r, "goal": j, **setting,
                                "return": float(ret[row, r, j]), "success": float(succ[row, r, j])})

    for i, m in enumerate(m_adapt):
        add("meta_init", i, m_adapt=m, budget=m)
    for i, g in enumerate(steps):
        add("from_scratch", n_m + i, budget=g * cfg.scratch_batch, steps=g)
    add("random", n_m + len(steps), budget=0)
    uni_ret, uni_succ = float(ret[-1].mean()), float(succ[-1].mean())
    notes = [
        f"Returns are discounted (γ=0.9, max ≈ 8.91), averaged over {cfg.eval_trajectories} rollouts per "
        "(seed, held-out goal), then over the 3 held-out goals; ± is the std over seeds.",
        "Random policy = a freshly initialized network per seed (first-layer weights N(0, 0.5²), last-layer "
        f"N(0, 0.1²), biases 0), nearly uniform over the 8 moves. The exactly uniform policy (θ = 0) gives return "
        f"{uni_ret:.3f} and success {uni_succ:.3f}; both are consistent with the paper's 0.27.",
        "From-scratch agents start from the same fresh initialization as the random policy; each budget is a "
        f"snapshot of one run of {max(steps)} PG steps (batch {cfg.scratch_batch}, β={cfg.scratch_beta:g}), so budgets are nested.",
        f"Meta-init adaptation: one PG step (α={cfg.alpha:g}) per held-out goal; each m_adapt setting is an independent batch.",
    ]
    if cfg.objective != "paper" or cfg.adaptation_baseline is not None or cfg.outer_baseline is not None:
        notes.append(
            f"Beyond the paper: meta-training objective {cfg.objective!r} ('paper': the first-order variant; 'debiased': "
            f"SG-MRL's E[J(θ + α ĝ_in)] with its unbiased meta-gradient), adaptation baseline {cfg.adaptation_baseline!r} "
            "(in meta-training's inner step and in the held-out step; 'loo' = leave-one-out time-dependent mean reward-to-go), "
            f"outer-gradient baseline {cfg.outer_baseline!r} (meta-training's ĝ_out). "
            "The paper's columns are its first-order, no-baseline numbers."
        )
    return {"records": records, "notes": notes, "theta_meta": theta_meta, "policy": policy}


# ------------------------------------------------------------------------------------------------
# rollouts on the arc
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RolloutsConfig(MetaTrainingConfig):
    """``rollouts``: held-out rollouts of the first-order meta-initialization before and after one PG step."""

    m_adapt: int = 200
    """trajectories of the adaptation step"""
    n_drawn: int = 12
    """rollouts drawn per held-out goal (seed 0)"""
    eval_trajectories: int = 1000
    """evaluation rollouts per (seed, held-out goal) of the table"""

    def quick(self) -> Self:
        """This config as a seconds-long smoke version: 4 rounds of 2 local steps, a 50-trajectory step, 6 drawn."""
        return dataclasses.replace(self, rounds=4, tau=2, m_adapt=50, n_drawn=6, eval_trajectories=64)


class RolloutsExperiment(Experiment[RolloutsConfig]):
    name = "rollouts"
    description = "held-out rollouts before and after one adaptation step, drawn on the arc"
    paper_reference = "figure 8, appendix C.6"
    config_class = RolloutsConfig

    def estimate_wall_time(self, config: RolloutsConfig, seeds: int) -> WallTimeEstimate:
        # docs/reproduction.md: 12 s wall for 10 seeds, 150 rounds
        return linear_estimate(self.name, 12.0, {"seeds": (seeds, 10), "rounds": (config.rounds, 150)},
                               "docs/reproduction.md")

    def run(self, config: RolloutsConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        with cpu_threads(device, config.cpu_threads):
            return self._run(config, seeds, device, progress)

    def _run(self, cfg: RolloutsConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        n_seeds = int(seeds)
        family = ARC_NAVIGATION
        policy = arc_policy(device, kernels=resolve_kernels(cfg.kernels, device))
        dev = policy.theta.device
        seed_t = torch.arange(n_seeds)
        theta_meta = meta_train_first_order(policy, seed_t, cfg, progress, "rollouts: meta-training")
        heldout = family.heldout_tasks
        n_goals = len(heldout)
        counts = [0, cfg.m_adapt]
        keys = derive_keys(seed_t.reshape(1, -1, 1), torch.arange(n_goals).reshape(1, 1, -1)
                           + _HELDOUT_STREAM + 16 * torch.arange(2).reshape(-1, 1, 1))
        params = params_to(_row_params(heldout, 2 * n_seeds), dev)
        theta = theta_meta.reshape(1, n_seeds, 1, -1).expand(2, n_seeds, n_goals, -1).contiguous()
        theta = adapt_one_step(policy, family, params, theta, RandomStreams(keys, dev), counts, cfg.alpha)
        # drawn rollouts: the same start states and random numbers before and after adaptation
        draw_keys = derive_keys(seed_t.reshape(1, -1, 1), torch.arange(n_goals).reshape(1, 1, -1)
                                + _HELDOUT_STREAM + 8192 + 0 * torch.arange(2).reshape(-1, 1, 1))
        drawn = fast_rollout(family, params, policy, theta, RandomStreams(draw_keys, dev), cfg.n_drawn)
        goals = params.goal.reshape(2, n_seeds, n_goals, 2)
        drawn_success = episode_success(family, dataclasses.replace(params, goal=goals), drawn)
        eval_keys = derive_keys(seed_t.reshape(1, -1, 1), torch.arange(n_goals).reshape(1, 1, -1)
                                + _HELDOUT_STREAM + 4096 + 16 * torch.arange(2).reshape(-1, 1, 1))
        ret, succ = evaluate_rows(family, params, policy, theta, RandomStreams(eval_keys, dev), cfg.eval_trajectories)
        records = []
        for c, m in enumerate(counts):
            for r in range(n_seeds):
                for j in range(n_goals):
                    records.append({"experiment": self.name, "method": "meta_init", "seed": r, "goal": j, "m_adapt": m,
                                    "budget": m, "return": float(ret[c, r, j]), "success": float(succ[c, r, j])})
        # the drawn rollouts (seed 0) are records too, so the figure regenerates from results.json
        drawn_ret = drawn.returns(GAMMA)
        for c, m in enumerate(counts):
            for j in range(n_goals):
                for k in range(cfg.n_drawn):
                    records.append({"experiment": self.name, "method": "meta_init", "seed": 0, "goal": j, "m_adapt": m,
                                    "budget": m, "drawn": k, "return": float(drawn_ret[c, 0, j, k]),
                                    "success": float(drawn_success[c, 0, j, k]),
                                    "path": [[round(float(x), 4), round(float(y), 4)] for x, y in drawn.obs[c, 0, j, k].tolist()]})
        table = []
        for c, m in enumerate(counts):
            label = "zero-shot" if m == 0 else f"after one step of {m} traj."
            table.append(TableRow(f"held-out return, {label}", PAPER_FEWSHOT["zero_shot_return"] if m == 0 else
                                  (PAPER_FEWSHOT["return_200"] if m == 200 else None),
                                  *mean_std(ret[c].mean(-1).tolist())))
            table.append(TableRow(f"held-out success, {label}", PAPER_FEWSHOT["zero_shot_success"] if m == 0 else None,
                                  *mean_std(succ[c].mean(-1).tolist())))
        drawn_rate = drawn_success[:, 0].float().mean(-1).mean(-1).tolist()
        notes = [
            f"The figure draws {cfg.n_drawn} rollouts per held-out goal for seed 0, before and after one PG step "
            f"of {cfg.m_adapt} trajectories (α={cfg.alpha:g}), with the same start states and random numbers in both rows; "
            f"{drawn_rate[0]:.0%} / {drawn_rate[1]:.0%} of the drawn episodes reach the goal region.",
            f"Table: all seeds, {cfg.eval_trajectories} evaluation rollouts per (seed, goal).",
        ]
        return ExperimentOutput(records=records, table=table, notes=notes,
                                settings={"seeds": n_seeds, "gamma": GAMMA, "drawn_seed": 0,
                                          "kernels": resolve_kernels(cfg.kernels, device)})

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        return rollouts_figures(output.records, output.settings, out_dir)
