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

import dataclasses
import textwrap
import time
from pathlib import Path

import torch

from fedrl_envs.validation import check_device

__all__ = ["run_demo", "adaptation_notes"]


def adaptation_notes(
    zero_shot: torch.Tensor, adapted: torch.Tensor, zero_shot_success: torch.Tensor, adapt_trajectories: int, eval_trajectories: int,
    step_size: float = 1.0,
) -> list[str]:
    """The table's footnote: why adaptation lowered the return of the goals marked ``*`` (none: no lines).

    :param zero_shot: held-out return of the meta-initialization, per goal ``[goals]``
    :param adapted: held-out return after the adaptation step, per goal ``[goals]``
    :param zero_shot_success: success rate of the meta-initialization, per goal ``[goals]``
    :param adapt_trajectories: trajectories per goal of the adaptation step
    :param eval_trajectories: evaluation rollouts per goal behind every number of the table
    :param step_size: α of the adaptation step
    :return: the lines to print
    """
    lowered = [j for j in range(zero_shot.numel()) if adapted[j] < zero_shot[j]]
    if not lowered:
        return []
    which = ", ".join(f"goal {j} ({float(zero_shot[j]):.2f} -> {float(adapted[j]):.2f}, zero-shot success "
                      f"{float(zero_shot_success[j]):.0%})" for j in lowered)
    text = (
        f"adaptation lowered the return of {which}. Adaptation is a single policy-gradient step of size "
        f"α = {step_size:g} (the meta-training's α) from {adapt_trajectories} trajectories of each goal: a noisy gradient "
        "estimate and a large step. Per-FedAvg-PG trains the initialization for the mean return after that step over "
        "the goals, not for every goal's; on a goal that the initialization already solves there is little to gain and "
        "the full step can overshoot, so that goal's return drops while the mean rises. It is not evaluation noise: "
        f"every number is a mean over {eval_trajectories} rollouts. More adaptation trajectories make the step less "
        "noisy, not smaller (README, `fedrl demo`)."
    )
    return textwrap.wrap(text, width=110, initial_indent="  * ", subsequent_indent="    ")


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
    :param progress_bar: show meta-training's progress bar (stderr)
    :param verbose: print the table (stdout)
    """
    from fedrl_algos import IndependentPG, PerFedAvgPG
    from fedrl_algos.reproduce.neural import (
        FRESH_INIT_OFFSET,
        episode_success,
        evaluate_rows,
        fast_rollout,
    )
    from fedrl_algos.reproduce.plots.neural import draw_arc_rollouts
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
    say(f"Held-out goals (never seen in training), {eval_trajectories} evaluation rollouts per goal.")
    say("Return: discounted (γ=0.9) count of steps spent in the goal region; success: share of episodes that enter it.")
    say(f"  {'':{width}}  {'mean':>15}   " + "   ".join(f"{f'goal {j}':>15}" for j in range(n_goals)))
    say(f"  {'':{width}}  {'return success':>15}   " + "   ".join(f"{'return success':>15}" for _ in range(n_goals)))
    for i, name in enumerate(names):
        per_goal = "   ".join(f"{float(ret[i, j]):6.2f} {float(succ[i, j]):7.0%}{'*' if i == 1 and ret[1, j] < ret[0, j] else ' '}"
                               for j in range(n_goals))
        say(f"  {name:{width}}  {float(ret[i].mean()):6.2f} {float(succ[i].mean()):7.0%}    {per_goal}")
    for line in adaptation_notes(ret[0], ret[1], succ[0], adapt_trajectories, eval_trajectories, step_size=model.alpha):
        say(line)
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
            # the table's success rates (zero-shot, adapted) next to the drawn rollouts' count
            "eval_success": succ[:2].cpu().tolist(),
            "eval_trajectories": eval_trajectories,
        },
        out_dir / "heldout_rollouts.png",
    )
    say("")
    say(f"Held-out rollouts before/after adaptation: {path}")
    say(f"Meta-training {train_time:.1f} s, total {time.perf_counter() - start:.1f} s.")
    return results
