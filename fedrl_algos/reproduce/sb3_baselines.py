"""The MFPO paper's federated SB3 baselines as an experiment: Fed-DQN, Fed-SAC (and Fed-PPO).

Settings and a runner for the comparison of ``fedrl reproduce mfpo`` (MFPO paper, section VI-A2):
:data:`SB3_BASELINE_DEFAULTS` names the SB3 algorithm and its default ``algorithm_kwargs`` per
baseline, :func:`run_fed_baseline` trains one of them with
:class:`~fedrl_algos.fedavg_sb3.FedAvgSB3` and returns evaluation records. They live here, not in
:mod:`fedrl_algos.fedavg_sb3`, because they are choices of an experiment, not of the algorithm; the
algorithm package never imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import MaybeCallback

from fedrl_algos.fedavg_sb3 import FedAvgSB3
from fedrl_envs.validation import check_int

__all__ = ["SB3_BASELINE_DEFAULTS", "run_fed_baseline", "StepsProgressCallback"]


def _sb3_class(name: str) -> type[BaseAlgorithm]:
    """The SB3 algorithm class called ``name`` (``"DQN"``, ``"SAC"``, ``"PPO"``, ...).

    The settings name their algorithm by string, so that they stay plain data (printable, comparable).

    :param name: an attribute of the ``stable_baselines3`` package
    """
    import stable_baselines3 as sb3

    return getattr(sb3, name)


#: name → (SB3 algorithm, default ``algorithm_kwargs`` for the classic-control families).
#: Small networks (64-64) and moderate buffers so that the comparison runs on a CPU; every entry
#: can be overridden through ``run_fed_baseline(..., algorithm_kwargs=...)``.
SB3_BASELINE_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "Fed-DQN": (
        "DQN",
        {
            "learning_rate": 1e-3,
            "buffer_size": 50_000,
            "learning_starts": 1_000,
            "batch_size": 64,
            "gamma": 0.99,
            "train_freq": 4,
            "gradient_steps": 1,
            "target_update_interval": 500,
            "exploration_fraction": 0.2,
            "exploration_final_eps": 0.05,
            "policy_kwargs": {"net_arch": [64, 64]},
        },
    ),
    "Fed-SAC": (
        "SAC",
        {
            "learning_rate": 1e-3,
            "buffer_size": 50_000,
            "learning_starts": 1_000,
            "batch_size": 128,
            "gamma": 0.99,
            "train_freq": 1,
            "gradient_steps": 1,
            "policy_kwargs": {"net_arch": [64, 64]},
        },
    ),
    "Fed-PPO": (
        "PPO",
        {"n_steps": 1024, "batch_size": 64, "gamma": 0.99, "policy_kwargs": {"net_arch": [64, 64]}},
    ),
}


def run_fed_baseline(
    algo: str,
    env_id: str,
    n_agents: int,
    total_steps: int,
    seed: int,
    *,
    sync_every: int | None = None,
    eval_every: int | None = None,
    eval_episodes: int = 10,
    aggregate: str = "policy",
    algorithm_kwargs: Mapping[str, Any] | None = None,
    device: str = "cpu",
    progress_bar: bool = False,
    agent_kwargs: Sequence[Mapping[str, Any]] | None = None,
    policy: str = "MlpPolicy",
    callback: MaybeCallback = None,
) -> list[dict[str, Any]]:
    """Train one federated SB3 baseline and return evaluation records (for ``fedrl reproduce mfpo``).

    The federation's model is evaluated on every agent's own MDP (``eval_episodes`` fresh
    deterministic episodes each, :meth:`FedAvgSB3.evaluate`) after the first round at or past each
    multiple of ``eval_every`` environment steps (summed over agents) and at the end.

    :param algo: ``"Fed-DQN"``, ``"Fed-SAC"`` or ``"Fed-PPO"`` (case-insensitive; ``"dqn"`` works)
    :param env_id: e.g. ``"fedrl/CartPole-v0"`` (DQN, PPO) or ``"fedrl/Pendulum-v0"`` (SAC, PPO)
    :param n_agents: the first ``n_agents`` agents of the family's default population
    :param total_steps: environment steps summed over all agents
    :param seed: seed of the run
    :param sync_every: steps per agent between synchronizations (default: :class:`FedAvgSB3`'s)
    :param eval_every: steps (over all agents) between evaluations (default: only at the end)
    :param eval_episodes: evaluation episodes per agent
    :param aggregate: ``"policy"`` or ``"all"``
    :param algorithm_kwargs: overrides of :data:`SB3_BASELINE_DEFAULTS`' defaults
    :param device: torch device of the networks
    :param progress_bar: show a progress bar
    :param agent_kwargs: the agents' ``gym.make`` keyword arguments (any Gymnasium id; then
        ``n_agents`` is their number)
    :param policy: the SB3 policy name (``"CnnPolicy"`` for image observations)
    :param callback: more SB3 callbacks for :meth:`FedAvgSB3.learn`, after the evaluation's (e.g. a
        :class:`StepsProgressCallback`)
    :return: one dict per evaluation: ``method``, ``env_id``, ``seed``, ``n_agents``, ``round``,
        ``env_steps`` (over all agents), ``env_steps_per_agent``, ``eval_return`` (mean over
        agents), ``eval_return_std`` (spread over agents), ``eval_return_per_agent`` (list),
        ``train_return`` (mean recent training episode return, ``None`` before any episode),
        ``wall_time_s`` (since the start of training)
    """
    # "Fed-DQN", "fed-dqn" and "dqn" all name the same baseline
    names = {name.lower(): name for name in SB3_BASELINE_DEFAULTS} | {name.lower()[4:]: name for name in SB3_BASELINE_DEFAULTS}
    if not isinstance(algo, str) or algo.lower() not in names:
        raise ValueError(f"algo must be one of {sorted(SB3_BASELINE_DEFAULTS)}, got {algo!r}")
    method = names[algo.lower()]
    class_name, defaults = SB3_BASELINE_DEFAULTS[method]
    total_steps = check_int("total_steps", total_steps, low=1)
    if eval_every is not None:
        eval_every = check_int("eval_every", eval_every, low=1)
    kwargs = {**defaults, **dict(algorithm_kwargs or {})}
    model = FedAvgSB3(
        _sb3_class(class_name), env_id, n_agents=None if agent_kwargs is not None else n_agents, agent_kwargs=agent_kwargs,
        sync_every=sync_every, aggregate=aggregate, seed=seed, algorithm_kwargs=kwargs, policy=policy, device=device,
    )
    records: list[dict[str, Any]] = []
    start = time.perf_counter()

    def record() -> None:
        per_agent = model.evaluate(eval_episodes, seed=seed + 1_000_003)
        rewards = [float(np.mean([ep["r"] for ep in m.ep_info_buffer])) for m in model.agents if m.ep_info_buffer]
        records.append(
            {
                "method": method,
                "env_id": env_id,
                "seed": seed,
                "n_agents": model.n_agents,
                "round": model.rounds_done,
                "env_steps": int(model.num_timesteps),
                "env_steps_per_agent": int(model.num_timesteps // model.n_agents),
                "eval_return": float(per_agent.mean()),
                "eval_return_std": float(per_agent.std()),
                "eval_return_per_agent": [float(x) for x in per_agent],
                "train_return": float(np.mean(rewards)) if rewards else None,
                "wall_time_s": time.perf_counter() - start,
            }
        )

    class _Evaluate(BaseCallback):
        # evaluates after the first round at or past each multiple of eval_every (on_step runs once per round)
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = eval_every

        def _on_step(self) -> bool:
            if self.next_eval is not None and self.model.num_timesteps >= self.next_eval:
                record()
                while self.next_eval <= self.model.num_timesteps:
                    self.next_eval += eval_every  # type: ignore[operator]
            return True

    extra = [] if callback is None else list(callback) if isinstance(callback, list) else [callback]
    model.learn(total_steps, callback=[_Evaluate(), *extra], progress_bar=progress_bar)
    if not records or records[-1]["env_steps"] != model.num_timesteps:
        record()
    model.close()
    return records


class StepsProgressCallback(BaseCallback):
    """Advances a tqdm bar by the environment steps per agent of every round of a :class:`FedAvgSB3`
    (whose callbacks' ``on_step`` runs once per round), so that one bar with an ETA can span
    several runs, e.g. all seeds of ``fedrl reproduce mfpo``'s Fed-DQN.

    :param bar: a ``tqdm`` bar whose total counts environment steps per agent
    :param n_agents: the federation's agents
    """

    def __init__(self, bar: Any, n_agents: int) -> None:
        super().__init__()
        self.bar = bar
        self.n_agents = check_int("n_agents", n_agents, low=1)
        self._last = 0

    def _on_training_start(self) -> None:
        self._last = self.model.num_timesteps

    def _on_step(self) -> bool:
        now = self.model.num_timesteps
        # whole rounds may overshoot the run's budget: the bar stops at its total
        left = self.bar.total - self.bar.n if self.bar.total is not None else float("inf")
        self.bar.update(min((now - self._last) / self.n_agents, left))
        self._last = now
        return True
