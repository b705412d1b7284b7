"""The SB3-style shell of federated averaging: :class:`FedAvgSB3` (Fed-DQN, Fed-SAC, Fed-PPO).

FedAvg (McMahan et al., 2017, https://arxiv.org/abs/1602.05629) around unmodified SB3 learners:
one SB3 model per agent, each trained on its own MDP, and every ``sync_every`` environment steps
(per agent) a server that replaces the chosen networks of every agent by their average. These are
the Fed-DQN and Fed-SAC baselines of the MFPO paper (section VI-A2) and their PPO counterpart.

The server step lives in :mod:`fedrl_algos.fedavg_sb3.aggregation`, the file format in
:mod:`fedrl_algos.fedavg_sb3.persistence`; the MFPO paper's settings of the baselines in
:mod:`fedrl_algos.reproduce.sb3_baselines`. See ``docs/algorithms/fedavg_sb3.md``.
"""

from __future__ import annotations

import copy
import io
import math
import pathlib
import random
import sys
import time
import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.save_util import recursive_setattr
from stable_baselines3.common.type_aliases import MaybeCallback, TrainFrequencyUnit
from stable_baselines3.common.vec_env import VecMonitor

import fedrl_envs
from fedrl_algos.common.learn import EnvFreeLearnMixin, check_optional_dict
from fedrl_algos.common.model_file import (
    ModelFileError,
    class_path,
    collect_save_data,
    decode,
    encode,
    read_model_file,
    write_model_file,
)
from fedrl_algos.core.aggregation import warn_rejected
from fedrl_algos.fedavg_sb3.aggregation import Aggregator, ParameterAverage, broadcast, default_selector
from fedrl_algos.fedavg_sb3.persistence import (
    FORMAT_VERSION,
    agent_kwargs_from_json,
    agent_kwargs_to_json,
    import_class,
    read_archive,
    replay_buffer_member,
    write_archive,
)
from fedrl_envs import derive_keys
from fedrl_envs.rng import seed_from_entropy
from fedrl_envs.validation import check_int
from fedrl_wrappers.federated import FederatedVecEnv
from fedrl_wrappers.snapshot import generator_from_state, tensor_data, tensor_from_data

SelfFedAvgSB3 = TypeVar("SelfFedAvgSB3", bound="FedAvgSB3")

# Attributes this module sets on the agents' SB3 models (never saved in their zips).
_AGENT_EXTRAS = ("_update_current_progress_remaining", "_fedrl_progress_horizon")


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------
def _federated_progress(self: BaseAlgorithm, num_timesteps: int, total_timesteps: int) -> None:
    """Replacement of SB3's progress update for an agent: progress over the whole federated run.

    SB3 computes ``progress_remaining`` from the ``total_timesteps`` of the current ``learn`` call;
    a federation calls ``learn`` once per round, so schedules (DQN's exploration rate, learning-rate
    and clip-range schedules) would restart every round. The horizon is set by :class:`FedAvgSB3`.
    """
    horizon = getattr(self, "_fedrl_progress_horizon", None) or total_timesteps
    self._current_progress_remaining = max(0.0, 1.0 - float(num_timesteps) / float(horizon))


def _silent_logger() -> Logger:
    return Logger(folder=None, output_formats=[])


