"""Signal-to-noise ratio of a policy-gradient estimate (``python -m fedrl_algos.reproduce.gradient_snr``).

:func:`batch_snr` summarizes per-episode gradient terms ``g_j`` (``[n, d]``, their mean is the
batch estimate): the noise ``tr Σ`` (unbiased sample covariance), the unbiased squared signal
``‖μ‖² = ‖ḡ‖² − tr Σ / n``, the episodes per batch at which a batch mean's expected squared signal
equals its noise (``tr Σ / ‖μ‖²``), and the mean cosine between the means of disjoint batches of
``k`` episodes (``≈ ‖μ‖² / (‖μ‖² + tr Σ / k)``). :func:`atari_gradient_snr` measures it for MFPO's
Pong/Breakout setting at the initial Nature-CNN policy (``docs/reproduction_mfpo.md``): one batch of
``episodes`` 250-step episodes per agent, GPOMDP terms with the leave-one-out baseline over the batch.
With ``baseline="critic"`` the first ``fit_episodes`` episodes fit every agent's Nature-CNN critic
(:class:`~fedrl_algos.policies.critics.CnnCritic`: minibatch Adam on the returns-to-go, ``critic_epochs``
passes) and the others are measured twice: with GAE(λ = 1) advantages ``G^h − V(s_h)`` from the
frozen critic, and with the leave-one-out baseline over those same episodes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import torch

from fedrl_envs.validation import check_int

__all__ = ["atari_gradient_snr", "batch_snr", "main"]


def batch_snr(per_episode: torch.Tensor, batch_sizes: Sequence[int] = (4, 10)) -> dict[str, Any]:
    """Noise, signal and disjoint-batch cosines of per-episode gradient terms ``[n, d]`` (``n >= 2``).

    :param per_episode: one gradient term per episode (their mean is the estimate)
    :param batch_sizes: k of the disjoint-batch cosines (those with ``2k > n`` are skipped)
    :return: ``trace`` (tr Σ), ``signal_sq`` (‖μ‖², may come out negative when the signal is below
        the noise of ``n`` episodes), ``episodes_for_unit_snr`` (tr Σ / ‖μ‖², ``None`` unless
        ‖μ‖² > 0) and ``cosine`` (``{k: mean cosine over pairs of disjoint k-episode means}``)
    """
    if per_episode.dim() != 2 or per_episode.shape[0] < 2:
        raise ValueError(f"per_episode must be [n, d] with n >= 2, got shape {tuple(per_episode.shape)}")
    g = per_episode.double()
    n = g.shape[0]
    mean = g.mean(0)
    trace = float(((g - mean) ** 2).sum() / (n - 1))
    signal_sq = float(mean.pow(2).sum()) - trace / n
    cosine: dict[int, float] = {}
    for k in batch_sizes:
        k = check_int("batch_sizes[]", k, 1)
        if 2 * k > n:
            continue
        pieces = g[: (n // k) * k].reshape(n // k, k, -1).mean(1)
        unit = pieces / pieces.norm(dim=-1, keepdim=True).clamp(min=1e-300)
        sim = unit @ unit.T
        cosine[k] = float(sim[~torch.eye(len(pieces), dtype=torch.bool)].mean())
    return {"trace": trace, "signal_sq": signal_sq, "episodes_for_unit_snr": trace / signal_sq if signal_sq > 0 else None,
            "cosine": cosine}


def _per_episode_terms(policy, theta: torch.Tensor, traj, psi: torch.Tensor, chunk: int = 10) -> torch.Tensor:
    """The library's per-trajectory GPOMDP terms ``[agents, episodes, d]``, a chunk of episodes at a
    time: all episodes in one graph would hold every frame's CNN activations at once."""
    from fedrl_algos.core.gpomdp import score_gradient
    from fedrl_algos.core.trajectories import Trajectories

    return torch.cat([
        score_gradient(policy, theta, Trajectories(*(x[:, :, j:j + chunk] for x in traj)), psi[:, :, j:j + chunk],
                       per_trajectory=True).detach()[0]
        for j in range(0, traj.rewards.shape[-2], chunk)
    ], -2)


