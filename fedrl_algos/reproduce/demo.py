"""``fedrl demo``: meta-train on the arc, personalize to unseen goals, compare with learning from scratch.

The whole story of the Per-FedAvg-PG paper's main experiment in well under a minute on two CPU cores:

1. ``PerFedAvgPG("MlpPolicy", "fedrl/ArcNavigation-v0", variant="first_order")`` learns a shared
   initialization on the 6 training goals (the paper's K=150 rounds, τ=5, α=1, β=0.2,
   m_in=m_out=10 by default);
2. ``model.adapt(heldout_tasks, n_trajectories=200)`` personalizes it to each of the 3 held-out
   goals with one policy-gradient step;
3. ``IndependentPG`` trains each held-out agent from a fresh initialization with the same number
   of trajectories (10 steps of 20);
4. a table of held-out return and success (zero-shot, adapted, from scratch) and a PNG of held-out
   rollouts before and after adaptation.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from fedrl_algos._cli_args import positive_int
from fedrl_envs.core import check_device

__all__ = ["run_demo", "register"]


def run_demo(
    rounds: int = 150,
    seed: int = 0,
    device: str = "cpu",
    out: str | Path = "fedrl-demo",
    adapt_trajectories: int = 200,
    eval_trajectories: int = 1000,
    n_drawn: int = 12,
    progress_bar: bool = True,
    verbose: bool = True,
) -> dict[str, dict[str, float]]:
    """Run the demo; returns ``{method: {"return", "success"}}`` and writes ``out/heldout_rollouts.png``.

    :param rounds: meta-training communication rounds
    :param seed: seed of every random stream
    :param device: torch device (``"cpu"``, ``"cuda"``, ``"auto"``)
    :param out: output directory
    :param adapt_trajectories: trajectories of the adaptation step (and the from-scratch budget)
    :param eval_trajectories: evaluation rollouts per held-out goal
    :param n_drawn: rollouts drawn per goal in the figure
    """
    from fedrl_algos import IndependentPG, PerFedAvgPG
    from fedrl_algos.reproduce.neural import (
        FRESH_INIT_OFFSET,
        draw_arc_rollouts,
        episode_success,
        evaluate_rows,
        fast_rollout,
    )
    from fedrl_envs import (
        ARC_NAVIGATION,
        FamilyVectorEnv,
        RandomStreams,
        derive_keys,
        index_params,
        params_to,
        stack_params,
    )

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(check_device(device))
    start = time.perf_counter()
    heldout = ARC_NAVIGATION.heldout_tasks
    n_goals = len(heldout)
    say = print if verbose else (lambda *a, **k: None)
    say(f"Meta-training first-order Per-FedAvg-PG on the 6 training goals ({rounds} rounds, seed {seed}, {device})")
    model = PerFedAvgPG(
        "MlpPolicy", "fedrl/ArcNavigation-v0", variant="first_order", alpha=1.0, step_size=0.2, local_steps=5, m_in=10, m_out=10,
        seed=seed, device=device,
    )
    model.learn(total_rounds=rounds, progress_bar=progress_bar)
    train_time = time.perf_counter() - start
    adapted = model.adapt(list(heldout), n_trajectories=adapt_trajectories)
    steps = max(1, adapt_trajectories // 20)
    scratch = IndependentPG(
        "MlpPolicy", FamilyVectorEnv(ARC_NAVIGATION, heldout, device=device, seed=seed), n_trajectories=20, step_size=0.2, local_steps=1,
        seed=seed, device=device, policy_kwargs=dict(init_seed=FRESH_INIT_OFFSET + seed),
    ).learn(total_rounds=steps)
    policy = model.policy
    theta = torch.stack([
        model.theta.expand(n_goals, -1),
        torch.stack([p.theta.detach() for p in adapted]),
        scratch.agent_theta.detach(),
    ]).to(policy.theta.device)  # [3 methods, goals, d]
    params = params_to(index_params(stack_params(list(heldout)), torch.arange(n_goals).repeat(3)), policy.theta.device)
    keys = derive_keys(seed, torch.arange(3 * n_goals).reshape(3, n_goals) + (1 << 46))
    ret, succ = evaluate_rows(ARC_NAVIGATION, params, policy, theta, RandomStreams(keys, policy.theta.device),
                              eval_trajectories)
    names = ["meta-init, zero-shot", f"meta-init + 1 PG step ({adapt_trajectories} traj.)",
             f"from scratch ({steps} PG steps × 20 = {steps * 20} traj.)"]
    keys_out = ["zero_shot", "adapted", "from_scratch"]
    results = {k: {"return": float(ret[i].mean()), "success": float(succ[i].mean())} for i, k in enumerate(keys_out)}
    width = max(len(n) for n in names)
    say("")
    say(f"Held-out goals (never seen in training), {eval_trajectories} rollouts per goal, return discounted γ=0.9:")
    say(f"  {'':{width}}  {'return':>7}  {'success':>7}   per goal (return)")
    for i, name in enumerate(names):
        per_goal = "  ".join(f"{float(v):.2f}" for v in ret[i])
        say(f"  {name:{width}}  {float(ret[i].mean()):7.2f}  {float(succ[i].mean()):7.0%}   {per_goal}")
    # figure: the same start states and random numbers before and after adaptation
    draw_theta = theta[:2]
    draw_params = params_to(index_params(stack_params(list(heldout)), torch.arange(n_goals).repeat(2)), policy.theta.device)
    draw_keys = derive_keys(seed, torch.arange(n_goals).reshape(1, n_goals).expand(2, n_goals) + (1 << 47))
    traj = fast_rollout(ARC_NAVIGATION, draw_params, policy, draw_theta, RandomStreams(draw_keys, policy.theta.device), n_drawn)
    goals = draw_params.goal.reshape(2, n_goals, 2)
    success = episode_success(ARC_NAVIGATION, dataclasses.replace(draw_params, goal=goals), traj)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = draw_arc_rollouts(
        {
            "positions": traj.obs.cpu().tolist(),
            "success": success.cpu().tolist(),
            "goals": [t.goal.tolist() for t in heldout],
            "train_goals": [t.goal.tolist() for t in ARC_NAVIGATION.train_tasks],
            "radius": float(heldout[0].goal_radius),
            "m_adapt": adapt_trajectories,
        },
        out_dir / "heldout_rollouts.png",
    )
    say("")
    say(f"Held-out rollouts before/after adaptation: {path}")
    say(f"Meta-training {train_time:.1f} s, total {time.perf_counter() - start:.1f} s.")
    return results


def _cmd_demo(args: argparse.Namespace) -> int:
    from fedrl_algos.reproduce.neural import cpu_threads

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    try:
        device = str(check_device(device, "--device"))
    except ValueError as err:
        raise SystemExit(f"fedrl demo: error: {err}") from None
    with cpu_threads(device):  # small ops: one intra-op thread on CPU (see neural.CPU_THREADS)
        run_demo(rounds=args.rounds, seed=args.seed, device=device, out=args.out,
                 adapt_trajectories=args.adapt_trajectories, progress_bar=not args.no_progress)
    return 0



def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fedrl demo`` to the ``fedrl`` parser."""
    demo = subparsers.add_parser(
        "demo",
        help="meta-train on arc navigation, adapt to unseen goals, compare with learning from scratch",
        description="Meta-trains first-order Per-FedAvg-PG on the 6 arc-navigation training goals, adapts the "
        "initialization to the 3 held-out goals with one policy-gradient step, compares with from-scratch "
        "training at the same budget and draws held-out rollouts before and after adaptation.",
    )
    demo.add_argument("--rounds", type=positive_int, default=150, help="meta-training communication rounds (default: 150)")
    demo.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    demo.add_argument("--device", default="cpu", help="torch device: cpu, cuda or auto (default: cpu)")
    demo.add_argument("--out", default="fedrl-demo", help="output directory of the figure (default: fedrl-demo)")
    demo.add_argument("--adapt-trajectories", type=positive_int, default=200,
                      help="trajectories of the adaptation step and from-scratch budget (default: 200)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_cmd_demo)