# --------------------------------------------------------------------------------------------------
# The algorithm
# --------------------------------------------------------------------------------------------------
class FedAvgSB3(EnvFreeLearnMixin, BaseAlgorithm):
    """Federated averaging of an SB3 algorithm: Fed-DQN, Fed-SAC, Fed-PPO, ...

    FedAvg (https://arxiv.org/abs/1602.05629); the Fed-DQN and Fed-SAC baselines of MFPO
    (section VI-A2). Docs: ``docs/algorithms/fedavg_sb3.md``.

    One ``algorithm_class`` model per agent, each on its own MDP. A round runs every agent's own
    ``learn(sync_every)`` in turn (a Python loop over agents: each SB3 model is a separate object
    with its own buffers and optimizers, so the agents cannot be batched into one program as the
    policy-gradient federations are), then the server rule
    :class:`~fedrl_algos.fedavg_sb3.aggregation.ParameterAverage` averages the chosen networks in
    place. Agents start from one initialization (agent 0's networks are broadcast at construction)
    and every round ends with a synchronization.

    ``Fed-DQN = FedAvgSB3(DQN, ...)``, ``Fed-SAC = FedAvgSB3(SAC, ...)``, ``Fed-PPO = FedAvgSB3(PPO, ...)``.

    :param algorithm_class: an SB3 algorithm (``DQN``, ``SAC``, ``PPO``, ``TD3``, ``A2C``, ...)
    :param env: a registered id — a fedrl family (``"fedrl/CartPole-v0"``; default population or
        ``agent_kwargs``) or any Gymnasium id with ``agent_kwargs`` (``"HalfCheetah-v5"``) — or a
        :class:`~fedrl_wrappers.FederatedVecEnv`, whose ``to_sb3(agent=i)`` views are used
    :param n_agents: number of agents: the first ``n_agents`` tasks of a fedrl family (default:
        all of them), or that many identical agents of a Gymnasium id without ``agent_kwargs``
    :param agent_kwargs: one dict of ``gym.make`` keyword arguments per agent (see
        :mod:`fedrl_wrappers.heterogeneity` for MuJoCo and Atari)
    :param sync_every: environment steps per agent between two synchronizations (default: one
        rollout, ``n_steps * n_envs``, for on-policy algorithms; ten training phases,
        ``10 * train_freq * n_envs``, for off-policy ones). Must be a multiple of the SB3 model's
        collection unit (``n_steps * n_envs`` resp. ``train_freq * n_envs``)
    :param aggregate: ``"policy"`` (the policy network), ``"all"`` (also target networks and
        critics), or a server rule object such as ``ParameterAverage(PrefixSelector(...))``
    :param seed: seed of the environments and of each agent's SB3 model (agent ``i`` gets a seed
        derived from ``(seed, i)``); ``None``: drawn at random
    :param algorithm_kwargs: keyword arguments of ``algorithm_class`` (``learning_rate``,
        ``buffer_size``, ``policy_kwargs``, ...) shared by all agents
    :param policy: the SB3 policy of every agent (``"MlpPolicy"``, ``"CnnPolicy"``, or a class)
    :param n_envs: environments per agent when ``env`` is an id
    :param tensorboard_log: TensorBoard log directory of the federation's logger
    :param verbose: 1 prints the federation's metrics every ``log_interval`` rounds
    :param device: torch device of the agents' networks (``"auto"``: CUDA when available)
    """

    def __init__(
        self,
        algorithm_class: type[BaseAlgorithm],
        env: str | FederatedVecEnv | None,
        n_agents: int | None = None,
        agent_kwargs: Sequence[Mapping[str, Any]] | None = None,
        sync_every: int | None = None,
        aggregate: str | Aggregator = "policy",
        seed: int | None = None,
        algorithm_kwargs: Mapping[str, Any] | None = None,
        policy: str | type = "MlpPolicy",
        n_envs: int = 1,
        tensorboard_log: str | None = None,
        verbose: int = 0,
        device: torch.device | str = "auto",
        _init_setup_model: bool = True,
    ) -> None:
        if not (isinstance(algorithm_class, type) and issubclass(algorithm_class, BaseAlgorithm)):
            raise ValueError(f"algorithm_class must be an SB3 algorithm class such as DQN or SAC, got {algorithm_class!r}")
        if isinstance(policy, str):
            if policy not in algorithm_class.policy_aliases:
                raise ValueError(
                    f"policy must be one of {sorted(algorithm_class.policy_aliases)} for "
                    f"{algorithm_class.__name__} or a policy class, got {policy!r}"
                )
            policy_class = algorithm_class.policy_aliases[policy]
        elif isinstance(policy, type):
            policy_class = policy
        else:
            raise ValueError(f"policy must be a policy name or class, got {policy!r}")
        super().__init__(policy=policy_class, env=None, learning_rate=0.0, tensorboard_log=tensorboard_log,
                         verbose=verbose, device=device, seed=seed, support_multi_env=True)
        self.algorithm_class = algorithm_class
        self.policy_name = policy
        algorithm_kwargs = dict(check_optional_dict("algorithm_kwargs", algorithm_kwargs) or {})
        reserved = sorted({"policy", "env", "seed", "device", "verbose", "tensorboard_log"} & set(algorithm_kwargs))
        if reserved:
            raise ValueError(
                f"algorithm_kwargs must not contain {reserved}: FedAvgSB3 sets them (use its own arguments)"
            )
        self.algorithm_kwargs = algorithm_kwargs
        if isinstance(aggregate, str):
            self.aggregator: Aggregator = ParameterAverage(default_selector(aggregate))
            self.aggregate_mode = aggregate
        elif callable(aggregate):
            self.aggregator = aggregate
            self.aggregate_mode = "custom"
        else:
            raise ValueError(f"aggregate must be 'policy', 'all' or a ParameterAverage, got {aggregate!r}")
        self._sync_every_arg = None if sync_every is None else check_int("sync_every", sync_every, low=1)
        self.n_envs_per_agent = check_int("n_envs", n_envs, low=1)
        if self.seed is None:
            self.seed = seed_from_entropy(bits=31)  # SB3's set_random_seed takes 32-bit seeds
        elif isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.rounds_done = 0
        self.agents: list[BaseAlgorithm] = []
        self.fed_env = self._make_env(env, n_agents, agent_kwargs) if env is not None else None
        if _init_setup_model:
            if self.fed_env is None:
                raise ValueError("env must be a registered environment id or a FederatedVecEnv")
            self._setup_model()

    # --- set-up --------------------------------------------------------------------------------
    def _make_env(self, env: Any, n_agents: int | None, agent_kwargs: Any) -> FederatedVecEnv:
        if n_agents is not None:
            n_agents = check_int("n_agents", n_agents, low=1)
        if isinstance(env, FederatedVecEnv):
            if agent_kwargs is not None:
                raise ValueError("agent_kwargs must be None when env is a FederatedVecEnv (its agents are given)")
            if n_agents is not None and n_agents != env.n_agents:
                raise ValueError(f"n_agents must be None or env.n_agents={env.n_agents} for a FederatedVecEnv, got {n_agents}")
            self.n_envs_per_agent = env.n_envs
            return env
        if not isinstance(env, str):
            raise ValueError(f"env must be a registered environment id or a FederatedVecEnv, got {type(env).__name__}")
        if env.startswith("ALE/"):
            try:
                import ale_py  # noqa: F401  (registers the ALE ids)
            except ImportError as err:
                raise ValueError(f"env {env!r} needs the Atari extra: pip install 'fedrl[atari]'") from err
        native = env in fedrl_envs.FAMILIES
        agents = None
        if agent_kwargs is not None:
            if isinstance(agent_kwargs, Mapping) or not isinstance(agent_kwargs, Sequence):
                raise ValueError(f"agent_kwargs must be a list with one dict per agent, got {type(agent_kwargs).__name__}")
            if n_agents is not None and n_agents != len(agent_kwargs):
                raise ValueError(f"n_agents={n_agents} but agent_kwargs has {len(agent_kwargs)} entries (one per agent)")
        elif native:
            if n_agents is not None:
                agents = list(range(n_agents))
        elif n_agents is None:
            raise ValueError(f"n_agents or agent_kwargs is required: {env} has no default population of agents")
        else:
            agent_kwargs = [{} for _ in range(n_agents)]
        return FederatedVecEnv(
            env, self.n_envs_per_agent, agents=agents, agent_kwargs=agent_kwargs, device="cpu", seed=self.seed
        )

    def _agent_seeds(self) -> list[int]:
        keys = derive_keys(int(self.seed), torch.arange(self.n_agents))
        return [int(k) & 0x7FFFFFFF for k in keys.tolist()]

    def _prepare_agent(self, model: BaseAlgorithm) -> None:
        model.set_logger(_silent_logger())
        model._update_current_progress_remaining = types.MethodType(_federated_progress, model)  # type: ignore[method-assign]
        model._fedrl_progress_horizon = None  # type: ignore[attr-defined]

    def _collection_unit(self, model: BaseAlgorithm) -> int | None:
        """Env steps per agent that one SB3 collection phase takes (``None``: whole episodes)."""
        n_envs = model.n_envs
        if isinstance(model, OnPolicyAlgorithm):
            return model.n_steps * n_envs
        if isinstance(model, OffPolicyAlgorithm):
            if model.train_freq.unit == TrainFrequencyUnit.STEP:
                return model.train_freq.frequency * n_envs
            return None
        return n_envs

    def _setup_model(self) -> None:
        assert self.fed_env is not None
        self.env_id = self.fed_env.env_id
        self.n_agents = self.fed_env.n_agents
        self.n_envs = self.n_agents * self.n_envs_per_agent
        self.agent_seeds = self._agent_seeds()
        self.agents = []
        try:
            for i in range(self.n_agents):
                model = self.algorithm_class(
                    self.policy_class,
                    self.fed_env.to_sb3(agent=i),
                    seed=self.agent_seeds[i],
                    device=self.device,
                    verbose=0,
                    **copy.deepcopy(self.algorithm_kwargs),  # SB3 writes into policy_kwargs
                )
                self._prepare_agent(model)
                self.agents.append(model)
                if i == 0:
                    self._set_sync_every(model)
        except BaseException:
            for model in self.agents:
                model.get_env().close()
            raise
        self.observation_space = self.agents[0].observation_space
        self.action_space = self.agents[0].action_space
        # The server's initialization: every agent starts from agent 0's networks (all of them, so
        # that target networks equal their online networks, as in a fresh SB3 model).
        broadcast(self.agents, default_selector("all"), source=0)
        if isinstance(self.aggregator, ParameterAverage):
            self.aggregator.select(self.agents)  # fails now, not at the first round, if nothing fits

    def _set_sync_every(self, model: BaseAlgorithm) -> None:
        unit = self._collection_unit(model)
        if self._sync_every_arg is None:
            if isinstance(model, OnPolicyAlgorithm):
                self.sync_every = unit
            elif unit is not None:
                self.sync_every = 10 * unit
            else:
                self.sync_every = 1000
            return
        if unit is not None and self._sync_every_arg % unit != 0:
            what = "n_steps * n_envs" if isinstance(model, OnPolicyAlgorithm) else "train_freq * n_envs"
            raise ValueError(
                f"sync_every must be a multiple of {what} = {unit} ({type(model).__name__} collects that many "
                f"environment steps per agent at a time), got {self._sync_every_arg}"
            )
        self.sync_every = self._sync_every_arg

    # --- training ------------------------------------------------------------------------------
    @property
    def timesteps_per_round(self) -> int:
        """Environment steps one round takes, summed over agents (``n_agents * sync_every``)."""
        return self.n_agents * self.sync_every

    def synchronize(self) -> dict[str, float]:
        """Run the server rule now (average and broadcast in place); returns its metrics.

        :class:`~fedrl_algos.fedavg_sb3.aggregation.ParameterAverage` rejects agents whose tensors
        are non-finite or of another structure with a ``RejectedUpdateWarning`` naming the round
        (logged as ``fed/rejected_updates``, ``fed/skipped_round``).
        """
        if isinstance(self.aggregator, ParameterAverage):
            context = f"{type(self).__name__}: round {self.rounds_done + 1}"
            return self.aggregator(self.agents, on_reject=lambda check: warn_rejected(check, context))
        return self.aggregator(self.agents)

    def learn(
        self: SelfFedAvgSB3,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "FedAvgSB3",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfFedAvgSB3:
        """Train for ``total_timesteps`` environment steps summed over all agents (whole rounds).

        A round: every agent runs ``learn(sync_every, reset_num_timesteps=False)`` on its own MDP,
        then the server averages (:meth:`synchronize`). Callbacks' ``on_step`` runs once per
        round, after the synchronization (an ``EvalCallback(eval_freq=k)`` evaluates the
        synchronized model every ``k`` rounds); returning ``False`` stops after that round.

        :param total_timesteps: environment steps over all agents (rounded up to whole rounds)
        :param callback: SB3 callback(s)
        :param log_interval: rounds between two logger dumps
        :param tb_log_name: TensorBoard run name
        :param reset_num_timesteps: start the step counters (the federation's and each agent's)
            at 0 and reset the environments, as SB3 does; ``False`` continues a previous run
        :param progress_bar: show a progress bar (tqdm/rich)
        :return: the trained federation
        """
        total_timesteps = check_int("total_timesteps", total_timesteps, low=1)
        log_interval = check_int("log_interval", log_interval, low=1)
        rounds_planned = math.ceil(total_timesteps / self.timesteps_per_round)
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        for model in self.agents:
            start = 0 if reset_num_timesteps else model.num_timesteps
            model._fedrl_progress_horizon = start + rounds_planned * self.sync_every  # type: ignore[attr-defined]
        callback.on_training_start(locals(), globals())
        rounds_this_call = 0
        while self.num_timesteps < total_timesteps:
            callback.on_rollout_start()
            agent_metrics: list[dict[str, float]] = []
            for model in self.agents:  # separate SB3 objects: the loop over agents is inherent here
                before = 0 if (reset_num_timesteps and rounds_this_call == 0) else model.num_timesteps
                model.learn(
                    self.sync_every,
                    log_interval=None,  # type: ignore[arg-type]  (SB3 accepts None: never dump)
                    reset_num_timesteps=reset_num_timesteps and rounds_this_call == 0,
                    progress_bar=False,
                )
                self.num_timesteps += model.num_timesteps - before
                agent_metrics.append(
                    {k: float(v) for k, v in model.logger.name_to_value.items() if isinstance(v, int | float | np.number)}
                )
                model.logger.dump()  # no output formats: just clears the agent's values
            sync_start = time.perf_counter()
            stats = self.synchronize()
            sync_ms = 1e3 * (time.perf_counter() - sync_start)
            self.rounds_done += 1
            rounds_this_call += 1
            self._record_round(stats, agent_metrics, sync_ms)
            callback.update_locals(locals())
            keep_going = callback.on_step()
            callback.on_rollout_end()
            if rounds_this_call % log_interval == 0:
                self.logger.dump(step=self.num_timesteps)
            if not keep_going:
                break
        callback.on_training_end()
        return self

    def _record_round(self, stats: dict[str, float], agent_metrics: list[dict[str, float]], sync_ms: float) -> None:
        log = self.logger
        log.record("fed/round", self.rounds_done)
        for key, value in stats.items():
            log.record(f"fed/{key}", value)
        log.record("fed/sync_ms", sync_ms)
        rewards, lengths = [], []
        for i, model in enumerate(self.agents):
            buf = model.ep_info_buffer
            if buf:
                r = float(np.mean([ep["r"] for ep in buf]))
                rewards.append(r)
                lengths.append(float(np.mean([ep["l"] for ep in buf])))
                log.record(f"agents/ep_rew_mean_{i}", r, exclude="stdout")
        if rewards:
            log.record("rollout/ep_rew_mean", float(np.mean(rewards)))
            log.record("rollout/ep_len_mean", float(np.mean(lengths)))
        keys = sorted({k for m in agent_metrics for k in m if not k.startswith("time/")})
        for key in keys:
            log.record(key, float(np.mean([m[key] for m in agent_metrics if key in m])))
        elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        log.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        log.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        log.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")

    # --- inference and evaluation --------------------------------------------------------------
    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        agent: int = 0,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Agent ``agent``'s action(s), as its SB3 model's ``predict``.

        Right after a synchronization (after :meth:`learn` returns) every agent holds the
        server's networks, so the default ``agent=0`` is the global model.

        :param observation: the input observation(s)
        :param state: the last hidden states (recurrent policies)
        :param episode_start: which environments start a new episode (recurrent policies)
        :param deterministic: return deterministic actions
        :param agent: index of the agent whose model acts, in ``[0, n_agents - 1]``
        :return: the action(s) and the next hidden state
        """
        agent = check_int("agent", agent, low=0, high=self.n_agents - 1)
        return self.agents[agent].predict(observation, state, episode_start, deterministic)

    def evaluate(self, n_episodes: int = 10, seed: int | None = None, deterministic: bool = True) -> np.ndarray:
        """Mean return of each agent's model on its own MDP: ``[n_agents]``.

        Needs a fixed episode limit (fedrl families, MuJoCo): ``n_episodes`` fresh episodes per
        agent run side by side in one fixed-horizon :class:`~fedrl_wrappers.FederatedVecEnv`.

        :param n_episodes: evaluation episodes per agent
        :param seed: seed of the evaluation episodes (default: derived from the federation's seed)
        :param deterministic: act deterministically
        """
        n_episodes = check_int("n_episodes", n_episodes, low=1)
        assert self.fed_env is not None
        if self.fed_env.horizon is None:
            raise ValueError(f"evaluate needs environments with a fixed episode limit; {self.env_id} has none")
        venv = self.fed_env.subset(list(range(self.n_agents)), n_envs=n_episodes, autoreset=False)
        try:

            def policy_fn(obs: torch.Tensor) -> np.ndarray:
                obs_np = obs.cpu().numpy()
                return np.stack(
                    [m.predict(obs_np[i], deterministic=deterministic)[0] for i, m in enumerate(self.agents)]
                )

            traj = venv.rollout(policy_fn, seed=self.seed + 7919 if seed is None else seed)
        finally:
            venv.close()
        return traj.rewards.sum(-1).mean(-1).double().cpu().numpy()

    # --- environment, parameters, persistence --------------------------------------------------
    def get_env(self) -> FederatedVecEnv | None:  # type: ignore[override]
        """The federation the agents' environments were sliced from (``to_sb3(agent=i)``)."""
        return self.fed_env

    def close(self) -> None:
        """Close every agent's environment and the federation they were sliced from."""
        for model in self.agents:
            env = model.get_env()
            if env is not None:
                env.close()
        if self.fed_env is not None:
            self.fed_env.close()

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        raise NotImplementedError("a federation's agents keep their environments; build a new FedAvgSB3 (or load with env=)")

    def get_parameters(self) -> dict[str, dict[str, dict]]:
        """``{"agent_i": agent_i.get_parameters()}``: every agent's policy and optimizer states."""
        return {f"agent_{i}": m.get_parameters() for i, m in enumerate(self.agents)}

    def set_parameters(self, load_path_or_dict: Any, exact_match: bool = True, device: torch.device | str = "auto") -> None:
        """Inverse of :meth:`get_parameters` (a dict with one entry per agent)."""
        if not isinstance(load_path_or_dict, Mapping) or set(load_path_or_dict) != {f"agent_{i}" for i in range(self.n_agents)}:
            raise ValueError(f"load_path_or_dict must be a dict with keys agent_0..agent_{self.n_agents - 1}")
        for i, m in enumerate(self.agents):
            m.set_parameters(load_path_or_dict[f"agent_{i}"], exact_match=exact_match, device=device)

    def _config(self) -> dict[str, Any]:
        assert self.fed_env is not None
        try:
            agent_kwargs_json: str | None = agent_kwargs_to_json(self.fed_env.agent_kwargs)
        except TypeError:
            agent_kwargs_json = None
            warnings.warn("the agents' gym.make kwargs are not JSON-serializable; load() will need env=", stacklevel=3)
        try:
            algorithm_kwargs, tensors, custom = encode(self.algorithm_kwargs)
        except TypeError as err:
            raise TypeError(f"algorithm_kwargs.{err}") from None
        if tensors:
            raise TypeError("algorithm_kwargs must not hold tensors or arrays (they are saved as JSON)")
        if custom:
            warnings.warn(f"algorithm_kwargs {custom} are saved by name only; load() will need algorithm_kwargs=", stacklevel=3)
        return {
            "format_version": FORMAT_VERSION,
            "algorithm_class": class_path(self.algorithm_class),
            "policy": self.policy_name if isinstance(self.policy_name, str) else class_path(self.policy_name),
            "env_id": self.env_id,
            "n_agents": self.n_agents,
            "n_envs": self.n_envs_per_agent,
            "agent_kwargs": agent_kwargs_json,
            "algorithm_kwargs": algorithm_kwargs,
            "sync_every": self.sync_every,
            "aggregate": self.aggregate_mode,
            "seed": int(self.seed),
            "num_timesteps": int(self.num_timesteps),
            "rounds_done": int(self.rounds_done),
            "resume": self._resume_state(),
        }

    def _resume_state(self) -> dict[str, Any]:
        """What an uninterrupted run continues from besides the agents' own files, as plain data:
        each agent's environments mid-episode (:meth:`~fedrl_wrappers.FederatedVecEnv.snapshot`),
        its ``VecMonitor``'s episode in progress and its action space's generator (DQN's random
        actions), and the process's global generators, which SB3 draws from (torch, NumPy, ``random``)."""
        agents = []
        for model in self.agents:
            monitor = _find_vec_env(model.get_env(), VecMonitor)
            space_rng = getattr(model.action_space, "_np_random", None)
            agents.append({
                "env": _federated_env(model).snapshot(),
                "monitor": None if monitor is None else {"returns": monitor.episode_returns.tolist(), "lengths": monitor.episode_lengths.tolist(),
                                                         "count": int(monitor.episode_count)},
                "action_space": None if space_rng is None else space_rng.bit_generator.state,
            })
        numpy_state = np.random.get_state()
        rng = {"torch": tensor_data(torch.get_rng_state()), "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
               "python": _json_tuple(random.getstate())}
        if torch.cuda.is_available() and torch.device(self.device).type == "cuda":
            rng["cuda"] = [tensor_data(s) for s in torch.cuda.get_rng_state_all()]
        return {"agents": agents, "global_rng": rng}

    def _restore_resume_state(self, state: dict[str, Any]) -> None:
        """Give freshly built agents what :meth:`_resume_state` saved (after their files)."""
        if len(state["agents"]) != self.n_agents:
            raise ValueError(f"the saved resume state has {len(state['agents'])} agents, the federation {self.n_agents}")
        for model, saved in zip(self.agents, state["agents"], strict=True):
            _federated_env(model).restore_snapshot(saved["env"])
            monitor = _find_vec_env(model.get_env(), VecMonitor)
            if monitor is not None and saved["monitor"] is not None:
                monitor.episode_returns = np.asarray(saved["monitor"]["returns"], dtype=monitor.episode_returns.dtype)
                monitor.episode_lengths = np.asarray(saved["monitor"]["lengths"], dtype=monitor.episode_lengths.dtype)
                monitor.episode_count = int(saved["monitor"]["count"])
            if saved["action_space"] is not None:
                model.action_space._np_random = generator_from_state(saved["action_space"])
        rng = state["global_rng"]
        torch.set_rng_state(tensor_from_data(rng["torch"]))
        np.random.set_state((rng["numpy"][0], np.asarray(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
        random.setstate(_tuple_json(rng["python"]))
        if "cuda" in rng and torch.cuda.is_available() and torch.device(self.device).type == "cuda":
            torch.cuda.set_rng_state_all([tensor_from_data(s) for s in rng["cuda"]])

    def save(  # type: ignore[override]
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Any = None,
        include: Any = None,
        save_replay_buffer: bool = False,
    ) -> None:
        """Save the federation as one zip: ``fedavg_sb3.json`` and one zip per agent (atomically).

        Each agent's zip has SB3's layout — networks and optimizer states (``*.pth``), torch
        variables (SAC's ``log_ent_coef``), hyperparameters and counters in ``data`` — but its
        ``data`` holds data only (:mod:`fedrl_algos.common.model_file`): what SB3 would pickle
        (the policy and replay-buffer classes, the learning-rate and exploration schedules,
        ``train_freq``) is left out and rebuilt on load from the saved ``algorithm_kwargs``.
        Replay buffers are not saved unless ``save_replay_buffer=True`` (as SB3, which keeps them
        out of its zip and saves them apart with ``save_replay_buffer``); rollout buffers never
        (PPO/A2C refill them each rollout). The run in progress is saved too, as data: each
        agent's environments mid-episode (:meth:`~fedrl_wrappers.FederatedVecEnv.snapshot`), its
        monitor, last observation and action-space generator, and the process's torch, NumPy and
        ``random`` generators, so that a loaded federation continues the run bitwise (off-policy
        agents with their replay buffers: ``save_replay_buffer=True``). Atari's emulator keeps a
        generator the file cannot hold: a warning says so.

        :param path: a file path (without a suffix it gets ``.zip``) or a writable binary file object
        :param exclude: extra attribute names each agent's zip leaves out
        :param include: attribute names each agent's zip keeps anyway
        :param save_replay_buffer: also save every off-policy agent's replay buffer (its arrays as
            tensors, ``agent_<i>_replay_buffer.pt``)
        """
        config = self._config()
        blobs = []
        extra: dict[str, bytes] = {}
        for i, model in enumerate(self.agents):
            data, params, variables = collect_save_data(model, [*_AGENT_EXTRAS, *(exclude or [])], include)
            # What is not data (classes, schedules, train_freq) is rebuilt from the config on load.
            kept = {}
            for key, value in data.items():
                try:
                    _, _, custom = encode({key: value})
                except TypeError:
                    continue
                if not custom:
                    kept[key] = value
            buf = io.BytesIO()
            write_model_file(buf, type(model), kept, params, variables)
            blobs.append(buf.getvalue())
            if save_replay_buffer and getattr(model, "replay_buffer", None) is not None:
                extra[replay_buffer_member(i)] = _replay_buffer_bytes(model.replay_buffer)
        if not all(getattr(_federated_env(model), "exact_random_state", True) for model in self.agents):
            warnings.warn(f"{type(self).__name__}.save: {self.env_id}'s environments keep random state of their own (Atari's "
                          "emulator) that the file cannot hold: a loaded federation trains on, but not bitwise (docs/persistence.md)",
                          stacklevel=2)
        write_archive(path, config, blobs, extra)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfFedAvgSB3],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: FederatedVecEnv | None = None,
        device: torch.device | str = "auto",
        aggregate: Aggregator | None = None,
        algorithm_kwargs: Mapping[str, Any] | None = None,
        allow_pickle: bool = False,
        **kwargs: Any,
    ) -> SelfFedAvgSB3:
        """Load a federation saved by :meth:`save`, without running code from the file.

        The agents are built afresh from the saved configuration (algorithm class and policy
        looked up among the classes already imported, ``algorithm_kwargs``, seeds), then get the
        saved networks, optimizer states and torch variables (``torch.load(weights_only=True)``),
        their counters and hyperparameters, and, when saved, their replay buffers. The environments
        are put back mid-episode (their recorded episodes replayed) and the generators restored, so
        ``learn(..., reset_num_timesteps=False)`` continues the saved run; a file of an earlier fedrl
        (without that state) loads with a warning and starts new episodes. Loading sets the
        process's global torch, NumPy and ``random`` generators (SB3 draws from them).

        :param path: the saved zip (``.zip`` is tried when the path has no suffix and does not exist)
            or a readable binary file object
        :param env: a :class:`~fedrl_wrappers.FederatedVecEnv` with the same number of agents (default:
            rebuilt from the saved id and agent kwargs)
        :param device: device of the agents' networks
        :param aggregate: the server rule, required when the federation was saved with a custom one
        :param algorithm_kwargs: the agents' keyword arguments, instead of the saved ones (needed
            where they held callables saved by name only)
        :param allow_pickle: also load format-1 files (SB3's pickle-based agent zips, written by
            fedrl's first release). **Unsafe**: unpickling can run code from the file; only for
            files you trust (save them again to convert them)
        :param kwargs: with ``allow_pickle`` on a format-1 file: passed to each agent's
            ``algorithm_class.load`` (e.g. ``custom_objects``)
        :raises ValueError: naming the file, for a truncated or corrupt file, an unknown format, a
            pickle-based file without ``allow_pickle``, or agents of another class
        """
        config, blobs, members = read_archive(path, with_members=True)
        name = str(path) if isinstance(path, str | pathlib.Path) else f"<{type(path).__name__}>"
        if config["format_version"] < 2 and not allow_pickle:
            raise ModelFileError(
                f"{name}: a format-{config['format_version']} FedAvgSB3 file, whose agents are SB3's pickle-based zips; "
                "unpickling can run code from the file. If you trust it, load it with allow_pickle=True and save it again to convert it."
            )
        try:
            algorithm_class = import_class(config["algorithm_class"], BaseAlgorithm)
            policy = config["policy"] if ":" not in config["policy"] else import_class(config["policy"], BasePolicy)
        except ValueError as err:
            raise ModelFileError(f"{name}: {err}") from None
        if config["aggregate"] == "custom":
            if aggregate is None:
                raise ValueError("this federation was saved with a custom server rule: pass it as aggregate=")
            mode_or_rule: Any = aggregate
        else:
            mode_or_rule = aggregate if aggregate is not None else config["aggregate"]
        if env is None:
            if config["agent_kwargs"] is None:
                raise ValueError("the saved agent kwargs were not JSON-serializable: pass env=FederatedVecEnv(...)")
            agent_kwargs = agent_kwargs_from_json(config["agent_kwargs"])
            env = FederatedVecEnv(config["env_id"], config["n_envs"], agent_kwargs=agent_kwargs, seed=config["seed"])
        elif not isinstance(env, FederatedVecEnv) or env.n_agents != config["n_agents"]:
            raise ValueError(f"env must be a FederatedVecEnv with {config['n_agents']} agents, got {env!r}")
        if config["format_version"] < 2:
            model = cls._load_pickled_agents(config, blobs, env, algorithm_class, policy, mode_or_rule, device, kwargs)
        else:
            if kwargs:
                raise TypeError(f"FedAvgSB3.load() got unexpected keyword arguments {sorted(kwargs)}")
            if algorithm_kwargs is None:
                algorithm_kwargs = decode({"algorithm_kwargs": config["algorithm_kwargs"]}, {}, name)["algorithm_kwargs"]
            model = cls(algorithm_class, env, aggregate=mode_or_rule, seed=config["seed"], policy=policy,
                        algorithm_kwargs=algorithm_kwargs, sync_every=config["sync_every"], device=device)
            resume = config.get("resume")
            for i, (agent, blob) in enumerate(zip(model.agents, blobs, strict=True)):
                _restore_agent(agent, blob, f"{name}: agent_{i}.zip", device, keep_episode=resume is not None)
                member = replay_buffer_member(i)
                if member in members:
                    _restore_replay_buffer(agent, members[member], f"{name}: {member}")
            if resume is not None:
                try:
                    model._restore_resume_state(resume)
                except (ValueError, KeyError, TypeError) as err:
                    raise ModelFileError(f"{name}: its resume state does not fit the environments ({err})") from None
            else:
                warnings.warn(f"{name}: saved without the environments' episodes and SB3's random generators (an earlier fedrl); "
                              "the loaded federation starts new episodes and does not continue bitwise (save it again to keep them)",
                              stacklevel=2)
        model.num_timesteps = int(config["num_timesteps"])
        model.rounds_done = int(config["rounds_done"])
        return model

    @classmethod
    def _load_pickled_agents(cls, config: dict[str, Any], blobs: list[bytes], env: FederatedVecEnv, algorithm_class: type,
                             policy: Any, mode_or_rule: Any, device: Any, kwargs: dict[str, Any]) -> Any:
        """Format 1 (opt-in, unsafe): each agent through SB3's own ``load``, which unpickles."""
        model = cls(
            algorithm_class, None, aggregate=mode_or_rule, seed=config["seed"], policy=policy,
            n_envs=config["n_envs"], device=device, sync_every=config["sync_every"], _init_setup_model=False,
        )
        model.fed_env = env
        model.env_id = env.env_id
        model.n_agents = env.n_agents
        model.n_envs_per_agent = env.n_envs
        model.n_envs = model.n_agents * env.n_envs
        model.agent_seeds = model._agent_seeds()
        model.agents = []
        for i, blob in enumerate(blobs):
            agent = algorithm_class.load(io.BytesIO(blob), env=env.to_sb3(agent=i), device=device, **kwargs)
            model._prepare_agent(agent)
            model.agents.append(agent)
        model.sync_every = int(config["sync_every"])
        model.observation_space = model.agents[0].observation_space
        model.action_space = model.agents[0].action_space
        return model


# Attributes of an agent that its fresh construction fixes (the env binding) rather than the file.
_AGENT_FIXED = ("observation_space", "action_space", "n_envs", "policy_kwargs", "_last_obs", "_last_episode_starts",
                "_last_original_obs", "device")


#: an agent's episode in progress: restored with its environments' snapshot (else they start afresh)
_AGENT_EPISODE = ("_last_obs", "_last_episode_starts", "_last_original_obs")


def _restore_agent(agent: BaseAlgorithm, blob: bytes, name: str, device: Any, keep_episode: bool = False) -> None:
    """Give a freshly built agent the saved networks, optimizers, variables and counters (and, with
    ``keep_episode``, the last observation its episode in progress continues from)."""
    data, params, variables = read_model_file(io.BytesIO(blob), type(agent), device=agent.device, name=name)
    for key in ("observation_space", "action_space"):
        if key in data and data[key] != getattr(agent, key):
            raise ModelFileError(f"{name}: saved {key} {data[key]} differs from the environment's {getattr(agent, key)}")
    for key in _AGENT_FIXED:
        if not (keep_episode and key in _AGENT_EPISODE):
            data.pop(key, None)
    agent.__dict__.update(data)
    try:
        agent.set_parameters(params, exact_match=True, device=agent.device)
    except (RuntimeError, ValueError, KeyError) as err:
        raise ModelFileError(f"{name}: its parameters do not fit {type(agent).__name__} with the saved algorithm_kwargs ({err})") from None
    for key, value in (variables or {}).items():
        if value is not None:
            recursive_setattr(agent, f"{key}.data", value.data)


def _find_vec_env(env: Any, kind: type) -> Any:
    """The first vector env of type ``kind`` down a chain of SB3 ``VecEnvWrapper`` (``.venv``), or ``None``."""
    while env is not None:
        if isinstance(env, kind):
            return env
        env = getattr(env, "venv", None)
    return None


def _federated_env(model: BaseAlgorithm) -> FederatedVecEnv:
    """The :class:`~fedrl_wrappers.FederatedVecEnv` under an agent's SB3 view (``to_sb3``)."""
    env = _find_vec_env(model.get_env(), FederatedVecEnv)
    if env is None:
        raise TypeError(f"{type(model).__name__}'s environment is not a FederatedVecEnv view")
    return env


def _json_tuple(value: Any) -> Any:
    """Nested tuples as lists (``random.getstate()`` as JSON data)."""
    return [_json_tuple(v) for v in value] if isinstance(value, tuple | list) else value


def _tuple_json(value: Any) -> Any:
    return tuple(_tuple_json(v) for v in value) if isinstance(value, list) else value


def _replay_buffer_bytes(buffer: Any) -> bytes:
    """A replay buffer's arrays and position as tensors (``torch.save``; read back with weights_only)."""
    state: dict[str, Any] = {"pos": torch.tensor(int(buffer.pos)), "full": torch.tensor(bool(buffer.full))}
    for key, value in vars(buffer).items():
        if isinstance(value, np.ndarray):
            state[key] = torch.from_numpy(value.copy())
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            state[key] = {k: torch.from_numpy(v.copy()) for k, v in value.items()}
    out = io.BytesIO()
    torch.save(state, out)
    return out.getvalue()


def _restore_replay_buffer(agent: BaseAlgorithm, blob: bytes, name: str) -> None:
    buffer = getattr(agent, "replay_buffer", None)
    if buffer is None:
        raise ModelFileError(f"{name}: a replay buffer was saved, but {type(agent).__name__} has none")
    try:
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as err:  # weights_only refusals and truncation alike  # noqa: BLE001
        raise ModelFileError(f"{name}: not a replay buffer of tensors ({type(err).__name__}: {err})".splitlines()[0]) from None
    arrays = {k: v for k, v in vars(buffer).items() if isinstance(v, np.ndarray | dict) and k in state}
    for key, current in arrays.items():
        saved = state[key]
        pairs = current.items() if isinstance(current, dict) else [(None, current)]
        for sub, array in pairs:
            tensor = saved[sub] if sub is not None else saved
            restored = tensor.numpy()
            if restored.shape != array.shape or restored.dtype != array.dtype:
                raise ModelFileError(f"{name}: {key} has shape {restored.shape} {restored.dtype}, the agent's buffer {array.shape} {array.dtype}")
            array[...] = restored
    buffer.pos = int(state["pos"])
    buffer.full = bool(state["full"])