def _explained_variance(values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """``1 − Var(G − V) / Var(G)`` over the running steps of each agent (``[1, agents, m, T]``)."""
    alive = mask[0] > 0
    out = []
    for i in range(alive.shape[0]):
        g, v = targets[0, i][alive[i]].double(), values[0, i][alive[i]].double()
        out.append(float(1 - (g - v).var() / g.var().clamp(min=1e-300)))
    return out


def atari_gradient_snr(game: str = "pong", episodes: int = 200, seed: int = 0, gamma: float = 0.95, discounting: str = "relative",
                       batch_sizes: Sequence[int] = (4, 10, 100), baseline: str = "loo", fit_episodes: int | None = None,
                       critic_epochs: int = 3, critic_batch: int = 5, critic_lr: float = 1e-3) -> dict[str, Any]:
    """:func:`batch_snr` of every agent at the initial policy of MFPO's Atari runs (2 agents, 250-step episodes).

    :param game: ``"pong"`` or ``"breakout"``
    :param episodes: episodes per agent (with ``baseline="critic"``, the fit's and the measured ones)
    :param seed: seed of the population (policy initialization, critic initialization and env streams)
    :param gamma: discount of the GPOMDP terms
    :param discounting: ``"absolute"`` or ``"relative"``
    :param batch_sizes: k of the disjoint-batch cosines
    :param baseline: ``"loo"`` (leave-one-out over all episodes) or ``"critic"``: the first
        ``fit_episodes`` fit each agent's Nature-CNN critic, the rest are measured with its GAE(λ = 1)
        advantages (``"agents"``) and with the leave-one-out baseline over them (``"loo_agents"``)
    :param fit_episodes: the critic's episodes (default: half of ``episodes``)
    :param critic_epochs: passes of the critic's fit over its episodes
    :param critic_batch: episodes per Adam step of the fit (the targets' statistics μ, σ are those
        of all fit episodes, set once)
    :param critic_lr: Adam step size of the fit
    :return: ``{"agents": [batch_snr of agent 0, ...], "return": mean return per agent, "seconds": wall time}``
        and, with the critic, ``"loo_agents"``, ``"explained_variance"`` (``1 − Var(G − V)/Var(G)``
        per agent on the ``"fit"`` and the ``"measured"`` episodes), ``"fit_seconds"``
    """
    from fedrl_algos.core.critic import critic_step_weights
    from fedrl_algos.core.gpomdp import gpomdp_weights
    from fedrl_algos.core.trajectories import Trajectories
    from fedrl_algos.policies.critics import critic_for_space
    from fedrl_algos.reproduce.mfpo import MethodConfig, Population

    if game not in ("pong", "breakout"):
        raise ValueError(f"game must be 'pong' or 'breakout', got {game!r}")
    if baseline not in ("loo", "critic"):
        raise ValueError(f"baseline must be 'loo' or 'critic', got {baseline!r}")
    episodes = check_int("episodes", episodes, 2 if baseline == "loo" else 4)
    start = time.perf_counter()
    pop = Population(game, [seed], 2, MethodConfig(n_envs=min(episodes, 20), horizon=249))
    theta = pop.initial_theta().unsqueeze(1).expand(1, 2, -1).contiguous()
    traj = pop.federation.sampler(theta, episodes)
    returns = traj.rewards.sum(-1).mean(-1).reshape(-1).tolist()
    if baseline == "loo":
        per_episode = _per_episode_terms(pop.policy, theta, traj, gpomdp_weights(traj, gamma, "loo", discounting))
        return {"agents": [batch_snr(per_episode[i], batch_sizes) for i in range(per_episode.shape[0])],
                "return": returns, "seconds": time.perf_counter() - start}
    n_fit = episodes // 2 if fit_episodes is None else check_int("fit_episodes", fit_episodes, 1)
    if not 1 <= n_fit <= episodes - 2:
        raise ValueError(f"fit_episodes must leave at least 2 of the {episodes} episodes to measure, got {n_fit}")
    fit = Trajectories(*(x[:, :, :n_fit] for x in traj))
    measured = Trajectories(*(x[:, :, n_fit:] for x in traj))
    critic = critic_for_space(pop.observation_space)
    state = critic.initial_state(critic.initial_phi(seed, theta.dtype).expand(1, 2, -1).clone())
    _, fit_targets = critic_step_weights(torch.zeros_like(fit.rewards), fit.rewards, fit.mask, gamma, 1.0, discounting)
    fit_start = time.perf_counter()
    state = critic.normalized_to(state, fit_targets, fit.mask)
    order = torch.Generator().manual_seed(seed)
    for _ in range(check_int("critic_epochs", critic_epochs, 0)):
        perm = torch.randperm(n_fit, generator=order)
        for j in range(0, n_fit, critic_batch):
            idx = perm[j:j + critic_batch]
            state = critic.regress(state, fit.obs[:, :, idx], fit_targets[:, :, idx], fit.mask[:, :, idx], 1, critic_lr)
    fit_seconds = time.perf_counter() - fit_start

    def values_of(t: Trajectories) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([critic.values(state, t.obs[:, :, j:j + 10], 4) for j in range(0, t.rewards.shape[-2], 10)], -2)

    values = values_of(measured).to(measured.rewards.dtype)
    psi, targets = critic_step_weights(values, measured.rewards, measured.mask, gamma, 1.0, discounting)
    per_episode = _per_episode_terms(pop.policy, theta, measured, psi)
    loo = _per_episode_terms(pop.policy, theta, measured, gpomdp_weights(measured, gamma, "loo", discounting))
    return {"agents": [batch_snr(per_episode[i], batch_sizes) for i in range(per_episode.shape[0])],
            "loo_agents": [batch_snr(loo[i], batch_sizes) for i in range(loo.shape[0])],
            "explained_variance": {"fit": _explained_variance(values_of(fit), fit_targets, fit.mask),
                                   "measured": _explained_variance(values, targets, measured.mask)},
            "fit_episodes": n_fit, "critic_epochs": critic_epochs, "critic_batch": critic_batch, "critic_lr": critic_lr,
            "return": returns, "fit_seconds": fit_seconds, "seconds": time.perf_counter() - start}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedrl_algos.reproduce.gradient_snr", description=__doc__.split("\n")[0])
    parser.add_argument("--game", choices=["pong", "breakout"], default="pong")
    parser.add_argument("--episodes", type=int, default=200, help="episodes per agent (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gamma", type=float, default=0.95)
    parser.add_argument("--discounting", choices=["absolute", "relative"], default="relative")
    parser.add_argument("--baseline", choices=["loo", "critic"], default="loo",
                        help="loo: leave-one-out over all episodes; critic: fit each agent's Nature-CNN critic on the first half, "
                             "measure GAE(1) advantages (and leave-one-out) on the second (default loo)")
    parser.add_argument("--critic-epochs", type=int, default=3, help="passes of the critic's fit over its episodes (default 3)")
    parser.add_argument("--critic-batch", type=int, default=5, help="episodes per Adam step of the critic's fit (default 5)")
    parser.add_argument("--critic-lr", type=float, default=1e-3, help="Adam step size of the critic's fit (default 1e-3)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                        help="k of the disjoint-batch cosines (default 4 10 100; with the critic 4 10 and half the measured episodes)")
    args = parser.parse_args(argv)
    if args.batch_sizes is None:
        args.batch_sizes = [4, 10, 100] if args.baseline == "loo" else [4, 10, max(2, (args.episodes - args.episodes // 2) // 2)]
    print(json.dumps(atari_gradient_snr(args.game, args.episodes, args.seed, args.gamma, args.discounting, args.batch_sizes, args.baseline,
                                        critic_epochs=args.critic_epochs, critic_batch=args.critic_batch, critic_lr=args.critic_lr),
                     indent=1))


if __name__ == "__main__":
    main()
