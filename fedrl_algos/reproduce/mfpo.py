"""The MFPO paper's comparison (section VI) and FedPG-BR's Byzantine experiment.

* ``mfpo`` — MFPO, FedPG-BR and FedAvg-PG on the heterogeneous ``fedrl/CartPole-v0`` (or
  ``fedrl/Pendulum-v0``: option ``env``) family with 10 agents, K = 10, D = 20: evaluation return
  against environment steps per agent and against communication rounds (figs. 3), Table I; then
  MFPO's number-of-agents sweep N ∈ {1, 5, 10, 20, 50} (fig. 5) and local-steps sweep
  K ∈ {1, 5, 10, 20, 50} (fig. 6). Fed-DQN (discrete actions) or Fed-SAC (continuous) runs as the
  federated SB3 baseline, by default at the reduced budget of :data:`SB3_REDUCED_BUDGETS`.
* ``byzantine`` — FedPG-BR and FedAvg-PG with no attack and with 3 of 10 Byzantine agents under
  random noise and sign flipping (records carry ``attack``).

Every method runs all seeds as one batched program (rows ``[seed, agent]``); loops run over rounds
and local steps only. Records: ``experiment``, ``part``, ``method``, ``env``, ``seed``, ``round``,
``step`` (environment steps per agent, counted until each episode ends), ``trajectories`` (per
agent), ``return`` (undiscounted evaluation return of the server policy, averaged over the agents'
tasks), plus ``attack``, ``n_agents``, ``local_steps`` where they vary.

Settings are frozen configs, one per experiment: :class:`MFPOConfig` (``env``
(``cartpole``/``pendulum``/``halfcheetah``/``hopper``/``pong``/``breakout``), ``budget`` (environment
steps per agent of the comparison, default the paper's 1e6 on classic control and the reduced
:data:`REDUCED_BUDGETS` on MuJoCo/Atari), ``sweep_budget`` (of each sweep run, the same defaults),
``comparison`` and ``sweeps`` (run those
parts), ``sb3_baselines`` (run Fed-DQN/Fed-SAC), ``sb3_budget`` (their steps per agent), the sweeps'
N and K, and the methods' :class:`MethodConfig`) and :class:`ByzantineConfig`; ``config.quick()`` is
the seconds-long smoke version. ``dataclasses.replace(MFPOConfig(), env="pendulum", sweeps=False)``
or ``MFPOComparison.config(env="pendulum", sweeps=False)`` changes fields.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

import torch
from gymnasium import spaces

from fedrl_algos.common.env_util import envs_per_agent
from fedrl_algos.core.attacks import ATTACKS, AttackedEstimator, attack_streams, make_attack
from fedrl_algos.core.critic import check_gae_lambda
from fedrl_algos.core.directions import GradientEstimator
from fedrl_algos.core.federation import Federation
from fedrl_algos.core.gpomdp import BASELINES, ScoreFunctionGradient, check_discounting
from fedrl_algos.core.normalization import ObservationNormalizer
from fedrl_algos.core.optim import AdamState, check_server_optimizer
from fedrl_algos.core.schedules import ExponentialStepSize, MomentumSchedule, as_momentum, as_step_size
from fedrl_algos.fedavg_pg import fedavg_pg_round
from fedrl_algos.fedpg_br import FedPGBRUpdate, make_server_sampler
from fedrl_algos.fedpg_br.update import make_env_server_sampler
from fedrl_algos.mfpo import MFPOState, MFPOUpdate
from fedrl_algos.policies import MlpPolicy
from fedrl_algos.policies.critics import critic_for_space
from fedrl_algos.reproduce.common import Experiment, ExperimentOutput, TableRow, WallTimeEstimate, mean_std
from fedrl_algos.reproduce.plots.mfpo import byzantine_figures, mfpo_figures
from fedrl_envs import stack_params
from fedrl_envs.validation import check_bool

__all__ = [
    "ENVS",
    "MethodConfig",
    "Population",
    "train_mfpo",
    "train_fedavg",
    "train_fedpg_br",
    "train_sb3_baseline",
    "MFPOConfig",
    "ByzantineConfig",
    "MFPOComparison",
    "ByzantineExperiment",
]

#: option ``env`` → registered family id
ENVS = {"cartpole": "fedrl/CartPole-v0", "pendulum": "fedrl/Pendulum-v0"}
#: option ``env`` → Gymnasium id of the MFPO paper's other four rows (sampled through the federated env)
GENERIC_ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "pong": "ALE/Pong-v5", "breakout": "ALE/Breakout-v5"}
#: every value of option ``env``
ALL_ENVS = (*ENVS, *GENERIC_ENVS)
#: the most environments per agent of a Gymnasium row's federated env (``MethodConfig.n_envs=None``)
ROW_ENVS = 20
GAMMA = 0.99
#: MFPO's baselines in the reproduction (``MethodConfig.mfpo_baseline``; ``MFPO``'s ``baseline``)
MFPO_BASELINES = (*BASELINES, "critic")
#: Table I of the MFPO paper: mean ± std of the final average score
PAPER_TABLE_I = {
    "cartpole": {"Fed-DQN": (234.3, 92.5), "FedPG-BR": (446.7, 53.3), "Fed-SAC": (393.4, 55.5), "MFPO": (500.0, 0.0)},
    "pendulum": {"Fed-DQN": (-604.1, 200.4), "FedPG-BR": (-264.2, 86.8), "Fed-SAC": (-377.9, 107.1), "MFPO": (-115.5, 51.4)},
    "halfcheetah": {"Fed-DQN": (6055.6, 843.1), "FedPG-BR": (6719.4, 753.8), "Fed-SAC": (8561.5, 775.3), "MFPO": (10794.8, 520.2)},
    "hopper": {"Fed-DQN": (1854.6, 294.9), "FedPG-BR": (1997.7, 297.7), "Fed-SAC": (2446.1, 376.5), "MFPO": (3030.9, 68.8)},
    "pong": {"Fed-DQN": (14.6, 2.5), "FedPG-BR": (10.5, 9.2), "Fed-SAC": (18.8, 2.2), "MFPO": (20.8, 0.2)},
    "breakout": {"Fed-DQN": (128.1, 51.6), "FedPG-BR": (255.6, 47.8), "Fed-SAC": (286.2, 54.3), "MFPO": (336.5, 42.1)},
}


def generic_agent_kwargs(env: str, n_agents: int) -> list[dict[str, Any]]:
    """Heterogeneous agents of a Gymnasium row of Table I: MuJoCo bodies with mass scales spread
    evenly over 0.75–1.25; Atari games cycling through the game's difficulties (Pong 0–3, Breakout 0–1)
    with the DeepMind preprocessing (84×84 grey frames, 4 stacked, frame skip 4)."""
    from fedrl_wrappers.heterogeneity import atari_agent_kwargs, mujoco_agent_kwargs

    if env in ("halfcheetah", "hopper"):
        scales = [0.75 + 0.5 * i / max(n_agents - 1, 1) for i in range(n_agents)]
        return mujoco_agent_kwargs(mass_scale=scales)
    difficulties = {"pong": 4, "breakout": 2}[env]
    return atari_agent_kwargs(difficulty=[i % difficulties for i in range(n_agents)])


@dataclass(frozen=True)
class MethodConfig:
    """Hyperparameters of the three methods (defaults: the paper's classic-control settings where
    it gives them; see ``docs/reproduction_mfpo.md`` for the choices it leaves open).

    :param local_steps: K
    :param n_trajectories: D
    :param initial_trajectories: D̃ of MFPO (``None``: D·K)
    :param step_size: α_t of MFPO and FedAvg-PG
    :param momentum: ν_t of MFPO
    :param max_importance_weight: truncation of MFPO's importance weights
    :param fedpg_br_lr: η of FedPG-BR
    :param server_optimizer: the server step of FedPG-BR's inner loop and of FedAvg-PG's
        aggregation: ``"sgd"`` (FedPG-BR: θ ← θ + η v; FedAvg-PG: θ ← mean of the local models)
        or ``"adam"`` (Adam with step size ``server_lr`` along FedPG-BR's v / FedAvg-PG's
        pseudo-gradient ``mean_k θ_k − θ``, as in FedPG-BR's experiments)
    :param server_lr: Adam's step size for FedAvg-PG's server (FedPG-BR's is ``fedpg_br_lr``)
    :param batch_range: FedPG-BR's (B_min, B_max)
    :param inner_batch_size: FedPG-BR's b
    :param net_arch: hidden layers of the policy
    :param activation: hidden activation
    :param eval_trajectories: evaluation episodes per agent
    :param evaluations: evaluations over a budget (one every ``budget / evaluations`` steps per agent)
    :param eval_every: rounds between evaluations when there is no step budget (quick runs)
    :param squash: ``"tanh"``: the MFPO paper's tanh-Gaussian outputs for continuous actions
        (Gymnasium rows; the classic-control families keep today's plain Gaussian)
    :param horizon: episode length cap H (``H + 1`` steps) of the Gymnasium rows (``None``: the env's)
    :param n_envs: environments per agent of the Gymnasium rows' federated env (``None``: as many as
        ``n_trajectories``, at most 20, so that a step's batch of D episodes steps no environment for
        nothing; its evaluation env then has ``eval_trajectories``, at most 20)
    :param normalize_advantage: MFPO and FedAvg-PG divide each agent batch's step weights by their
        standard deviation (:func:`~fedrl_algos.core.gpomdp.normalize_step_weights`; not the paper's)
    :param init_std: the MLP policy's initialization scale per weight layer (``MlpPolicy``'s
        ``init_std``; default: its own, N(0, 0.5²) hidden and N(0, 0.1²) last layer)
    :param log_std_init: the Gaussian head's initial log standard deviation (continuous actions)
    :param init_gains: ``(hidden, last)`` gains of an orthogonal initialization instead of
        ``init_std`` (``MlpPolicy``'s ``init_gains``; the MuJoCo rows use SB3's ``(√2, 0.01)``)
    :param mfpo_optimizer: MFPO's step rule (``MFPO``'s ``optimizer``): ``"sgd"``, the paper's
        ``θ ← θ + α_t ũ``, or ``"adam"``, Adam steps of size α_t (``step_size``) along ũ
    :param gamma: the discount γ of the three methods' estimates (the paper's 0.99)
    :param discounting: the reward-to-go of MFPO's, FedAvg-PG's and FedPG-BR's GPOMDP estimates:
        ``"absolute"`` (the papers') or ``"relative"`` (:mod:`fedrl_algos.core.gpomdp`; not the paper's)
    :param mfpo_baseline: MFPO's baseline (``MFPO``'s ``baseline``): ``"loo"`` (the default, the
        paper's constant baseline made unbiased), ``"mean"``, ``None``, ``"linear"`` or ``"critic"`` (a
        64-64 tanh value network per agent, λ = 1, kept local: ``MFPO``'s defaults, φ seeded from each
        run's seed); FedAvg-PG and FedPG-BR keep the leave-one-out baseline
    :param mfpo_normalize_returns: MFPO standardises every episode's returns-to-go (``MFPO``'s
        ``normalize_returns``, the authors' code; not an unbiased estimate of ∇J); MFPO only
    :param mfpo_critic_time_aware: with ``mfpo_baseline="critic"``, the critic also takes the step's
        fraction of the horizon (``MFPO``'s ``critic_time_aware``); MFPO only
    :param mfpo_gae_lambda: with ``mfpo_baseline="critic"``, the GAE λ of MFPO's advantages (``MFPO``'s
        ``gae_lambda``; 1: unbiased, the default); MFPO only
    :param normalize_observations: every method's policy (and critic) reads ``Box`` observations
        normalized with SB3 ``VecNormalize``'s rule, the moments pooled over a run's agents once per
        round (the classes' ``normalize_observations``; :mod:`fedrl_algos.core.normalization`), one
        set of moments per seed (not the paper's)
    """

    local_steps: int = 10
    n_trajectories: int = 20
    initial_trajectories: int | None = None
    step_size: Callable[[int], float] = field(default_factory=ExponentialStepSize)
    momentum: Callable[[int, float], float] = field(default_factory=MomentumSchedule)
    max_importance_weight: float | None = 2.0
    fedpg_br_lr: float = 1e-3
    server_optimizer: str = "sgd"
    server_lr: float = 1e-3
    batch_range: tuple[int, int] = (14, 18)
    inner_batch_size: int = 4
    net_arch: tuple[int, ...] = (16, 16)
    activation: str = "tanh"
    eval_trajectories: int = 5
    evaluations: int = 40
    eval_every: int = 1
    squash: str | None = None
    horizon: int | None = None
    n_envs: int | None = None
    normalize_advantage: bool = False
    init_std: float | tuple[float, ...] = (0.5, 0.1)
    log_std_init: float = 0.0
    init_gains: tuple[float, float] | None = None
    mfpo_optimizer: str = "sgd"
    discounting: str = "absolute"
    gamma: float = GAMMA
    mfpo_baseline: str | None = "loo"
    mfpo_normalize_returns: bool = False
    mfpo_critic_time_aware: bool = False
    mfpo_gae_lambda: float = 1.0
    normalize_observations: bool = False

    def __post_init__(self) -> None:
        check_discounting("gpomdp", self.discounting)
        check_gae_lambda(self.mfpo_gae_lambda, "mfpo_gae_lambda")
        if self.mfpo_gae_lambda != 1 and self.mfpo_baseline != "critic":
            raise ValueError(f"mfpo_gae_lambda={self.mfpo_gae_lambda} needs mfpo_baseline='critic', got {self.mfpo_baseline!r}")
        check_bool("normalize_observations", self.normalize_observations)
        check_bool("mfpo_critic_time_aware", self.mfpo_critic_time_aware)
        if self.mfpo_critic_time_aware and self.mfpo_baseline != "critic":
            raise ValueError(f"mfpo_critic_time_aware=True needs mfpo_baseline='critic', got {self.mfpo_baseline!r}")
        if self.mfpo_baseline not in MFPO_BASELINES:
            raise ValueError(f"mfpo_baseline must be one of {MFPO_BASELINES}, got {self.mfpo_baseline!r}")
        check_bool("mfpo_normalize_returns", self.mfpo_normalize_returns)
        if isinstance(self.gamma, bool) or not (isinstance(self.gamma, int | float) and 0 < self.gamma <= 1):
            raise ValueError(f"gamma must be a number in (0, 1], got {self.gamma!r}")
        check_server_optimizer("server_optimizer", self.server_optimizer)
        check_server_optimizer("mfpo_optimizer", self.mfpo_optimizer)
        for name in ("server_lr", "fedpg_br_lr"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")

    def describe(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k not in ("step_size", "momentum")}
        out["step_size"] = repr(self.step_size)
        out["momentum"] = repr(self.momentum)
        return out


def _mlp_policy(observation_space: spaces.Space, action_space: spaces.Space, cfg: MethodConfig) -> MlpPolicy:
    """The methods' MLP policy for these spaces (squashed only for continuous actions)."""
    return MlpPolicy(observation_space, action_space, net_arch=cfg.net_arch, activation=cfg.activation,
                     squash=cfg.squash if isinstance(action_space, spaces.Box) else None, init_std=cfg.init_std,
                     log_std_init=cfg.log_std_init, init_gains=cfg.init_gains)


class Population:
    """``R`` seeds × ``n`` agents of one row of Table I, with the policy and evaluation.

    Classic control: agent ``i`` runs the fedrl family's default task ``i mod 10`` (agent 0:
    Gymnasium's defaults), every seed and agent in one kernel program. The Gymnasium rows
    (MuJoCo, Atari): the ``R·n`` agents' environments in one federated env (:func:`generic_agent_kwargs`),
    each seeded from its run's seed (``run_env_stream_ids``), sampled through it.
    """

    def __init__(self, env: str, seeds: Sequence[int], n_agents: int, cfg: MethodConfig, device: str = "cpu") -> None:
        import fedrl_envs

        _check_env(env)
        self.env = env
        self.seeds = torch.as_tensor(list(seeds), dtype=torch.int64)
        self.n_agents = n_agents
        self.cfg = cfg
        self.normalizer: ObservationNormalizer | None = None
        if env in GENERIC_ENVS:
            self._init_generic(env, n_agents, cfg, device)
            return
        if ENVS[env] not in fedrl_envs.FAMILIES:
            raise RuntimeError(f"{ENVS[env]} is not registered (the classic-control families of fedrl_envs are needed)")
        self.family = fedrl_envs.FAMILIES[ENVS[env]]
        tasks = self.family.train_tasks
        self.params = stack_params([tasks[i % len(tasks)] for i in range(n_agents)])
        one = tasks[0]
        actions = self.family.action_space(one)
        self.observation_space = self.family.observation_space(one)
        self.policy = _mlp_policy(self.observation_space, actions, cfg).to(device)
        self.normalizer = self._make_normalizer(device)
        self.federation = Federation(self.family, self.params, self.policy, self.seeds, cfg.gamma, normalizer=self.normalizer)
        self.federation.sampler.stop_when_done = True
        self.federation.eval_sampler.stop_when_done = True

    def _init_generic(self, env: str, n_agents: int, cfg: MethodConfig, device: str) -> None:
        from fedrl_algos.core.federation import run_env_stream_ids
        from fedrl_algos.policies import CnnPolicy
        from fedrl_wrappers import FederatedVecEnv

        self.family = None
        self.agent_kwargs = generic_agent_kwargs(env, n_agents)
        seeds = self.seeds.tolist()

        def make(offset: int, n_envs: int) -> FederatedVecEnv:
            return FederatedVecEnv(GENERIC_ENVS[env], n_envs, agent_kwargs=self.agent_kwargs * len(seeds), autoreset=False, seed=0,
                                   stream_ids=run_env_stream_ids(seeds, n_agents, offset), device=device)

        if cfg.n_envs is None:
            n_envs, eval_envs = envs_per_agent(cfg.n_trajectories, ROW_ENVS), envs_per_agent(cfg.eval_trajectories, ROW_ENVS)
        else:
            n_envs, eval_envs = cfg.n_envs, min(cfg.n_envs, cfg.eval_trajectories)
        self.env_obj = make(0, n_envs)
        space, actions = self.env_obj.single_observation_space, self.env_obj.single_action_space
        self.observation_space = space
        if len(space.shape) == 3:  # image frames: SB3's Nature CNN
            self.policy = CnnPolicy(space, actions, squash=cfg.squash if isinstance(actions, spaces.Box) else None).to(device)
        else:
            self.policy = _mlp_policy(space, actions, cfg).to(device)
        eval_env = make(1 << 41, eval_envs)
        self.normalizer = self._make_normalizer(device)
        self.federation = Federation.from_env(self.env_obj, self.policy, seeds, cfg.gamma, cfg.horizon, eval_env, self.normalizer,
                                              stop_when_done=True)

    def _make_normalizer(self, device: str) -> ObservationNormalizer | None:
        """``cfg.normalize_observations``: the observation moments, one set per seed (each run's agents pool theirs)."""
        if not self.cfg.normalize_observations:
            return None
        if not isinstance(self.observation_space, spaces.Box):
            raise ValueError(f"normalize_observations needs Box observations, {self.env} has {self.observation_space}")
        return ObservationNormalizer(self.observation_space.shape, device=device, runs=self.n_runs)

    def end_round(self) -> None:
        """The server's end of a round: the observation moments sampled in it are pooled (they normalize the next round's)."""
        if self.normalizer is not None:
            self.normalizer.commit()

    def server_sampler(self, inner_batch_size: int) -> Any:
        """FedPG-BR's server sampler: the family's kernels, or ``b`` environments of the server's own per run."""
        if self.family is not None:
            sampler = make_server_sampler(self.family, self.federation.agent_params, self.policy, self.seeds, inner_batch_size)
        else:
            sampler = self._generic_server_sampler(inner_batch_size)
        sampler.normalizer = self.normalizer  # the server reads its trajectories with the agents' pooled moments
        return sampler

    def _generic_server_sampler(self, inner_batch_size: int) -> Any:
        """The server's own ``b`` Gymnasium environments per run (FedPG-BR on a MuJoCo/Atari row)."""
        from fedrl_algos.core.federation import run_env_stream_ids
        from fedrl_algos.fedpg_br.update import server_task_indices
        from fedrl_wrappers import FederatedVecEnv

        seeds = self.seeds.tolist()
        tasks = [self.agent_kwargs[k] for k in server_task_indices(self.n_agents, inner_batch_size)]
        server_env = FederatedVecEnv(GENERIC_ENVS[self.env], 1, agent_kwargs=tasks * len(seeds), autoreset=False, seed=0,
                                     stream_ids=run_env_stream_ids(seeds, inner_batch_size, 1 << 43), device=self.policy.theta.device)
        return make_env_server_sampler(server_env, self.policy, seeds, inner_batch_size, horizon=self.cfg.horizon)

    @property
    def n_runs(self) -> int:
        return int(self.seeds.numel())

    def initial_theta(self) -> torch.Tensor:
        """Every seed starts from the policy's shared initialization ``[R, d]``."""
        return self.policy.theta.detach().expand(self.n_runs, -1).clone()

    def evaluate(self, theta: torch.Tensor) -> torch.Tensor:
        """Undiscounted return of the server policy ``theta [R, d]``, averaged over agents: ``[R]``."""
        traj = self.federation.eval_sampler(self.federation.broadcast(theta), self.cfg.eval_trajectories)
        return traj.returns(1.0).mean((-1, -2))


class _Curve:
    """Collects evaluation points of a batched run until the seeds have used the budget on average.

    Evaluations: at the start, whenever the seeds' mean step count passes another
    ``budget / cfg.evaluations`` (every ``cfg.eval_every`` rounds when the budget is 0), and at the end.
    """

    def __init__(self, pop: Population, budget: float, max_rounds: int, bar: Any = None) -> None:
        self.pop, self.budget, self.max_rounds, self.bar = pop, budget, max_rounds, bar
        self.steps = torch.zeros(pop.n_runs, dtype=torch.float64)
        self.trajectories = torch.zeros(pop.n_runs, dtype=torch.float64)
        self.points: list[dict[str, Any]] = []
        self.rounds = 0
        self.interval = budget / pop.cfg.evaluations if budget > 0 else 0.0
        self.next_eval = self.interval

    def record(self, theta: torch.Tensor) -> None:
        ret = self.pop.evaluate(theta)
        self.points.append({"round": self.rounds, "step": self.steps.clone(), "trajectories": self.trajectories.clone(), "return": ret.double().cpu()})

    def advance(self, env_steps: torch.Tensor, trajectories: Any) -> bool:
        """Count one round (its observation moments are pooled); ``True`` while training should go on."""
        self.pop.end_round()
        self.rounds += 1
        self.steps += env_steps.double().cpu()
        self.trajectories += torch.as_tensor(trajectories, dtype=torch.float64).cpu()
        if self.bar is not None:
            # steps per agent (the seeds' mean) against the budget; rounds when there is none
            done = min(float(self.steps.mean()), self.budget) if self.budget > 0 else float(self.rounds)
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix(round=self.rounds, refresh=False)
        # The seeds' mean: a collapsed seed (10-step episodes) must not keep the whole batch running.
        return bool(self.steps.mean() < self.budget) and self.rounds < self.max_rounds

    def due(self, going: bool) -> bool:
        if not going:
            return True
        if self.interval <= 0:
            return self.rounds % self.pop.cfg.eval_every == 0
        if float(self.steps.mean()) >= self.next_eval:
            while self.next_eval <= float(self.steps.mean()):
                self.next_eval += self.interval
            return True
        return False


def train_mfpo(pop: Population, budget: float, max_rounds: int = 10**6, momentum: bool = True, bar: Any = None) -> list[dict[str, Any]]:
    """MFPO (or, with ``momentum=False``, the same update with ν = 0) on every seed at once, with
    ``cfg.mfpo_baseline`` (with ``"critic"``: every agent's value network starts from its run's seed, as
    ``MFPO(seed=...)``'s) and ``cfg.mfpo_normalize_returns``."""
    cfg = pop.cfg
    critic = None
    if cfg.mfpo_baseline == "critic":
        critic = critic_for_space(pop.observation_space, time_horizon=pop.federation.horizon + 1 if cfg.mfpo_critic_time_aware else None)
    update = MFPOUpdate(
        pop.policy, cfg.gamma, cfg.local_steps, cfg.n_trajectories,
        cfg.initial_trajectories or cfg.n_trajectories * cfg.local_steps,
        cfg.step_size, cfg.momentum if momentum else (lambda t, a: 0.0),
        baseline=cfg.mfpo_baseline, max_importance_weight=cfg.max_importance_weight, normalize_advantage=cfg.normalize_advantage,
        optimizer=cfg.mfpo_optimizer, discounting=cfg.discounting, critic=critic, normalize_returns=cfg.mfpo_normalize_returns,
        gae_lambda=cfg.mfpo_gae_lambda,
    )
    theta = pop.initial_theta()
    state = MFPOState.initial(theta, pop.n_agents, cfg.mfpo_optimizer)
    if critic is not None:
        phi = torch.stack([critic.initial_phi(int(seed), theta.dtype) for seed in pop.seeds.tolist()]).to(theta.device)
        state = state._replace(critic=critic.initial_state(phi.unsqueeze(-2).expand(-1, pop.n_agents, -1).clone()))
    curve = _Curve(pop, budget, max_rounds, bar)
    curve.record(state.theta[:, 0])
    going = True
    while going:
        state, info = update.round(pop.federation.sampler, state)
        going = curve.advance(info["env_steps"].mean(-1), info["trajectories"])
        if curve.due(going):
            curve.record(state.theta[:, 0])
    return curve.points


class _Counting(GradientEstimator):
    """Counts the environment steps of every trajectory an estimator draws (per row)."""

    def __init__(self, inner: GradientEstimator) -> None:
        super().__init__(inner.policy, inner.gamma)
        self.inner = inner
        self.steps: torch.Tensor | float = 0.0
        self.name = inner.name

    @property
    def trajectories_per_step(self) -> int:
        return self.inner.trajectories_per_step

    def __call__(self, sampler: Any, theta: torch.Tensor) -> torch.Tensor:
        def draw(th: torch.Tensor, m: int) -> Any:
            traj = sampler(th, m)
            self.steps = self.steps + traj.mask.sum((-1, -2))
            return traj

        return self.inner(draw, theta)


def train_fedavg(pop: Population, budget: float, attack: Any = None, byzantine: Sequence[int] = (), max_rounds: int = 10**6,
                 bar: Any = None) -> list[dict[str, Any]]:
    """FedAvg-PG: K local steps ``θ ← θ + α_t ĝ`` (GPOMDP, D trajectories) per agent, then the average.

    Every round is :func:`fedrl_algos.fedavg_pg.fedavg_pg_round`, the update of the public
    :class:`~fedrl_algos.FedAvgPG` class (here batched over seeds, with the agents' environment
    steps counted as they are sampled). With ``attack``, the agents in ``byzantine`` apply it to
    every local direction. With ``cfg.server_optimizer == "adam"`` the server takes an Adam step
    (``cfg.server_lr``) along the round's average local direction ``(mean_k θ_k − θ) / Σ_t α_t``
    instead of adopting the average; with K = 1 that is Adam on the averaged GPOMDP gradient, the
    unprotected baseline of FedPG-BR's experiments.
    """
    cfg = pop.cfg
    counting = _Counting(ScoreFunctionGradient(pop.policy, cfg.gamma, cfg.n_trajectories, normalize_advantage=cfg.normalize_advantage,
                                                      discounting=cfg.discounting))
    mask = torch.zeros(pop.n_agents, dtype=torch.bool)
    mask[list(byzantine)] = True
    estimator: GradientEstimator = AttackedEstimator(counting, make_attack(attack), mask) if attack else counting
    theta = pop.initial_theta()
    adam = AdamState.zeros_like(theta) if cfg.server_optimizer == "adam" else None
    curve = _Curve(pop, budget, max_rounds, bar)
    curve.record(theta)
    going, t = True, 0
    while going:
        counting.steps = 0.0
        theta, adam, _ = fedavg_pg_round(pop.federation, theta, estimator, cfg.step_size, t, cfg.local_steps,
                                         server_state=adam, server_step_size=cfg.server_lr)
        t += cfg.local_steps
        going = curve.advance(counting.steps.mean(-1), cfg.local_steps * cfg.n_trajectories)
        if curve.due(going):
            curve.record(theta)
    return curve.points


def train_fedpg_br(pop: Population, budget: float, attack: Any = None, byzantine: Sequence[int] = (), use_filter: bool = True,
                   max_rounds: int = 10**6, bar: Any = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """FedPG-BR on every seed at once; returns the curve and the filter's statistics."""
    cfg = pop.cfg
    # The Gymnasium rows' tanh-Gaussian policies: untruncated inner-loop importance weights overflowed
    # to non-finite parameters within two quick rounds on HalfCheetah, so they use MFPO's truncation.
    truncation = cfg.max_importance_weight if pop.family is None else None
    update = FedPGBRUpdate(pop.policy, cfg.gamma, cfg.batch_range, cfg.inner_batch_size, cfg.fedpg_br_lr, "auto", 0.6, 0.4,
                           max_importance_weight=truncation, use_filter=use_filter, attack=attack, optimizer=cfg.server_optimizer,
                           discounting=cfg.discounting)
    n = pop.n_agents
    server = pop.server_sampler(cfg.inner_batch_size)
    noise = attack_streams(pop.federation.streams)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[list(byzantine)] = True
    theta = pop.initial_theta()
    curve = _Curve(pop, budget, max_rounds, bar)
    curve.record(theta)
    kept_honest = kept_byzantine = 0.0
    going, adam = True, None
    while going:
        uniform = pop.federation.server_streams.uniform((2,), dtype=torch.float64)
        theta, info = update.round(theta, pop.federation.sampler, server, uniform, mask, noise, adam)
        adam = info["optimizer_state"]
        kept = info["kept"].double()
        kept_honest += float(kept[:, ~mask].mean()) if (~mask).any() else 0.0
        kept_byzantine += float(kept[:, mask].mean()) if mask.any() else 0.0
        going = curve.advance(info["env_steps"].mean(-1), info["batch_size"])
        if curve.due(going):
            curve.record(theta)
    rounds = max(curve.rounds, 1)
    stats = {"honest_kept_fraction": kept_honest / rounds, "byzantine_kept_fraction": kept_byzantine / rounds if mask.any() else float("nan")}
    return curve.points, stats


#: the paper's environment steps per agent (Table I's runs, and the sweeps of figs. 5 and 6)
PAPER_BUDGET = 1e6
#: the default steps per agent of the comparison and of each sweep run on the MuJoCo and Atari rows:
#: reduced runs that fit a 2-core machine (the classic-control rows run the paper's 1e6; ``--budget
#: paper`` gives 1e6 on every row). A run stops at the end of the round that passes its budget, and
#: a round is K·D = 400 trajectories per agent (800 in the first, with D̃), so these are one round
#: (HalfCheetah, Atari, MFPO on Hopper: 26,098 steps per agent in its first round) or two (FedAvg-PG on Hopper).
#: Even one round is hours at 10 seeds on 2 cores (the fixed-horizon rollouts step all H + 1 steps):
#: measured wall times in :data:`MEASURED_RATES` and docs/reproduction_mfpo.md
REDUCED_BUDGETS = {"halfcheetah": 1e3, "hopper": 2e4, "pong": 1e3, "breakout": 1e3}
#: episode length cap H (H + 1 steps) of the Atari rows: the ALE v5 ids register no step limit, and the
#: federated env samples fixed-horizon episodes (1000 agent steps = 4000 frames, about one game of Pong
#: by an untrained policy; the paper states none)
ATARI_HORIZON = 999
#: the default steps per agent of Fed-DQN / Fed-SAC: the reduced runs that fit a 2-core machine
#: (CartPole's Fed-DQN: 784 s at 2e4 for 10 seeds, ≈ 11 h at 1e6; Pendulum's Fed-SAC: 800 s at 1e4
#: for 2 seeds; docs/reproduction_mfpo.md); the MuJoCo and Atari rows take Fed-SAC / Fed-DQN's 1e4,
#: not measured there
SB3_REDUCED_BUDGETS = {"cartpole": 2e4, "pendulum": 1e4, "halfcheetah": 1e4, "hopper": 1e4, "pong": 1e4, "breakout": 1e4}

#: measured wall time per seed, per agent and per 1e6 environment steps per agent, in seconds, by
#: env and method (byzantine: by method and attack), from the runs of docs/reproduction_mfpo.md on
#: the 2-core machine (load average 3–6): CartPole comparison 10 seeds (MFPO 183 s, FedAvg-PG 101 s,
#: FedPG-BR 310 s at 1e6; Fed-DQN 784 s at 2e4), Pendulum 3 seeds at 1e6 (31, 20, 151 s) and Fed-SAC
#: 2 seeds at 1e4 (800 s), byzantine 5 seeds at 1e6. The agents sweep (3 seeds: 19–256 s for N = 1–50)
#: agrees with the MFPO rate times the agents to within 5 %. MuJoCo/Atari, per *counted* step (until
#: each episode ends): Hopper, 10 agents, 3 seeds, SB3's orthogonal initialization (load about 2):
#: MFPO 1,167 s for 61,756 steps per agent (budget 6e4), FedAvg-PG 533 s for 43,079, FedPG-BR
#: 411 s for 22,827 (budget 2e4; rollouts stop, and the estimators skip the padding, once every
#: episode has ended);
#: Pong 1 agent with K = 2 (60 trajectories of ~917 steps), 256 s for 55,025 steps per agent (load
#: 4–6, before that change). HalfCheetah and Breakout have none.
MEASURED_RATES: dict[str, dict[str, float]] = {
    "cartpole": {"MFPO": 1.83, "FedAvg-PG": 1.01, "FedPG-BR": 3.10, "Fed-DQN": 392.0},
    "pendulum": {"MFPO": 1.03, "FedAvg-PG": 0.67, "FedPG-BR": 5.03, "Fed-SAC": 4000.0},
    "hopper": {"MFPO": 630.0, "FedAvg-PG": 412.0, "FedPG-BR": 600.0},
    "pong": {"MFPO": 4645.0},
}
#: environment steps per agent that a comparison's run takes at least, because it stops only at the
#: end of a round (one number for every method, or one per method): Hopper measured at its default
#: 2e4 budget, 10 agents (MFPO: its first round, 26,098; FedAvg-PG: the two rounds that pass 2e4,
#: 43,079; FedPG-BR: 22,827); Pong from the measured ~917 steps a trajectory times the round's
#: D̃ + (K − 1)·D = 780 trajectories
FIRST_ROUND_STEPS: dict[str, float | dict[str, float]] = {
    "hopper": {"MFPO": 26100.0, "FedAvg-PG": 43100.0, "FedPG-BR": 22800.0},
    "pong": 7.15e5,
}


def _least_steps(env: str, method: str) -> float:
    """The steps per agent a run of ``method`` on ``env`` takes at least (:data:`FIRST_ROUND_STEPS`)."""
    least = FIRST_ROUND_STEPS.get(env, 0.0)
    return float(least.get(method, 0.0)) if isinstance(least, dict) else float(least)
BYZANTINE_RATES: dict[str, dict[tuple[str, str], float]] = {
    "cartpole": {("FedPG-BR", "none"): 3.72, ("FedPG-BR", "random_noise"): 3.30, ("FedPG-BR", "sign_flip"): 3.88,
                 ("FedAvg-PG", "none"): 0.98, ("FedAvg-PG", "random_noise"): 1.44, ("FedAvg-PG", "sign_flip"): 3.56},
}
RATES_BASIS = ("wall times measured on a 2-core machine at load 3–6, per seed, agent and step per agent, "
               "scaled linearly in seeds, agents and steps per agent")


#: the federated SB3 baseline of each environment that SB3 can run (DQN: discrete actions; SAC: continuous)
SB3_BASELINES = {"cartpole": ("Fed-DQN",), "pendulum": ("Fed-SAC",), "halfcheetah": ("Fed-SAC",), "hopper": ("Fed-SAC",),
                 "pong": ("Fed-DQN",), "breakout": ("Fed-DQN",)}


def sb3_steps_per_agent(budget: float, n_agents: int) -> float:
    """The environment steps per agent that :func:`train_sb3_baseline` asks of each run (at least one)."""
    return max(int(budget * n_agents), n_agents) / n_agents


def train_sb3_baseline(method: str, env: str, seeds: Sequence[int], budget: float, n_agents: int = 10, evaluations: int = 10,
                       eval_episodes: int = 5, device: str = "cpu", bar: Any = None) -> list[dict[str, Any]]:
    """Fed-DQN / Fed-SAC from issue 7 (:func:`fedrl_algos.reproduce.sb3_baselines.run_fed_baseline`), one run per seed.

    Their evaluation (issue 7's protocol) is deterministic episodes on every agent's own task.

    :param bar: a tqdm bar advanced by every seed's environment steps per agent (``None``: none)
    """
    from fedrl_algos.reproduce.sb3_baselines import StepsProgressCallback, run_fed_baseline

    total = int(sb3_steps_per_agent(budget, n_agents) * n_agents)
    out = []
    # the Gymnasium rows: the same heterogeneous agents as the policy-gradient methods'
    extra = {"agent_kwargs": generic_agent_kwargs(env, n_agents), "policy": "CnnPolicy" if env in ("pong", "breakout") else "MlpPolicy"} \
        if env in GENERIC_ENVS else {}
    for k, seed in enumerate(seeds):
        rows = run_fed_baseline(method, ENVS.get(env, GENERIC_ENVS.get(env)), n_agents, total, int(seed),
                                eval_every=max(total // evaluations, 1), eval_episodes=eval_episodes, device=device,
                                callback=None if bar is None else StepsProgressCallback(bar, n_agents), **extra)
        if bar is not None:
            bar.set_postfix(seeds_done=f"{k + 1}/{len(seeds)}", refresh=False)
        out += [{"seed": int(seed), "round": r["round"], "step": float(r["env_steps_per_agent"]), "trajectories": None,
                 "return": float(r["eval_return"])} for r in rows]
    return out


def _records(points: list[dict[str, Any]], seeds: Sequence[int], **fields: Any) -> list[dict[str, Any]]:
    out = []
    for p in points:
        for i, seed in enumerate(seeds):
            out.append({**fields, "seed": int(seed), "round": p["round"], "step": float(p["step"][i]),
                        "trajectories": float(p["trajectories"][i]), "return": float(p["return"][i])})
    return out


def _final(records: list[dict[str, Any]], **match: Any) -> list[float]:
    """Each seed's last evaluation among the records matching ``match``."""
    rows = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    last: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["seed"] not in last or r["round"] > last[r["seed"]]["round"]:
            last[r["seed"]] = r
    return [last[s]["return"] for s in sorted(last)]


def _at_step(records: list[dict[str, Any]], step: float, **match: Any) -> list[float]:
    """Each seed's evaluation return linearly interpolated at ``step`` environment steps per agent."""
    rows = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        pts = sorted((r["step"], r["return"]) for r in rows if r["seed"] == seed)
        below = [p for p in pts if p[0] <= step]
        above = [p for p in pts if p[0] >= step]
        if not below or not above:
            continue
        (x0, y0), (x1, y1) = below[-1], above[0]
        out.append(y0 if x1 == x0 else y0 + (y1 - y0) * (step - x0) / (x1 - x0))
    return out


def _first_reaching(records: list[dict[str, Any]], threshold: float, **match: Any) -> float | None:
    """Environment steps per agent at which the seed-mean evaluation return first reaches ``threshold``."""
    rows = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    by_round: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_round.setdefault(r["round"], []).append(r)
    for rnd in sorted(by_round):
        group = by_round[rnd]
        if sum(r["return"] for r in group) / len(group) >= threshold:
            return max(r["step"] for r in group)
    return None


def _bar(enabled: bool, desc: str, total: float, unit: str) -> Any:
    """A tqdm bar on stderr with a total, so that it shows its rate and ETA (``None`` when disabled)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # stderr (tqdm's default, said explicitly): stdout carries the results that scripts parse
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, dynamic_ncols=True, file=sys.stderr)


def _size(budget: float, rounds: int) -> tuple[float, str]:
    """A training run's progress total: its budget of environment steps per agent (the seeds' mean),
    or, without a budget (quick runs), its rounds."""
    return (float(budget), " steps/agent") if budget > 0 else (float(rounds), " rounds")


def _timed(progress: bool, desc: str, wall: dict[str, float], train: Callable[[Any], Any], size: tuple[float, str] = (0.0, "")) -> Any:
    """``train(bar)`` under a progress bar ``desc`` of ``size`` = ``(total, unit)`` (closed afterwards);
    its wall time goes to ``wall[desc]``."""
    bar = _bar(progress, desc, *size)
    start = time.perf_counter()
    try:
        return train(bar)
    finally:
        wall[desc] = time.perf_counter() - start
        if bar is not None:
            bar.close()


# ------------------------------------------------------------------------------------------------
# fedrl reproduce mfpo
# ------------------------------------------------------------------------------------------------
def _check_env(env: str) -> None:
    if env not in ALL_ENVS:
        raise ValueError(f"env must be one of {sorted(ALL_ENVS)}, got {env!r}")


def paper_methods(env: str, methods: MethodConfig) -> MethodConfig:
    """The methods' settings for a row of Table I: ``methods`` as given, except that the default
    (classic-control) settings on a MuJoCo or Atari row become the paper's for those domains
    (section VI-A3): 2 ReLU layers of 256 units, tanh-Gaussian outputs, K = 20, and on Atari the
    episode cap :data:`ATARI_HORIZON`."""
    if env in GENERIC_ENVS and methods == MethodConfig():
        horizon = ATARI_HORIZON if env in ("pong", "breakout") else None
        # SB3's orthogonal initialization: the classic-control default (N(0, 0.5²) hidden weights)
        # saturates a 256-unit network's tanh-squashed actions from the start (the Nature CNN of
        # the Atari rows has this initialization already).
        return replace(methods, local_steps=20, net_arch=(256, 256), activation="relu", squash="tanh", horizon=horizon,
                       init_gains=(math.sqrt(2.0), 0.01))
    return methods


#: MFPO's settings with Adam steps (``MFPOConfig.mfpo_optimizer="adam"``, not the paper's), per row:
#: the Adam step size α, the momentum ν and the other changes, measured on Pendulum and CartPole
#: (docs/algorithms/mfpo.md), HalfCheetah, Breakout and Pong (docs/reproduction_mfpo.md); Hopper
#: takes :data:`ADAM_DEFAULT`.
ADAM_STEP_RULES: dict[str, dict[str, Any]] = {
    "pendulum": dict(step_size=3e-3, momentum=0.5, normalize_advantage=True, activation="relu", squash="tanh", init_std=(0.5, 0.01)),
    "halfcheetah": dict(step_size=1e-3, momentum=0.5, normalize_advantage=True),
    "cartpole": dict(step_size=1e-3, momentum=0.5, normalize_advantage=True),
    # Nature CNN: 2.5e-4 raised Breakout's return (1e-3 collapsed the policy); on Pong neither 2.5e-4
    # (collapsed) nor 5e-4 (flat) learned within 1.2e5 steps per agent, nor 1e-4 to 5e-4 within
    # 1.7e5-7.3e5 with gamma 0.95 or relative discounting (the policy stays uniform)
    "breakout": dict(step_size=2.5e-4, momentum=0.5, normalize_advantage=True),
    "pong": dict(step_size=5e-4, momentum=0.5, normalize_advantage=True),
}
#: the Adam settings of the rows without measured ones
ADAM_DEFAULT: dict[str, Any] = dict(step_size=1e-3, momentum=0.5, normalize_advantage=True)


def adam_methods(env: str, methods: MethodConfig) -> MethodConfig:
    """MFPO's settings for a row with Adam steps: ``methods`` with ``mfpo_optimizer="adam"`` and the
    row's :data:`ADAM_STEP_RULES` (constant step size α and momentum ν; :data:`ADAM_DEFAULT` where none
    was measured)."""
    _check_env(env)
    rule = dict(ADAM_STEP_RULES.get(env, ADAM_DEFAULT))
    return replace(methods, mfpo_optimizer="adam", step_size=as_step_size(rule.pop("step_size")),
                   momentum=as_momentum(rule.pop("momentum")), **rule)


def _mfpo_estimator_note(methods: MethodConfig) -> str:
    """What MFPO's estimator does beyond the paper's leave-one-out GPOMDP (``""`` when nothing)."""
    parts = []
    if methods.mfpo_baseline != "loo":
        parts.append(f"baseline={methods.mfpo_baseline!r}")
    if methods.mfpo_normalize_returns:
        parts.append("normalize_returns=True (per-episode normalised returns, the authors' code; not an unbiased estimate of ∇J)")
    if methods.mfpo_baseline == "critic" and methods.mfpo_critic_time_aware:
        parts.append("critic_time_aware=True (the critic sees the step's fraction of the horizon)")
    if methods.mfpo_gae_lambda != 1:
        parts.append(f"gae_lambda={methods.mfpo_gae_lambda} (GAE advantages, biased below 1)")
    return ", ".join(parts)


def _quick_methods(**changes: Any) -> MethodConfig:
    """The methods' hyperparameters of a quick run: 4 trajectories a step, FedPG-BR's batches 4–5 of 2."""
    return MethodConfig(**{"n_trajectories": 4, "batch_range": (4, 5), "inner_batch_size": 2, "eval_trajectories": 2,
                           "eval_every": 1, **changes})


@dataclass(frozen=True)
class MFPOConfig:
    """``mfpo``: the comparison of section VI and MFPO's agents and local-steps sweeps (the paper's settings)."""

    env: str = "cartpole"
    """the family: ``"cartpole"`` or ``"pendulum"`` (:data:`ENVS`)"""
    budget: float | None = None
    """environment steps per agent of each comparison run (0: ``rounds`` rounds, evaluated every round;
    ``None``: the paper's :data:`PAPER_BUDGET` on CartPole/Pendulum, the reduced run of
    :data:`REDUCED_BUDGETS` on the MuJoCo/Atari rows; see :attr:`resolved_budget`)"""
    sweep_budget: float | None = None
    """environment steps per agent of each sweep run (``None``: as ``budget``'s default)"""
    comparison: bool = True
    """run the comparison (MFPO, FedAvg-PG, FedPG-BR and the federated SB3 baseline)"""
    sweeps: bool = True
    """run MFPO's agents and local-steps sweeps"""
    sb3_baselines: bool = True
    """run Fed-DQN / Fed-SAC where SB3 supports the action space"""
    sb3_budget: float | None = None
    """environment steps per agent of Fed-DQN / Fed-SAC (``None``: the reduced run of
    :data:`SB3_REDUCED_BUDGETS`, at most ``budget``; :data:`PAPER_BUDGET` is the paper's size)"""
    rounds: int = 10**6
    """most communication rounds of a comparison run"""
    sweep_rounds: int = 10**6
    """most communication rounds of a sweep run"""
    n_agents: int = 10
    """agents of the comparison and of the local-steps sweep (agent i runs the family's task i mod 10)"""
    agent_counts: tuple[int, ...] = (1, 5, 10, 20, 50)
    """N of the agents sweep (fig. 5)"""
    local_step_counts: tuple[int, ...] = (1, 5, 10, 20, 50)
    """K of the local-steps sweep (fig. 6)"""
    sweep_max_local_steps: int | None = None
    """cap on the K that a local-steps sweep run takes (``None``: none; records keep the nominal K)"""
    methods: MethodConfig = field(default_factory=MethodConfig)
    """the three methods' hyperparameters (K = 10, D = 20, ...)"""
    mfpo_optimizer: str = "sgd"
    """MFPO's step rule in the comparison and the sweeps: ``"sgd"``, the paper's, or ``"adam"``, Adam steps
    along the momentum direction with the row's :data:`ADAM_STEP_RULES` (:func:`adam_methods`; not the paper's)"""
    baseline: str | None = "loo"
    """MFPO's baseline in the comparison and the sweeps (:attr:`MethodConfig.mfpo_baseline`): ``"loo"``
    (default), ``"linear"``, ``"critic"``, ...; FedAvg-PG and FedPG-BR keep the leave-one-out baseline"""
    normalize_returns: bool = False
    """MFPO standardises every episode's returns-to-go (:attr:`MethodConfig.mfpo_normalize_returns`; the
    authors' code, not the paper's estimator); MFPO only"""
    critic_time_aware: bool = False
    """with ``baseline="critic"``: the critic also takes the step's fraction of the horizon
    (:attr:`MethodConfig.mfpo_critic_time_aware`); MFPO only"""
    gae_lambda: float = 1.0
    """with ``baseline="critic"``: the GAE λ of MFPO's advantages (:attr:`MethodConfig.mfpo_gae_lambda`;
    1, the default, is the critic as a baseline of the returns to go); MFPO only"""
    normalize_observations: bool = False
    """every method reads observations normalized with SB3 ``VecNormalize``'s rule, moments per seed
    (:attr:`MethodConfig.normalize_observations`; not the paper's)"""

    def __post_init__(self) -> None:
        _check_env(self.env)
        check_server_optimizer("mfpo_optimizer", self.mfpo_optimizer)
        if self.baseline not in MFPO_BASELINES:
            raise ValueError(f"baseline must be one of {MFPO_BASELINES}, got {self.baseline!r}")
        check_bool("normalize_returns", self.normalize_returns)
        check_bool("critic_time_aware", self.critic_time_aware)
        if self.critic_time_aware and self.baseline != "critic":
            raise ValueError(f"critic_time_aware=True needs baseline='critic', got baseline={self.baseline!r}")
        check_gae_lambda(self.gae_lambda, "gae_lambda")
        if self.gae_lambda != 1 and self.baseline != "critic":
            raise ValueError(f"gae_lambda={self.gae_lambda} needs baseline='critic', got baseline={self.baseline!r}")
        check_bool("normalize_observations", self.normalize_observations)

    def mfpo_methods(self, methods: MethodConfig) -> MethodConfig:
        """MFPO's settings from the methods' ``methods``: its step rule (:func:`adam_methods` with
        ``mfpo_optimizer="adam"``), its baseline, its return normalisation, its critic's time input and GAE λ."""
        if self.mfpo_optimizer == "adam":
            methods = adam_methods(self.env, methods)
        if (self.baseline, self.normalize_returns, self.critic_time_aware, self.gae_lambda) == (
                methods.mfpo_baseline, methods.mfpo_normalize_returns, methods.mfpo_critic_time_aware, methods.mfpo_gae_lambda):
            return methods
        return replace(methods, mfpo_baseline=self.baseline, mfpo_normalize_returns=self.normalize_returns,
                       mfpo_critic_time_aware=self.critic_time_aware, mfpo_gae_lambda=self.gae_lambda)

    @property
    def resolved_budget(self) -> float:
        """The steps per agent of each comparison run: ``budget``, or by default the paper's 1e6 on
        the classic-control rows and :data:`REDUCED_BUDGETS` on the MuJoCo/Atari rows."""
        return float(self.budget) if self.budget is not None else REDUCED_BUDGETS.get(self.env, PAPER_BUDGET)

    @property
    def resolved_sweep_budget(self) -> float:
        """The steps per agent of each sweep run: ``sweep_budget``, or by default as :attr:`resolved_budget`'s default."""
        return float(self.sweep_budget) if self.sweep_budget is not None else REDUCED_BUDGETS.get(self.env, PAPER_BUDGET)

    @property
    def resolved_sb3_budget(self) -> float:
        """The steps per agent that Fed-DQN / Fed-SAC run: ``sb3_budget``, or by default the reduced
        run of :data:`SB3_REDUCED_BUDGETS` capped at :attr:`resolved_budget`."""
        if self.sb3_budget is not None:
            return float(self.sb3_budget)
        return min(SB3_REDUCED_BUDGETS[self.env], self.resolved_budget)

    def quick(self) -> Self:
        """This config as a seconds-long smoke version: 2 rounds (sweep runs: 1) of K ≤ 2 local steps with
        4 trajectories, Fed-DQN / Fed-SAC for 60 steps; ``env``, ``comparison``, ``sweeps``,
        ``sb3_baselines``, ``normalize_observations`` and MFPO's ``mfpo_optimizer``, ``baseline``, ``normalize_returns``,
        ``critic_time_aware`` and ``gae_lambda`` are kept."""
        generic = dict(net_arch=(16,), activation="relu", squash="tanh", horizon=15, n_envs=2) if self.env in GENERIC_ENVS else {}
        return replace(self, methods=_quick_methods(local_steps=2, initial_trajectories=4, **generic), budget=0.0, sweep_budget=0.0,
                       rounds=2, sweep_rounds=1, sb3_budget=60, sweep_max_local_steps=2)


class MFPOComparison(Experiment[MFPOConfig]):
    """MFPO vs FedPG-BR vs FedAvg-PG, and MFPO's agents and local-steps sweeps."""

    name = "mfpo"
    description = "MFPO vs FedPG-BR vs FedAvg-PG on heterogeneous CartPole/Pendulum; agents and local-steps sweeps"
    paper_reference = "the MFPO paper, section VI: Table I and figs. 3, 5, 6"
    config_class = MFPOConfig

    def estimate_wall_time(self, config: MFPOConfig, seeds: int) -> WallTimeEstimate:
        rates = MEASURED_RATES.get(config.env, {})
        parts: dict[str, float | None] = {}

        def expect(method: str, budget: float, agents: int) -> float | None:
            rate = rates.get(method)
            if method not in SB3_BASELINES[config.env] and budget > 0:
                budget = max(budget, _least_steps(config.env, method))  # whole rounds
            return None if rate is None else rate * seeds * agents * budget / 1e6

        if config.comparison:
            for method in ("MFPO", "FedAvg-PG", "FedPG-BR"):
                parts[method] = expect(method, config.resolved_budget, config.n_agents)
            for method in SB3_BASELINES[config.env] if config.sb3_baselines else ():
                parts[method] = expect(method, sb3_steps_per_agent(config.resolved_sb3_budget, config.n_agents), config.n_agents)
        if config.sweeps:
            # one MFPO run per setting; the K sweep runs n_agents agents (its K barely changes the cost per step)
            agents = sum(config.agent_counts) + config.n_agents * len(config.local_step_counts)
            parts["sweeps"] = expect("MFPO", config.resolved_sweep_budget, agents)
        return WallTimeEstimate(parts, f"{RATES_BASIS} (docs/reproduction_mfpo.md)")

    def run(self, config: MFPOConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        cfg, env = paper_methods(config.env, config.methods), config.env
        if config.normalize_observations:  # after the row's paper settings, which apply to the default methods only
            cfg = replace(cfg, normalize_observations=True)
        # MFPO's own settings: the paper's, or with Adam steps its row's (the other methods keep cfg)
        mfpo_cfg = config.mfpo_methods(cfg)
        sb3_budget, budget, sweep_budget = config.resolved_sb3_budget, config.resolved_budget, config.resolved_sweep_budget
        seed_list = list(range(seeds))
        records: list[dict[str, Any]] = []
        base = {"experiment": self.name, "env": env}
        notes: list[str] = []
        wall: dict[str, float] = {}
        trainers: dict[str, Callable[[Population, Any], list[dict[str, Any]]]] = {
            "MFPO": lambda pop, bar: train_mfpo(pop, budget, config.rounds, bar=bar),
            "FedAvg-PG": lambda pop, bar: train_fedavg(pop, budget, max_rounds=config.rounds, bar=bar),
            "FedPG-BR": lambda pop, bar: train_fedpg_br(pop, budget, max_rounds=config.rounds, bar=bar)[0],
        }
        n = config.n_agents
        for method, train in trainers.items() if config.comparison else ():
            pop = Population(env, seed_list, n, mfpo_cfg if method == "MFPO" else cfg, device)
            points = _timed(progress, method, wall, lambda bar, pop=pop, train=train: train(pop, bar), _size(budget, config.rounds))
            records += _records(points, seed_list, **base, part="comparison", method=method, n_agents=n, local_steps=cfg.local_steps)
        missing = {"Fed-DQN": "missing (issue 7)", "Fed-SAC": "missing (issue 7)"}
        for method in ("Fed-DQN", "Fed-SAC"):
            if method not in SB3_BASELINES[env]:
                missing[method] = "not run: " + ("DQN needs discrete actions" if method == "Fed-DQN" else "SB3's SAC needs continuous actions")
                continue
            if not config.sb3_baselines or not config.comparison:
                missing[method] = "not run (option sb3_baselines off)"
                continue
            try:
                import fedrl_algos.fedavg_sb3  # noqa: F401
            except ImportError:
                continue
            rows = _timed(progress, method, wall, lambda bar, method=method: train_sb3_baseline(method, env, seed_list, sb3_budget, n_agents=n,
                                                                                             device=device, bar=bar),
                          (sb3_steps_per_agent(sb3_budget, n) * len(seed_list), " steps/agent"))
            records += [{**base, "part": "comparison", "method": method, "n_agents": n, "local_steps": None, **r} for r in rows]
            missing.pop(method)
        if config.sweeps:
            settings = [("agents_sweep", agents, cfg.local_steps) for agents in config.agent_counts]
            settings += [("local_steps_sweep", n, k) for k in config.local_step_counts]
            cap = config.sweep_max_local_steps
            for part, agents, k in settings:
                sweep_cfg = replace(mfpo_cfg, local_steps=k if cap is None else min(k, cap))
                pop = Population(env, seed_list, agents, sweep_cfg, device)
                desc = f"MFPO N={agents}" if part == "agents_sweep" else f"MFPO K={k}"
                points = _timed(progress, desc, wall, lambda bar, pop=pop: train_mfpo(pop, sweep_budget, config.sweep_rounds, bar=bar),
                                _size(sweep_budget, config.sweep_rounds))
                records += _records(points, seed_list, **base, part=part, method="MFPO", n_agents=agents, local_steps=k)
        table = self._table(records, config, missing)
        notes += [
            "Fed-DQN and Fed-SAC are issue 7's federated SB3 baselines (FedAvgSB3, parameter averaging of SB3 DQN/SAC); "
            "SB3 has DQN for discrete actions only and SAC for continuous ones, so each environment runs the one that applies.",
            f"Returns are undiscounted evaluation returns of the server policy ({cfg.eval_trajectories} episodes per agent, averaged over the "
            f"{n} heterogeneous agents' tasks); steps are environment steps per agent, counted until each episode ends.",
            "FedAvg-PG uses MFPO's estimator (GPOMDP with a leave-one-out baseline), batch and step-size schedule: the "
            "only differences are MFPO's momentum, importance weights and server step.",
            "wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items()),
        ]
        if config.mfpo_optimizer == "adam":
            notes.append("MFPO ran with Adam steps along its momentum direction (mfpo_optimizer='adam', not the paper's step rule): "
                         + ", ".join(f"{k}={v}" for k, v in mfpo_cfg.describe().items() if v != cfg.describe().get(k)))
        if _mfpo_estimator_note(mfpo_cfg):
            notes.append(f"MFPO ran with {_mfpo_estimator_note(mfpo_cfg)}; FedAvg-PG and FedPG-BR keep the leave-one-out baseline "
                         "and the paper's returns.")
        settings = {"budget": budget, "sweep_budget": sweep_budget, "sb3_budget": sb3_budget, "methods": cfg.describe(), "n_agents": n, "gamma": cfg.gamma,
                    "seeds": seeds, "wall_time_per_method_s": wall, "mfpo_methods": mfpo_cfg.describe()}
        return ExperimentOutput(records=records, table=table, settings=settings, notes=notes)

    def _table(self, records: list[dict[str, Any]], config: MFPOConfig, missing: dict[str, str]) -> list[TableRow]:
        env = config.env
        paper = PAPER_TABLE_I[env]
        rows = []
        ran_comparison = any(r.get("part") == "comparison" for r in records)
        for method in ("Fed-DQN", "FedPG-BR", "Fed-SAC", "MFPO", "FedAvg-PG") if ran_comparison else ():
            p = paper.get(method)
            paper_txt = f"{p[0]:.1f} ± {p[1]:.1f}" if p else None
            if method in missing:
                rows.append(TableRow(f"Table I, {env}: {method}", paper_txt, missing[method], None, "federated SB3 baseline (issue 7)"))
                continue
            mean, std = mean_std(_final(records, part="comparison", method=method))
            note = "final evaluation return (mean over seeds)"
            if method == "MFPO" and _mfpo_estimator_note(config.mfpo_methods(config.methods)):
                note += f"; {_mfpo_estimator_note(config.mfpo_methods(config.methods))}"
            if method in ("Fed-DQN", "Fed-SAC"):
                note += "; issue 7's protocol: deterministic evaluation episodes"
            rows.append(TableRow(f"Table I, {env}: {method}", paper_txt, mean, std, note))
        if env == "cartpole" and ran_comparison:
            reached = _first_reaching(records, 475.0, part="comparison", method="MFPO")
            rows.append(TableRow("MFPO: env steps per agent to a seed-mean return ≥ 475 (target ≤ 1e6)", "≤ 1e6 (target)",
                                 reached if reached is not None else "not reached", None,
                                 # budget 0 is the quick run's: a few rounds, far from any target
                                 "quick run: not meaningful" if config.resolved_budget == 0 else "first evaluation at or above 475"))
        for part, key, values in (("agents_sweep", "n_agents", config.agent_counts), ("local_steps_sweep", "local_steps", config.local_step_counts)):
            # Rounds overshoot the budget by up to a round (K·D trajectories): compare every setting
            # at the step count all of them reached.
            ends = []
            for v in values:
                sub = [r for r in records if r.get("part") == part and r.get(key) == v]
                if sub:
                    last = max(r["round"] for r in sub)
                    ends.append(min(r["step"] for r in sub if r["round"] == last))
            common = min(ends) if ends else 0.0
            for v in values:
                final = _final(records, part=part, **{key: v})
                if not final:
                    continue
                mean, std = mean_std(_at_step(records, common, part=part, **{key: v}) if common > 0 else final)
                fig = "fig. 5" if part == "agents_sweep" else "fig. 6"
                fmean, _ = mean_std(final)
                rows.append(TableRow(f"MFPO, {key} = {v} ({fig})", None, mean, std,
                                     f"return at {common:.3g} env steps per agent (interpolated); at the end of the run {fmean:.1f}"))
        return rows

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        return mfpo_figures(output.records, output.settings, out_dir)


# ------------------------------------------------------------------------------------------------
# fedrl reproduce byzantine
# ------------------------------------------------------------------------------------------------
def _byzantine_methods() -> MethodConfig:
    # FedPG-BR's experimental protocol: an Adam server for both methods, and as the unprotected
    # baseline the server averaging one GPOMDP gradient per agent and round (FedAvg-PG with
    # K = 1, D = 16, the mean of FedPG-BR's B_t).
    return MethodConfig(local_steps=1, n_trajectories=16, server_optimizer="adam")


#: what each attack's Byzantine agents do (the notes of the report)
ATTACK_DESCRIPTIONS = {
    "none": "honest",
    "random_noise": "report g + U(-1, 1)·3·(max g - min g) per coordinate",
    "sign_flip": "report -2.5·g",
    "zero_gradient": "report 0",
    "random_action": "act uniformly at random, report the gradient of those trajectories",
    "reward_flip": "learn from -r",
    "random_reward": "learn from each episode's rewards shuffled (a no-op where every reward is +1, as in CartPole)",
    "fedscspg": "collude: all report mean + 1.5·(largest distance between their gradients)·(random unit direction)",
    "huge_spread": "report -2.5·g and 1000× their spread (to widen σ)",
    "tiny_spread": "report -2.5·g and 1/1000 of their spread (to narrow σ)",
}


@dataclass(frozen=True)
class ByzantineConfig:
    """``byzantine``: FedPG-BR and FedAvg-PG without and with Byzantine agents (FedPG-BR's protocol)."""

    env: str = "cartpole"
    """the family: ``"cartpole"`` or ``"pendulum"`` (:data:`ENVS`)"""
    budget: float = 1e6
    """environment steps per agent of each run (0: ``rounds`` rounds, evaluated every round)"""
    rounds: int = 10**6
    """most communication rounds of a run"""
    n_agents: int = 10
    """agents of the federation (agent i runs the family's task i mod 10)"""
    attacks: tuple[str, ...] = ("none", "random_noise", "sign_flip")
    """the attacks, one run each (``"none"``: no Byzantine agent); any names of
    :data:`fedrl_algos.core.attacks.ATTACKS` (``fedrl reproduce byzantine --attacks all``: every one)"""
    byzantine_agents: tuple[int, ...] = (0, 1, 2)
    """the agents that attack"""
    methods: MethodConfig = field(default_factory=_byzantine_methods)
    """the two methods' hyperparameters (Adam servers, FedAvg-PG with K = 1, D = 16)"""
    algorithms: tuple[str, ...] = ("FedPG-BR", "FedAvg-PG")
    """the methods to run (``("FedPG-BR",)``: the filter's resilience alone, at half the cost)"""

    def __post_init__(self) -> None:
        _check_env(self.env)
        if isinstance(self.attacks, str) or not all(isinstance(a, str) for a in self.attacks) or not self.attacks:
            raise TypeError(f"attacks must be a non-empty tuple of attack names, got {self.attacks!r}")
        unknown = [a for a in self.attacks if a not in ATTACKS]
        if unknown:
            raise ValueError(f"attacks must be names of {sorted(ATTACKS)}, got {unknown}")
        if any(not 0 <= i < self.n_agents for i in self.byzantine_agents):
            raise ValueError(f"byzantine_agents must be agents 0..{self.n_agents - 1}, got {self.byzantine_agents!r}")
        if not self.algorithms or any(a not in ("FedPG-BR", "FedAvg-PG") for a in self.algorithms):
            raise ValueError(f"algorithms must be a non-empty tuple of 'FedPG-BR' and 'FedAvg-PG', got {self.algorithms!r}")

    def quick(self) -> Self:
        """This config as a seconds-long smoke version: 2 rounds of 4 trajectories; ``env`` is kept."""
        return replace(self, methods=_quick_methods(local_steps=1, server_optimizer="adam"), budget=0.0, rounds=2)


class ByzantineExperiment(Experiment[ByzantineConfig]):
    """FedPG-BR and FedAvg-PG with 0 and 3 of 10 Byzantine agents (random noise, sign flipping).

    Both run with an Adam server (FedPG-BR's experimental optimizer); FedAvg-PG with K = 1 local
    step of D = 16 trajectories, i.e. the averaged-gradient baseline of FedPG-BR's experiments.
    """

    name = "byzantine"
    description = "FedPG-BR vs FedAvg-PG with 0 or 3 of 10 Byzantine agents (random noise, sign flipping) on CartPole"
    paper_reference = "FedPG-BR (Fan et al., NeurIPS 2021), the fault-tolerant baseline of the MFPO paper"
    config_class = ByzantineConfig

    def estimate_wall_time(self, config: ByzantineConfig, seeds: int) -> WallTimeEstimate:
        rates = BYZANTINE_RATES.get(config.env, {})
        parts: dict[str, float | None] = {}
        for method in ("FedPG-BR", "FedAvg-PG"):
            for attack in config.attacks:
                rate = rates.get((method, attack))
                parts[f"{method} / {attack}"] = None if rate is None else rate * seeds * config.n_agents * config.budget / 1e6
        return WallTimeEstimate(parts, f"{RATES_BASIS} (docs/reproduction_mfpo.md)")

    def run(self, config: ByzantineConfig, seeds: int, device: str, progress: bool) -> ExperimentOutput:
        cfg, env, seed_list = config.methods, config.env, list(range(seeds))
        n = config.n_agents
        records: list[dict[str, Any]] = []
        filter_stats: dict[str, dict[str, float]] = {}
        wall: dict[str, float] = {}
        for method in config.algorithms:
            for attack in config.attacks:
                byz = () if attack == "none" else config.byzantine_agents
                pop = Population(env, seed_list, n, cfg, device)
                attacked = None if attack == "none" else attack
                if method == "FedPG-BR":
                    points, filter_stats[attack] = _timed(progress, f"{method} / {attack}", wall, lambda bar, pop=pop, a=attacked, b=byz: train_fedpg_br(
                        pop, config.budget, a, b, max_rounds=config.rounds, bar=bar), _size(config.budget, config.rounds))
                else:
                    points = _timed(progress, f"{method} / {attack}", wall, lambda bar, pop=pop, a=attacked, b=byz: train_fedavg(
                        pop, config.budget, a, b, max_rounds=config.rounds, bar=bar), _size(config.budget, config.rounds))
                records += _records(points, seed_list, experiment=self.name, part="byzantine", env=env, method=method, attack=attack,
                                    n_byzantine=len(byz), n_agents=n)
        table = []
        for method in config.algorithms:
            clean, _ = mean_std(_final(records, method=method, attack="none"))
            for attack in config.attacks:
                mean, std = mean_std(_final(records, method=method, attack=attack))
                ratio = mean / clean if (clean not in (None, 0.0) and mean is not None) else None
                note = "no Byzantine agent" if attack == "none" else f"{len(config.byzantine_agents)} of {n} Byzantine; final / attack-free = {ratio:.2f}" if ratio is not None else ""
                if method == "FedPG-BR" and attack != "none" and attack in filter_stats:
                    s = filter_stats[attack]
                    note += f"; filter kept {100 * s['byzantine_kept_fraction']:.0f}% of Byzantine and {100 * s['honest_kept_fraction']:.0f}% of honest reports"
                target = None
                if attack != "none":
                    target = "≥ 90% of attack-free" if method == "FedPG-BR" else "degrades"
                table.append(TableRow(f"{method}, attack = {attack}", target, mean, std, note))
        notes = [
            f"Returns are undiscounted evaluation returns of the server policy, averaged over the {n} heterogeneous agents' tasks.",
            f"Byzantine agents are agents {', '.join(map(str, config.byzantine_agents))}. "
            + "; ".join(f"{a}: {ATTACK_DESCRIPTIONS[a]}" for a in config.attacks if a != "none") + ".",
            f"Both methods step the server with Adam (step size {cfg.fedpg_br_lr:g} for FedPG-BR, {cfg.server_lr:g} for "
            "FedAvg-PG), as FedPG-BR's experiments do; FedAvg-PG is the unprotected baseline of those experiments: every "
            f"round the server averages one GPOMDP gradient from {cfg.n_trajectories} trajectories per agent (K = {cfg.local_steps}).",
            "wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items()),
        ]
        settings = {"methods": cfg.describe(), "byzantine_agents": list(config.byzantine_agents), "gamma": cfg.gamma,
                    "filter": {"sigma": "auto", "delta": 0.6, "max_byzantine_fraction": 0.4}, "wall_time_per_run_s": wall}
        return ExperimentOutput(records=records, table=table, settings=settings, notes=notes)

    def plot(self, output: ExperimentOutput, out_dir: Path) -> list[Path]:
        return byzantine_figures(output.records, out_dir)
