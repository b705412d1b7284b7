"""Signal-to-noise ratio of a policy-gradient estimate (``python -m fedrl_algos.reproduce.gradient_snr``).

:func:`batch_snr` summarizes per-episode gradient terms ``g_j`` (``[n, d]``, their mean is the
batch estimate): the noise ``tr Σ`` (unbiased sample covariance), the unbiased squared signal
``‖μ‖² = ‖ḡ‖² − tr Σ / n``, the episodes per batch at which a batch mean's expected squared signal
equals its noise (``tr Σ / ‖μ‖²``), and the mean cosine between the means of disjoint batches of
``k`` episodes (``≈ ‖μ‖² / (‖μ‖² + tr Σ / k)``). :func:`atari_gradient_snr` measures it for MFPO's
Pong/Breakout setting at the initial Nature-CNN policy (``docs/reproduction_mfpo.md``): one batch of
``episodes`` 250-step episodes per agent, GPOMDP terms with the leave-one-out baseline over the batch.
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


def atari_gradient_snr(game: str = "pong", episodes: int = 200, seed: int = 0, gamma: float = 0.95, discounting: str = "relative",
                       batch_sizes: Sequence[int] = (4, 10, 100)) -> dict[str, Any]:
    """:func:`batch_snr` of every agent at the initial policy of MFPO's Atari runs (2 agents, 250-step episodes).

    :param game: ``"pong"`` or ``"breakout"``
    :param episodes: episodes per agent
    :param seed: seed of the population (policy initialization and env streams)
    :param gamma: discount of the GPOMDP terms
    :param discounting: ``"absolute"`` or ``"relative"``
    :param batch_sizes: k of the disjoint-batch cosines
    :return: ``{"agents": [batch_snr of agent 0, ...], "return": mean return per agent, "seconds": wall time}``
    """
    from fedrl_algos.core.gpomdp import gpomdp_weights, score_gradient
    from fedrl_algos.core.trajectories import Trajectories
    from fedrl_algos.reproduce.mfpo import MethodConfig, Population

    if game not in ("pong", "breakout"):
        raise ValueError(f"game must be 'pong' or 'breakout', got {game!r}")
    episodes = check_int("episodes", episodes, 2)
    start = time.perf_counter()
    pop = Population(game, [seed], 2, MethodConfig(n_envs=min(episodes, 20), horizon=249))
    theta = pop.initial_theta().unsqueeze(1).expand(1, 2, -1).contiguous()
    traj = pop.federation.sampler(theta, episodes)
    psi = gpomdp_weights(traj, gamma, "loo", discounting)
    # The library's per-trajectory terms, a chunk of episodes at a time: all episodes in one graph
    # would hold every frame's CNN activations at once.
    chunk = 10
    per_episode = torch.cat([
        score_gradient(pop.policy, theta, Trajectories(*(x[:, :, j:j + chunk] for x in traj)), psi[:, :, j:j + chunk],
                       per_trajectory=True).detach()[0]
        for j in range(0, episodes, chunk)
    ], -2)  # [agents, episodes, d]
    return {"agents": [batch_snr(per_episode[i], batch_sizes) for i in range(per_episode.shape[0])],
            "return": traj.rewards.sum(-1).mean(-1).reshape(-1).tolist(), "seconds": time.perf_counter() - start}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedrl_algos.reproduce.gradient_snr", description=__doc__.split("\n")[0])
    parser.add_argument("--game", choices=["pong", "breakout"], default="pong")
    parser.add_argument("--episodes", type=int, default=200, help="episodes per agent (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gamma", type=float, default=0.95)
    parser.add_argument("--discounting", choices=["absolute", "relative"], default="relative")
    args = parser.parse_args(argv)
    print(json.dumps(atari_gradient_snr(args.game, args.episodes, args.seed, args.gamma, args.discounting), indent=1))


if __name__ == "__main__":
    main()
