"""Bias and variance of the exact variant's curvature estimators (``python -m fedrl_algos.reproduce.curvature_stats``).

:func:`curvature_estimator_stats` draws ``n_batches`` independent Hessian batches of ``m_h``
trajectories (one batched rollout, each batch a row with its own random stream; every estimator
sees the same batches) and returns, per estimator of :data:`~fedrl_algos.core.curvature.CURVATURES`,
the mean of ``Ĥv`` over the batches, the total variance of one batch's estimate
(``tr Cov[Ĥv]``) and, given the exact ``∇²J v``, per-coordinate z-scores, a Hotelling-type
statistic and the relative bias. The command prints the tables of ``docs/algorithms/per_fedavg_pg.md``:
the gridworld against exact dynamic programming (:class:`~fedrl_algos.core.exact.TabularEvaluator`) and
arc navigation (paper's MLP) at the shared initialization. With ``--clips``
(:func:`curvature_clip_stats`) it prints instead the bias, variance and mean squared error of the
exact step with a clipped curvature term (``curvature_clip``) against the unclipped step.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch

from fedrl_algos.core.curvature import CURVATURES, check_curvature, curvature_vector_product
from fedrl_algos.core.sampling import rollout
from fedrl_envs import RandomStreams, derive_keys, index_params
from fedrl_envs.validation import check_int

__all__ = ["EstimatorStats", "curvature_clip_stats", "curvature_estimator_stats", "hotelling", "main"]


@dataclasses.dataclass
class EstimatorStats:
    """Monte Carlo summary of one curvature estimator at one ``(θ, v, m_h)``.

    :param estimator: ``"paper"``, ``"causal"`` or ``"lvc"``
    :param m_h: trajectories per batch
    :param n_batches: independent batches
    :param mean: mean of ``Ĥv`` over the batches ``[d]``
    :param total_variance: ``tr Cov[Ĥv]`` of one batch's estimate
    :param max_abs_z: largest ``|mean − exact| / se`` over the coordinates (``None`` without exact)
    :param hotelling: ``n (mean − exact)ᵀ Cov⁺ (mean − exact)``, ≈ χ²(dof) when unbiased
    :param dof: rank of the covariance (the tabular softmax's rows sum to zero: ``S(A − 1)``)
    :param relative_bias: ``‖mean − exact‖ / ‖exact‖``
    :param samples: the per-batch estimates ``[n_batches, d]`` (with ``keep_samples``)
    """

    estimator: str
    m_h: int
    n_batches: int
    mean: torch.Tensor
    total_variance: float
    max_abs_z: float | None = None
    hotelling: float | None = None
    dof: int | None = None
    relative_bias: float | None = None
    samples: torch.Tensor | None = None


def hotelling(samples: torch.Tensor, target: torch.Tensor, rel_tol: float = 1e-9) -> tuple[float, int, float]:
    """``(T², rank, max |z|)`` of ``samples [n, d]`` against ``target [d]``, in float64.

    ``T² = n (x̄ − target)ᵀ Σ̂⁺ (x̄ − target)`` with the pseudo-inverse on the eigenvalues above
    ``rel_tol`` times the largest (the sample covariance of a tabular softmax estimate is singular);
    for an unbiased estimator and large n it is ≈ χ²(rank). ``z`` per coordinate of positive variance.
    """
    x = samples.to(torch.float64)
    n = x.shape[0]
    diff = x.mean(0) - target.to(torch.float64)
    cov = torch.cov(x.T)
    evals, evecs = torch.linalg.eigh(cov)
    keep = evals > evals.max() * rel_tol
    proj = evecs[:, keep].T @ diff
    t2 = float((proj.square() / evals[keep]).sum() * n)
    var = cov.diagonal()
    pos = var > var.max() * rel_tol
    z = diff[pos] / (var[pos] / n).sqrt()
    return t2, int(keep.sum()), float(z.abs().max())


def curvature_estimator_stats(
    policy: Any,
    family: Any,
    params: Any,
    theta: torch.Tensor,
    v: torch.Tensor,
    m_h: int,
    n_batches: int,
    seed: int = 0,
    gamma: float = 0.9,
    estimators: Sequence[str] = CURVATURES,
    exact: torch.Tensor | None = None,
    keep_samples: bool = False,
) -> dict[str, EstimatorStats]:
    """Mean, variance and (with ``exact``) bias statistics of each estimator over ``n_batches`` batches.

    :param policy: a flat policy
    :param family: the task family; :param params: one task's parameters (batch of one)
    :param theta: parameters ``[d]``; :param v: direction ``[d]``
    :param m_h: trajectories per Hessian batch
    :param n_batches: independent batches (rows of one rollout, stream ``(seed, row)`` each)
    :param seed: seed of the streams
    :param gamma: discount
    :param estimators: the estimators to summarize
    :param exact: ``∇²J v [d]`` (e.g. :meth:`~fedrl_algos.core.exact.TabularEvaluator.hvps`) for the bias statistics
    :param keep_samples: keep the per-batch estimates (for paired comparisons of the estimators)
    """
    m_h, n_batches = check_int("m_h", m_h), check_int("n_batches", n_batches, 2)
    for e in estimators:
        check_curvature(e)
    rows = index_params(params, torch.zeros(n_batches, dtype=torch.int64))
    th = theta.reshape(1, -1).expand(n_batches, -1).contiguous()
    vv = v.reshape(1, -1).to(th.dtype).expand(n_batches, -1).contiguous()
    traj = rollout(family, rows, policy, th, RandomStreams(derive_keys(int(seed), torch.arange(n_batches)), th.device), m_h)
    out = {}
    for e in estimators:
        est = curvature_vector_product(policy, th, traj, vv, gamma, e).to(torch.float64)
        stats = EstimatorStats(e, m_h, n_batches, est.mean(0), float(torch.cov(est.T).diagonal().sum()),
                               samples=est if keep_samples else None)
        if exact is not None:
            t2, dof, zmax = hotelling(est, exact)
            ex = exact.to(torch.float64)
            stats.hotelling, stats.dof, stats.max_abs_z = t2, dof, zmax
            stats.relative_bias = float((stats.mean - ex).norm() / ex.norm())
        out[e] = stats
    return out


def _gridworld_rows(m_hs: Sequence[int], n_batches: int) -> list[dict[str, Any]]:
    import gymnasium as gym

    from fedrl_algos.core.exact import TabularEvaluator
    from fedrl_algos.policies import TabularPolicy
    from fedrl_envs import GRIDWORLD, stack_params

    policy = TabularPolicy(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)
    evaluator = TabularEvaluator("fedrl/GridWorld-v0", gamma=0.9)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(100, generator=gen, dtype=torch.float64) * 0.5
    v_random = torch.randn(100, generator=gen, dtype=torch.float64)
    agent = 2
    params = index_params(stack_params(GRIDWORLD.train_tasks), torch.tensor([agent]))
    out = []
    for v_name, v in (("random v", v_random), ("v = ∇J_i", evaluator.grads(theta)[agent].reshape(-1))):
        exact = evaluator.hvps(theta, v)[agent].reshape(-1)
        for m_h in m_hs:
            stats = curvature_estimator_stats(policy, GRIDWORLD, params, theta, v, m_h, n_batches, seed=11, exact=exact)
            base = stats["paper"].total_variance
            for e, s in stats.items():
                out.append({"setting": f"gridworld agent {agent}, {v_name}", "m_h": m_h, "estimator": e,
                            "variance_ratio": s.total_variance / base, "relative_bias": s.relative_bias,
                            "max_abs_z": s.max_abs_z, "hotelling": s.hotelling, "dof": s.dof,
                            "noise_ratio": s.total_variance ** 0.5 / float(v.norm())})
    return out


def _arc_rows(m_hs: Sequence[int], n_batches: int, trained_rounds: int = 50) -> list[dict[str, Any]]:
    from fedrl_algos.core.estimators import policy_gradient
    from fedrl_algos.reproduce.neural import MetaSweep, arc_policy
    from fedrl_envs import ARC_NAVIGATION, stack_params

    policy = arc_policy("cpu", torch.float64)
    # the shared initialization, and where the exact variant starts to collapse in the curvature
    # experiment: after some rounds of first-order training (seed 0, the experiment's protocol)
    sweep = MetaSweep(arc_policy("cpu"), [0], [None])
    for _ in range(trained_rounds):
        sweep.round()
    points = [("shared init", policy.theta.detach().clone()),
              (f"{trained_rounds} first-order rounds", sweep.thetas()[0, 0].to(torch.float64))]
    out = []
    for (where, theta), agent in ((p, a) for p in points for a in (0, 3)):
        params = index_params(stack_params(ARC_NAVIGATION.train_tasks), torch.tensor([agent]))
        # v: the direction eq. (7) applies Ĥ to, ĝ_out ≈ ∇J_i; a large-batch estimate at θ
        big = rollout(ARC_NAVIGATION, params, policy, theta.reshape(1, -1), RandomStreams(derive_keys(99, torch.arange(1))), 4000)
        v = policy_gradient(policy, theta.reshape(1, -1), big, 0.9)[0]
        for m_h in m_hs:
            stats = curvature_estimator_stats(policy, ARC_NAVIGATION, params, theta, v, m_h, n_batches, seed=12,
                                              keep_samples=True)
            base = stats["paper"].total_variance
            # No exact Hessian here: each estimator is compared with the unbiased causal one on the
            # same batches (paired differences: T² ≈ χ²(d) when the two have the same mean).
            reference = stats["causal"]
            for e, s in stats.items():
                row = {"setting": f"arc agent {agent}, {where}, v ≈ ∇J_i", "m_h": m_h, "estimator": e,
                       "variance_ratio": s.total_variance / base, "relative_bias": None, "max_abs_z": None,
                       "hotelling": None, "dof": None, "noise_ratio": s.total_variance ** 0.5 / float(v.norm())}
                if e != "causal":
                    t2, dof, zmax = hotelling(s.samples - reference.samples, torch.zeros_like(s.mean))
                    row.update(hotelling=t2, dof=dof, max_abs_z=zmax,
                               relative_bias=float((s.mean - reference.mean).norm() / reference.mean.norm()))
                out.append(row)
    return out


def curvature_clip_stats(
    theta: torch.Tensor, agent: int, m_h: int, n_batches: int, clips: Sequence[float], seed: int = 5, alpha: float = 1.0,
    m_in: int = 10, m_out: int = 10, baseline: str | None = "loo", curvature: str = "causal", gamma: float = 0.9,
) -> list[dict[str, Any]]:
    """The exact variant's whole step ``ĝ_out + αĤĝ_out`` on arc navigation against the same step with
    its curvature term clipped (:func:`~fedrl_algos.core.curvature.clip_curvature_term`) and against
    the first-order step ``ĝ_out``, over ``n_batches`` independent (m_in, m_out, m_h) batches of one agent.

    Reference: the unclipped step's mean (eq. (7) is unbiased for ``(I + α∇²J)E[ĝ_out]``); every
    variant is computed from the same batches, so the bias's standard error is that of the paired
    differences. One row per variant: the fraction of batches the clip shortens, the relative bias
    ``‖mean − reference‖ / ‖reference‖`` and its standard error, the cosine between the means, and
    the total variance and mean squared error (about the reference) relative to the unclipped step's.

    :param theta: parameters of the paper's MLP ``[d]`` (float32)
    :param agent: training goal index of :data:`~fedrl_envs.ARC_NAVIGATION`
    :param clips: the bounds ``c`` to compare
    :param baseline: baseline of ĝ_in and ĝ_out (:mod:`fedrl_algos.core.adaptation`)
    :param curvature: the curvature estimator
    :param gamma: discount (the arc experiment's 0.9)
    """
    from fedrl_algos.core.curvature import clip_curvature_term
    from fedrl_algos.per_fedavg_pg import FirstOrderMetaGradient
    from fedrl_algos.reproduce.neural import FastSampler, arc_policy, fast_rollout
    from fedrl_envs import ARC_NAVIGATION, stack_params

    policy = arc_policy("cpu", kernels="auto")
    n = check_int("n_batches", n_batches, 2)
    params = index_params(stack_params(ARC_NAVIGATION.train_tasks), torch.full((n,), int(agent)))
    th = theta.reshape(1, -1).to(torch.float32).expand(n, -1).contiguous()

    def streams(offset: int) -> RandomStreams:
        return RandomStreams(derive_keys(int(seed) + offset, torch.arange(n)))

    first_order = FirstOrderMetaGradient(policy, gamma, alpha, m_in, m_out, baseline, baseline)
    g_out = first_order(FastSampler(ARC_NAVIGATION, params, policy, streams(0)), th)
    traj = fast_rollout(ARC_NAVIGATION, params, policy, th, streams(1), check_int("m_h", m_h))
    term = alpha * curvature_vector_product(policy, th, traj, g_out, gamma, curvature)
    plain = (g_out + term).to(torch.float64)
    reference = plain.mean(0)
    scale = float(reference.norm())
    plain_var = float(plain.var(0).sum())
    plain_mse = float((plain - reference).square().sum(-1).mean())
    lengths = term.norm(dim=-1) / g_out.norm(dim=-1).clamp_min(torch.finfo(g_out.dtype).tiny)
    rows = []
    for name, clip in [(f"c = {c:g}", float(c)) for c in clips] + [("first order", None)]:
        step = (g_out if clip is None else g_out + clip_curvature_term(term, g_out, clip)).to(torch.float64)
        diff = step - plain
        rows.append({
            "variant": name, "m_h": m_h, "clipped": None if clip is None else float((lengths > clip).double().mean()),
            "relative_bias": float((step.mean(0) - reference).norm()) / scale,
            "bias_se": float((diff.var(0).sum() / n).sqrt()) / scale,
            "cosine": float(torch.nn.functional.cosine_similarity(step.mean(0), reference, dim=0)),
            "variance_ratio": float(step.var(0).sum()) / plain_var,
            "mse_ratio": float((step - reference).square().sum(-1).mean()) / plain_mse,
            "median_length": float(lengths.median()), "max_length": float(lengths.max()),
        })
    return rows


def _clip_rows(m_hs: Sequence[int], n_batches: int, clips: Sequence[float], trained_rounds: Sequence[int] = (50, 100)) -> list[dict[str, Any]]:
    from fedrl_algos.reproduce.neural import MetaSweep, arc_policy

    # where the exact variant collapses in the curvature experiment: after first-order rounds with
    # the same baselines (seed 0, the experiment's protocol)
    sweep = MetaSweep(arc_policy("cpu", kernels="auto"), [0], [None], inner_baseline="loo", outer_baseline="loo")
    points = []
    for k in range(1, max(trained_rounds) + 1):
        sweep.round()
        if k in trained_rounds:
            points.append((f"after {k} first-order rounds", sweep.thetas()[0, 0].clone()))
    out = []
    for (where, theta), agent, m_h in ((p, a, m) for p in points for a in (0, 3) for m in m_hs):
        for row in curvature_clip_stats(theta, agent, m_h, n_batches, clips):
            out.append({"setting": f"arc agent {agent}, {where}", **row})
    return out


def _fmt(x: Any, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the bias/variance tables (markdown) of the curvature estimators."""
    parser = argparse.ArgumentParser(prog="python -m fedrl_algos.reproduce.curvature_stats", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20000, help="independent Hessian batches (gridworld)")
    parser.add_argument("--arc-batches", type=int, default=2000, help="independent Hessian batches (arc navigation)")
    parser.add_argument("--m-hs", default="10,50", help="comma-separated m_h")
    parser.add_argument("--clips", default="", help="comma-separated bounds c of curvature_clip: print only the table of the "
                        "clipped exact step (arc navigation, causal curvature, leave-one-out baselines)")
    parser.add_argument("--clip-batches", type=int, default=4000, help="independent batches of the clip table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    m_hs = [int(x) for x in args.m_hs.split(",")]
    start = time.perf_counter()
    if args.clips:
        clips = [float(x) for x in args.clips.split(",")]
        print("| setting | m_h | variant | clipped | relative bias (± se) | cos | tr Cov / unclipped | MSE / unclipped |")
        print("|---|---|---|---|---|---|---|---|")
        clip_rows = _clip_rows(m_hs, args.clip_batches, clips)
        for r in clip_rows:
            print(f"| {r['setting']} | {r['m_h']} | {r['variant']} | {_fmt(r['clipped'], '.2f')} "
                  f"| {r['relative_bias']:.3f} ± {r['bias_se']:.3f} | {r['cosine']:.3f} | {r['variance_ratio']:.3f} | {r['mse_ratio']:.3f} |")
        print("\nAgainst the unclipped step ĝ_out + αĤĝ_out on the same batches (its mean is the reference). "
              "‖αĤĝ_out‖ / ‖ĝ_out‖ per batch: " + "; ".join(
                  f"{s}, m_h={m}: median {a:.2f}, max {b:.0f}" for s, m, a, b in dict.fromkeys(
                      (r["setting"], r["m_h"], r["median_length"], r["max_length"]) for r in clip_rows)))
        print(f"\n{time.perf_counter() - start:.1f} s ({args.clip_batches} batches per row)")
        return 0
    rows = _gridworld_rows(m_hs, args.batches) + _arc_rows(m_hs, args.arc_batches)
    print("| setting | m_h | estimator | tr Cov / paper's | √tr Cov / ‖v‖ | relative bias | max abs z | T² (dof) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        t2 = "—" if r["hotelling"] is None else f"{r['hotelling']:.1f} ({r['dof']})"
        print(f"| {r['setting']} | {r['m_h']} | {r['estimator']} | {r['variance_ratio']:.3f} | {r['noise_ratio']:.3g} "
              f"| {_fmt(r['relative_bias'], '.4f')} "
              f"| {_fmt(r['max_abs_z'], '.2f')} | {t2} |")
    print("\nGridworld: bias, z and T² against the exact ∇²J_i v (TabularEvaluator). Arc navigation: against the "
          "causal estimator on the same batches (relative difference of the means, paired z and T²).")
    print(f"\n{time.perf_counter() - start:.1f} s (gridworld {args.batches} batches, arc {args.arc_batches} batches per m_h)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
