"""Policies sampling every action in the loop of the env benchmarks' rollouts (``fedrl bench envs``,
``fedrl bench memory``): per-agent parameters from counter-based streams, actions by inverse CDF."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__: list[str] = []


def _inverse_cdf(cdf: Any, u: Any) -> Any:
    return (cdf <= u.unsqueeze(-1)).sum(-1).clamp_(max=cdf.shape[-1] - 1)


def _tabular_policy(venv: Any, seed: int) -> Callable[[Any], Any]:
    """Per-agent softmax over a logits table ``[n_agents, S, A]``, gathered by observation."""
    import torch

    from fedrl_envs import RandomStreams, derive_keys

    n_states, n_actions = int(venv.single_observation_space.n), int(venv.single_action_space.n)
    init = RandomStreams(derive_keys(seed, torch.arange(venv.n_agents)), venv.device)
    logits = init.normal((n_states, n_actions))
    # The policy is fixed during a rollout: its CDF table [n_agents * S, A] is computed once.
    cdf = torch.softmax(logits, dim=-1).cumsum(-1).reshape(venv.n_agents * n_states, n_actions)
    row_offset = (torch.arange(venv.n_agents, device=venv.device) * n_states).unsqueeze(1)
    streams = RandomStreams(derive_keys(seed + 1, torch.arange(venv.n_agents)), venv.device)

    def policy(obs: Any) -> Any:  # obs [n_agents, n_envs]
        rows = torch.index_select(cdf, 0, (obs + row_offset).reshape(-1)).reshape(*obs.shape, n_actions)
        return _inverse_cdf(rows, streams.uniform((venv.n_envs,)))

    return policy


def _mlp_policy(venv: Any, seed: int, hidden: int = 32) -> Callable[[Any], Any]:
    """Per-agent MLP obs → hidden tanh → action logits (2 → 32 → 8: 360 parameters per agent)."""
    import torch

    from fedrl_envs import RandomStreams, derive_keys

    obs_dim, n_actions = int(venv.single_observation_space.shape[0]), int(venv.single_action_space.n)
    init = RandomStreams(derive_keys(seed, torch.arange(venv.n_agents)), venv.device)
    w1 = init.normal((obs_dim, hidden)) / obs_dim**0.5
    b1 = torch.zeros(venv.n_agents, 1, hidden, device=venv.device)
    w2 = init.normal((hidden, n_actions)) / hidden**0.5
    b2 = torch.zeros(venv.n_agents, 1, n_actions, device=venv.device)
    streams = RandomStreams(derive_keys(seed + 1, torch.arange(venv.n_agents)), venv.device)

    def policy(obs: Any) -> Any:  # obs [n_agents, n_envs, obs_dim]
        h = torch.tanh(torch.baddbmm(b1, obs, w1))
        logits = torch.baddbmm(b2, h, w2)
        cdf = torch.softmax(logits, dim=-1).cumsum(-1)
        return _inverse_cdf(cdf, streams.uniform((venv.n_envs,)))

    return policy
