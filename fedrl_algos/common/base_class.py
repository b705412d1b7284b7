"""The SB3 shell shared by fedrl's policy-gradient federations.

Like sb3-contrib's ARS, these algorithms subclass :class:`~stable_baselines3.common.base_class.BaseAlgorithm`
directly and keep their parameters as one flat vector (``policy.theta``); the numerical work is
delegated to the batched functional core (:mod:`fedrl_algos.core`) and to each algorithm's update
module, with a run axis of length one.
"""

from __future__ import annotations

import copy
import json
import sys
import time
import warnings
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from gymnasium import spaces as gym_spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.save_util import recursive_setattr
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.utils import get_device, get_system_info

from fedrl_algos.common.env_util import DEFAULT_ENVS_PER_AGENT, envs_per_agent, resolve_federation_env
from fedrl_algos.common.evaluation import DEFAULT_EVAL_TRAJECTORIES, PER_AGENT_PREFIX
from fedrl_algos.common.learn import EnvFreeLearnMixin, check_log_dir, check_optional_dict
from fedrl_algos.common.model_file import ModelFileError, collect_save_data, read_model_file, write_model_file
from fedrl_algos.common.round_protocol import RoundProtocol
from fedrl_algos.core.adaptation import check_adaptation_baseline
from fedrl_algos.core.aggregation import UpdateCheck, warn_rejected
from fedrl_algos.core.capture import check_capture
from fedrl_algos.core.directions import check_step_size
from fedrl_algos.core.env_sampling import EnvSampler
from fedrl_algos.core.exact import TabularEvaluator, has_exact_model
from fedrl_algos.core.federation import Federation, adapt_with_sampler, combine_seed
from fedrl_algos.core.normalization import ObservationNormalizer
from fedrl_algos.core.sampling import KernelSampler
from fedrl_algos.policies import CnnPolicy, FlatPolicy, MlpPolicy, TabularPolicy
from fedrl_envs.params import index_params, params_to, stack_params
from fedrl_envs.rng import RandomStreams, derive_keys, seed_from_entropy
from fedrl_envs.threads import fitted_threads
from fedrl_envs.validation import check_bool, check_device, check_int, check_real, check_seed
from fedrl_envs.vector import FamilyVectorEnv
from fedrl_wrappers import FederatedVecEnv

__all__ = ["FederatedAlgorithm", "adaptation_keys", "check_agents_per_round", "check_gamma"]

SelfFederatedAlgorithm = TypeVar("SelfFederatedAlgorithm", bound="FederatedAlgorithm")

# Stream index of adaptation calls (kept apart from training and evaluation streams).
_ADAPT_STREAM = 1 << 42
_PREDICT_STREAM = 1 << 43


def adaptation_keys(seed: int | torch.Tensor, n_tasks: int) -> torch.Tensor:
    """The stream keys that :meth:`FederatedAlgorithm.adapt` draws from with ``seed=seed``: one per task.

    A batched program that adapts many initializations with these keys (a tensor of seeds, one
    per run) draws the trajectories that ``model.adapt(tasks, n, seed=s)`` draws for each run.

    :param seed: the adaptation seed, or an int64 tensor of seeds ``[*S]``
    :param n_tasks: number of tasks adapted together
    :return: int64 keys ``[*S, n_tasks]``
    """
    if isinstance(seed, torch.Tensor):
        seed = seed.to(torch.int64).unsqueeze(-1)
    return derive_keys(seed, torch.arange(n_tasks) + _ADAPT_STREAM)


def check_gamma(gamma: Any) -> float:
    """The discount as a ``float`` in [0, 1] (``TypeError`` for a non-number, ``ValueError`` outside, naming ``gamma``)."""
    return check_real("gamma", gamma, 0.0, 1.0)


#: the attributes :meth:`FederatedAlgorithm._bind_env` sets (restored when :meth:`~FederatedAlgorithm.set_env` refuses an env)
_ENV_BINDING = ("family", "env_id", "agent_params", "agent_kwargs", "fed_env", "generic_env_layout", "observation_space",
                "action_space", "n_agents", "n_envs")
_UNSET = object()


class FederatedAlgorithm(EnvFreeLearnMixin, BaseAlgorithm):
    """Base class: a federation of agents trained by communication rounds.

    It holds only what every federation has — the policy, the agents' environments, the discount,
    the seed and random streams, the device and the logging — and the SB3 machinery around them
    (``learn`` with callbacks and loggers, ``predict``, ``save``/``load``, ``adapt``). A subclass
    adds its hyperparameters, extends :meth:`_setup_model` with its update, and implements
    :meth:`_train_round`, :attr:`trajectories_per_round` and :meth:`evaluate_round`.

    :param policy: ``"TabularPolicy"``, ``"MlpPolicy"`` or a :class:`~fedrl_algos.policies.FlatPolicy` class
    :param env: the agents' environments: a registered fedrl id (its family's training tasks, or one
        task per ``agent_kwargs`` dict), a task family, a ``FederatedVecEnv`` of either backend, or
        any registered Gymnasium id with ``agent_kwargs`` or ``n_agents`` (see
        :func:`~fedrl_algos.common.env_util.resolve_federation_env`)
    :param gamma: discount γ
    :param eval_trajectories: Monte Carlo rollouts per agent of the logged evaluation
        (:mod:`fedrl_algos.common.evaluation`; ``None``: 32; 0 turns the Monte Carlo part off).
        It runs only when the logger has an output, at each log (every ``log_interval`` rounds),
        on evaluation streams of its own
    :param policy_kwargs: keyword arguments of the policy
    :param tensorboard_log: TensorBoard log directory
    :param seed: seed of every random stream of the run (drawn at random when ``None``)
    :param device: torch device (``"auto"``: CUDA when available)
    :param verbose: 0 silent, 1 logger output to stdout
    :param agent_kwargs: with an env id: one dict per agent (``make_params`` arguments of a fedrl
        family, ``gym.make`` arguments of a Gymnasium env)
    :param n_agents: with a Gymnasium id: that many identical agents
    :param horizon: last time index H of the episodes sampled (``H + 1`` steps; default: the
        family's horizon, or the Gymnasium env's ``max_episode_steps − 1``; required where the env
        has no limit)
    :param normalize_observations: normalize ``Box`` observations with SB3 ``VecNormalize``'s rule
        (running moments, clip ±10), the statistics pooled over agents by the server each round
        (:mod:`fedrl_algos.core.normalization`); ``predict`` and ``adapt`` apply them too
    """

    policy_aliases: ClassVar[dict[str, type[FlatPolicy]]] = {"TabularPolicy": TabularPolicy, "MlpPolicy": MlpPolicy, "CnnPolicy": CnnPolicy}
    policy: FlatPolicy
    #: stop a batch's rollout once all its episodes have terminated (for families whose episodes
    #: end early, e.g. CartPole; the results are unchanged, see ``core.sampling.rollout``)
    stop_rollouts_when_done: ClassVar[bool] = False
    #: the algorithm's round split into its agent and server sides
    #: (:class:`~fedrl_algos.common.round_protocol.RoundProtocol`), which Flower runs; ``None``: it
    #: trains in one process only. Subclasses inherit it; a new algorithm declares its own.
    round_protocol: ClassVar[type[RoundProtocol] | None] = None
    #: the arguments, and their values, where the algorithm's defaults differ from its paper's
    #: settings (defaults measured to learn on fedrl's families); ``Algo(policy, env, **Algo.paper_settings)``
    #: is the paper's algorithm. Empty where the defaults are the paper's (``docs/evaluation.md``)
    paper_settings: ClassVar[dict[str, Any]] = {}
    #: attributes that files saved by earlier versions carry under an older name (renamed on load):
    #: old name → new name
    saved_attribute_renames: ClassVar[dict[str, str]] = {}
    #: attributes that files saved by earlier versions carry and this class no longer has
    #: (dropped on load; e.g. the dummy ``beta``/``tau``/``alpha`` the old shared base required)
    obsolete_attributes: ClassVar[tuple[str, ...]] = ()
    #: attributes that files saved by earlier versions may lack, and the value they ran with then
    #: (the default of that time, where it has since changed): a loaded file continues its own run
    attributes_of_older_files: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        gamma: float,
        eval_trajectories: int | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        agent_kwargs: Sequence[dict[str, Any]] | None = None,
        n_agents: int | None = None,
        horizon: int | None = None,
        normalize_observations: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        if isinstance(policy, str):
            if policy not in self.policy_aliases:
                raise ValueError(f"policy must be one of {sorted(self.policy_aliases)} or a FlatPolicy class, got {policy!r}")
        elif not (isinstance(policy, type) and issubclass(policy, FlatPolicy)):
            raise TypeError(f"policy must be a policy name or a FlatPolicy subclass, got {policy!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if seed is not None and not 0 <= int(seed) < 2**63:
            raise ValueError(f"seed must be in [0, 2**63) (every random stream is keyed by it as an int64), got {seed}")
        check_optional_dict("policy_kwargs", policy_kwargs)
        check_log_dir("tensorboard_log", tensorboard_log)
        verbose = check_int("verbose", verbose, 0)
        if env is not None:
            device = check_device(device) if device != "auto" else device
        super().__init__(
            policy=policy,
            env=None,
            learning_rate=0.0,
            policy_kwargs=policy_kwargs,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            seed=seed,
            support_multi_env=True,
        )
        # Defaults that files saved before these attributes existed rely on (load sets the rest).
        self.horizon = None if horizon is None else check_int("horizon", horizon, 0)
        self.agent_kwargs = None
        self.fed_env = None  # not saved: a loaded model rebuilds a Gymnasium env from agent_kwargs
        self.normalize_observations = check_bool("normalize_observations", normalize_observations)
        self._obs_normalizer_state: dict[str, torch.Tensor] | None = None
        if env is None:
            if _init_setup_model:
                raise ValueError("env must be given (a fedrl family id, a TaskFamily, a FederatedVecEnv or a Gymnasium id)")
            return
        self.gamma = check_gamma(gamma)
        if self.seed is None:
            self.seed = seed_from_entropy()
        self._bind_env(env, agent_kwargs, n_agents)
        # One protocol for every federation (common/evaluation.py): a Monte Carlo estimate sized to
        # cost about as much as a round of training (raise it for precise numbers); tabular
        # families add their exact values.
        if eval_trajectories is None:
            eval_trajectories = DEFAULT_EVAL_TRAJECTORIES
        self.eval_trajectories = check_int("eval_trajectories", eval_trajectories, 0)
        self.rounds_done = 0
        self.trajectories_per_agent = 0
        self._rng_state: dict[str, Any] | None = None
        if _init_setup_model:
            self._setup_model()

    # --- set-up --------------------------------------------------------------------------------
    def _bind_env(self, env: Any, agent_kwargs: Any = None, n_agents: int | None = None) -> None:
        agents = resolve_federation_env(env, agent_kwargs, n_agents, n_envs=envs_per_agent(self.trajectories_per_call), seed=self.seed,
                                        device=self.device)
        if "env_id" in self.__dict__ and agents.env_id != self.env_id:
            raise ValueError(f"env must be of the model's environment {self.env_id}, got {agents.env_id}")
        self.family = agents.family
        self.env_id = agents.env_id
        self.agent_params = None if agents.agent_params is None else params_to(agents.agent_params, "cpu")
        self.agent_kwargs = agents.agent_kwargs
        self.fed_env = agents.env
        # How a loaded model rebuilds a Gymnasium env: the same environments per agent and vectorization.
        self.generic_env_layout = (
            {"n_envs": int(agents.env.n_envs), "vectorization_mode": agents.env.vectorization_mode}
            if agents.generic else None
        )
        self.observation_space = agents.observation_space
        self.action_space = agents.action_space
        self.n_agents = agents.n_agents
        self.n_envs = self.n_agents
        if self.normalize_observations and not isinstance(self.observation_space, gym_spaces.Box):
            raise ValueError(f"normalize_observations needs Box observations, {self.env_id} has {self.observation_space}")

    @property
    def trajectories_per_call(self) -> int | None:
        """Episodes per agent of the model's usual sampling call (its local batch; ``None`` where it
        has none): the env built for a Gymnasium id gets as many environments per agent
        (:func:`~fedrl_algos.common.env_util.envs_per_agent`), so that no pass steps environments
        whose episodes the call then drops."""
        return None

    @property
    def is_generic(self) -> bool:
        """Whether the agents are Gymnasium envs sampled through a ``FederatedVecEnv`` (not a fedrl family)."""
        return self.family is None

    def _generic_env(self, agent_kwargs: Sequence[dict[str, Any]], n_envs: int | None = None, seed: int | None = None) -> Any:
        """A fixed-horizon ``FederatedVecEnv`` of this model's Gymnasium id with the given agents."""
        layout = self.__dict__.get("generic_env_layout") or {}
        return FederatedVecEnv(self.env_id, n_envs or layout.get("n_envs", DEFAULT_ENVS_PER_AGENT), agent_kwargs=list(agent_kwargs),
                               autoreset=False, seed=self.seed if seed is None else seed, device=self.device,
                               vectorization_mode=layout.get("vectorization_mode"))

    def _migrate_saved_attributes(self) -> None:
        """Attributes of a file saved before a rename take their new names (the saved value wins
        over the constructor's default); attributes this class no longer has are dropped."""
        for old, new in type(self).saved_attribute_renames.items():
            if old in self.__dict__:
                self.__dict__[new] = self.__dict__.pop(old)
        for name in type(self).obsolete_attributes:
            self.__dict__.pop(name, None)

    def _make_normalizer(self) -> ObservationNormalizer | None:
        if not self.__dict__.get("normalize_observations", False):
            return None
        normalizer = ObservationNormalizer(self.observation_space.shape, device=self.device)
        if self.__dict__.get("_obs_normalizer_state") is not None:
            normalizer.load_state_dict(self._obs_normalizer_state)
        return normalizer

    @property
    def obs_normalizer(self) -> ObservationNormalizer | None:
        """The federation's observation normalizer (``normalize_observations=True``), else ``None``."""
        return self.federation.normalizer

    def _make_federation(self) -> Federation:
        normalizer = self._make_normalizer()
        if self.is_generic:
            if self.fed_env is None:  # loaded from a file: the env is rebuilt from the agents' kwargs
                self.fed_env = self._generic_env(self.agent_kwargs)
            # Evaluation rollouts on an env of their own, so that they never change the training episodes.
            eval_env = (self._generic_env(self.agent_kwargs, envs_per_agent(self.eval_trajectories), combine_seed(self.seed, 1))
                        if self.eval_trajectories > 0 else None)
            return Federation.from_env(self.fed_env, self.policy, self.seed, self.gamma, self.horizon, eval_env, normalizer,
                                       stop_when_done=self.stop_rollouts_when_done)
        return Federation(
            self.family, params_to(self.agent_params, self.device), self.policy, torch.tensor([self.seed]), self.gamma,
            horizon_override=self.horizon, stop_when_done=self.stop_rollouts_when_done, normalizer=normalizer, capture=self.capture,
        )

    @property
    def capture(self) -> Any:
        """Whether a fedrl family's rollouts run captured (:mod:`fedrl_algos.core.capture`: one compiled
        step, replayed as CUDA graphs): ``"auto"`` (the default: on CUDA), ``True`` or ``False``.
        Setting it applies to the next rollout; it is saved with the model."""
        return self.__dict__.get("_capture", "auto")

    @capture.setter
    def capture(self, value: Any) -> None:
        self._capture = check_capture(value)
        federation = self.__dict__.get("federation")
        if federation is not None and federation.env is None:
            federation.capture = value
            federation.sampler.capture = value
            federation.eval_sampler.capture = value

    def _setup_model(self) -> None:
        """Build the policy, the batched federation (random streams included) and the evaluator;
        subclasses extend it with their update."""
        self._migrate_saved_attributes()
        try:
            policy = self.policy_class(self.observation_space, self.action_space, **self.policy_kwargs)
        except TypeError as err:
            raise ValueError(f"policy_kwargs {self.policy_kwargs} do not fit {self.policy_class.__name__}: {err}") from err
        except ValueError as err:  # the policy cannot act in these spaces
            raise ValueError(f"policy {self.policy_class.__name__} does not fit {self.env_id}: {err}") from err
        self.policy = policy.to(self.device)
        self.policy.seed_predictions(combine_seed(self.seed, _PREDICT_STREAM))
        self.federation = self._make_federation()
        if self._rng_state is not None:
            self._load_random_state(self._rng_state)
        self.evaluator = self._make_evaluator()

    def _make_evaluator(self) -> TabularEvaluator | None:
        """Exact evaluator for tabular families (``None`` otherwise)."""
        if self.is_generic or not has_exact_model(self.family) or not isinstance(self.policy, TabularPolicy):
            return None
        tasks = [index_params(self.agent_params, i) for i in range(self.n_agents)]
        return TabularEvaluator(self.family, gamma=self.gamma, tasks=tasks)

    # --- what a subclass provides --------------------------------------------------------------
    @abstractmethod
    def _train_round(self) -> None:
        """One communication round: update the parameters (and any state) in place."""

    @property
    @abstractmethod
    def trajectories_per_round(self) -> int:
        """Trajectories one participating agent samples per round (the paper's sampling cost)."""

    @abstractmethod
    def evaluate_round(self) -> dict[str, float]:
        """Metrics of the current parameters, logged under ``eval/`` each round."""

    def _parameters_to_check(self) -> torch.Tensor:
        """The parameters a round produced (the server's; per-agent ones where the algorithm keeps them)."""
        return self.policy.theta.detach()

    def _check_finite_parameters(self, round_: int) -> None:
        """Stop training on non-finite parameters instead of training on garbage.

        :raise FloatingPointError: naming the round and how many parameters are NaN or infinite
        """
        theta = self._parameters_to_check()
        bad = ~torch.isfinite(theta)
        if bool(bad.any()):
            raise FloatingPointError(
                f"{type(self).__name__}: round {round_} produced {int(bad.sum())} non-finite parameters of {theta.numel()} "
                "(NaN or inf); training stopped. Smaller step sizes, or normalized rewards or observations, usually help."
            )

    def _reject_updates(self, check: UpdateCheck) -> None:
        """The server rejected agents' updates this round (the update calls it; see
        :func:`~fedrl_algos.core.aggregation.aggregate_valid`): warn naming the round and the
        reasons, and keep the counts for the logger (``server/rejected_updates``, ``server/skipped_round``)."""
        # Plain ints (saved with the model like any attribute): updates rejected, and whether every run skipped.
        self._round_rejected = self.__dict__.get("_round_rejected", 0) + check.n_rejected
        self._round_skipped = int(bool(check.skipped.all()))
        warn_rejected(check, f"{type(self).__name__}: round {self.rounds_done + 1}")

    @property
    def updates_per_round(self) -> int:
        """Parameter updates one round makes (SB3's ``n_updates``); local steps where there are any."""
        return 1

    @property
    def participating_agents(self) -> int:
        """Agents that take part in a round (all of them unless the algorithm samples clients)."""
        return self.n_agents

    @property
    def adaptation_step_size(self) -> float | None:
        """The default step size of :meth:`adapt` (``None``: the algorithm learns none; pass one)."""
        return None

    @property
    def default_adaptation_baseline(self) -> str | None:
        """The baseline :meth:`adapt` uses by default (``None``: the paper's plain estimate, eq. (2))."""
        return None

    # --- properties ----------------------------------------------------------------------------
    @property
    def theta(self) -> torch.Tensor:
        """The shared initialization (server parameters) as a flat tensor ``[d]`` (a copy)."""
        return self.policy.theta.detach().clone()

    @property
    def steps_per_trajectory(self) -> int:
        """``H + 1``: the steps of one (fixed-horizon) episode."""
        return self.federation.horizon + 1

    @property
    def timesteps_per_round(self) -> int:
        """Environment steps one round consumes, summed over participating agents (fixed horizon)."""
        return self.participating_agents * self.trajectories_per_round * self.steps_per_trajectory

    # --- training ------------------------------------------------------------------------------
    def _log_round(self) -> None:
        if not self.logger.output_formats:
            return  # nothing would show the metrics: spend no rollouts on them
        self.logger.record("train/round", self.rounds_done)
        self.logger.record("server/rejected_updates", self.__dict__.get("_round_rejected", 0))
        self.logger.record("server/skipped_round", self.__dict__.get("_round_skipped", 0))
        self.logger.record("train/trajectories_per_agent", self.trajectories_per_agent)
        for key, value in self.evaluate_round().items():
            # per-agent metrics go to the files (CSV, TensorBoard), not into the stdout table
            self.logger.record(f"eval/{key}", value, exclude="stdout" if key.startswith(PER_AGENT_PREFIX) else None)
        elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")

    def learn(
        self: SelfFederatedAlgorithm,
        total_timesteps: int | None = None,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
        total_rounds: int | None = None,
    ) -> SelfFederatedAlgorithm:
        """Train for ``total_rounds`` communication rounds or ``total_timesteps`` environment steps.

        Exactly one of the two totals must be given. ``num_timesteps`` counts environment steps
        over all participating agents; callbacks' ``on_step`` runs once per round (so an
        ``EvalCallback(eval_freq=k)`` evaluates every k rounds).

        :param total_timesteps: environment steps to train for (rounded up to whole rounds)
        :param callback: SB3 callback(s)
        :param log_interval: rounds between two logger dumps
        :param tb_log_name: TensorBoard run name (default: the class name)
        :param reset_num_timesteps: start the step counter at 0
        :param progress_bar: show a progress bar (tqdm/rich)
        :param total_rounds: communication rounds to train for
        :return: the trained model
        """
        if (total_timesteps is None) == (total_rounds is None):
            raise ValueError("exactly one of total_timesteps and total_rounds must be given")
        if total_rounds is not None:
            total_rounds = check_int("total_rounds", total_rounds)
            total_timesteps = total_rounds * self.timesteps_per_round
        total_timesteps = check_int("total_timesteps", total_timesteps)
        log_interval = check_int("log_interval", log_interval)
        reset_num_timesteps = check_bool("reset_num_timesteps", reset_num_timesteps)
        progress_bar = check_bool("progress_bar", progress_bar)
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name or type(self).__name__, progress_bar
        )
        callback.on_training_start(locals(), globals())
        rounds_this_call = 0
        while self.num_timesteps < total_timesteps:
            callback.on_rollout_start()
            self._round_rejected, self._round_skipped = 0, 0  # counted by _reject_updates
            # The round's own operations (broadcast, aggregation, server step) are over [agents, d]: one
            # thread at these sizes; the samplers and estimators it calls fit their own threads.
            with fitted_threads(self.n_agents, self.theta.shape[-1], self.device):
                self._train_round()
            self._check_finite_parameters(self.rounds_done + 1)
            if self.obs_normalizer is not None:
                self.obs_normalizer.commit()  # the server pools the round's observation moments
            self.rounds_done += 1
            rounds_this_call += 1
            self.trajectories_per_agent += self.trajectories_per_round
            self.num_timesteps += self.timesteps_per_round
            self._n_updates += self.updates_per_round
            callback.update_locals(locals())
            keep_going = callback.on_step()
            callback.on_rollout_end()
            if rounds_this_call % log_interval == 0:
                self._log_round()
                self.logger.dump(step=self.num_timesteps)
            if not keep_going:
                break
        callback.on_training_end()
        return self

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False) -> Any:
        """SB3's ``predict`` with the shared parameters, for one observation or a batch (NumPy or torch);
        observations are normalized with the federation's statistics when ``normalize_observations``.

        :param observation: observation(s)
        :param state: unused (no recurrent state)
        :param episode_start: unused
        :param deterministic: the most likely action instead of a sample
        """
        return self.policy.predict(self._policy_observation(observation), state, episode_start, deterministic)

    def _policy_observation(self, observation: Any) -> Any:
        """What the policy reads: the observation, normalized when ``normalize_observations``."""
        normalizer = self.obs_normalizer
        if normalizer is None:
            return observation
        as_tensor = observation.detach() if isinstance(observation, torch.Tensor) else torch.as_tensor(np.asarray(observation))
        return normalizer.normalize(as_tensor, self.policy.param_dtype).cpu().numpy()

    # --- personalization -----------------------------------------------------------------------
    def _resolve_tasks(self, task: Any) -> Any:
        if self.is_generic:
            if isinstance(task, int | np.integer) and not isinstance(task, bool):
                return dict(self.agent_kwargs[check_int("task", task, 0, self.n_agents - 1)])
            if isinstance(task, dict):
                return dict(task)
            raise TypeError(f"task must be a training-agent index or a dict of gym.make keyword arguments of {self.env_id}; got {type(task).__name__}")
        if isinstance(task, int | np.integer) and not isinstance(task, bool):
            if not 0 <= task < self.n_agents:
                raise ValueError(f"task must be an agent index in [0, {self.n_agents - 1}], got {task}")
            return index_params(self.agent_params, int(task))
        if isinstance(task, dict):
            return self.family.make_params(**task)
        if isinstance(task, tuple):
            return self.family.make_params(goal=task)
        if type(task).__name__ == type(index_params(self.agent_params, 0)).__name__:
            return task
        raise TypeError(
            "task must be a training-agent index, a goal tuple, a dict of gym.make keyword arguments, or task parameters "
            f"of {self.env_id}; got {type(task).__name__}"
        )

    def adapt(
        self,
        task: Any,
        n_trajectories: int,
        steps: int = 1,
        step_size: float | None = None,
        seed: int | None = None,
        baseline: str | None = "auto",
    ) -> FlatPolicy | list[FlatPolicy]:
        """Personalize the shared initialization to a task with policy-gradient steps.

        :param task: a training-agent index, a goal tuple, a dict of ``gym.make`` kwargs,
            task parameters (e.g. ``fedrl_envs.ARC_NAVIGATION.heldout_tasks[0]``), or a list of
            these (adapted together in one batched call)
        :param n_trajectories: trajectories per adaptation step (0 returns the initialization)
        :param steps: number of policy-gradient steps
        :param step_size: step size (default: the algorithm's :attr:`adaptation_step_size`, e.g.
            Per-FedAvg-PG's α; required where the algorithm has none)
        :param seed: seed of the adaptation trajectories (default: derived from the model's seed
            and the number of adaptations so far)
        :param baseline: baseline of the adaptation gradient: ``None`` (the paper's eq. (2)),
            ``"loo"`` (unbiased leave-one-out time-dependent mean; lower variance, see
            :mod:`fedrl_algos.core.adaptation`), ``"mean"``, ``"linear"`` (cross-fitted linear feature
            baseline, unbiased), ``"critic"`` (a model trained with the critic: a training agent's index
            takes that agent's critic, a new task the agents' averaged critic; not fitted here), or
            ``"auto"`` (default): the model's :attr:`default_adaptation_baseline` (e.g. Per-FedAvg-PG's
            ``adaptation_baseline``)
        :return: a copy of the policy (with ``predict``) holding the personalized ``theta``; a list
            for a list of tasks
        """
        many = isinstance(task, list)
        tasks = [self._resolve_tasks(t) for t in (task if many else [task])]
        n_trajectories = check_int("n_trajectories", n_trajectories, 0)
        steps = check_int("steps", steps, 0)
        seed = check_seed(seed)
        if step_size is None:
            step_size = self.adaptation_step_size
            if step_size is None:
                raise ValueError(f"step_size must be given: {type(self).__name__} learns no adaptation step size of its own")
        else:
            step_size = check_step_size("step_size", step_size)
        baseline = self.default_adaptation_baseline if baseline == "auto" else check_adaptation_baseline(baseline, "baseline",
                                                                                                         allow_critic=True)
        critic = self._adaptation_critics(task if many else [task]) if baseline == "critic" else None
        theta = self.policy.theta.detach().expand(len(tasks), -1).clone()
        if n_trajectories > 0 and steps > 0:
            counter = self.__dict__.get("_adapt_calls", 0)
            self._adapt_calls = counter + 1
            key_seed = seed if seed is not None else combine_seed(self.seed, _ADAPT_STREAM + counter)
            streams = RandomStreams(adaptation_keys(key_seed, len(tasks)), self.device)
            if self.is_generic:
                env = self._generic_env(tasks, envs_per_agent(n_trajectories), key_seed)
                try:
                    sampler = EnvSampler(env, self.policy, streams, self.federation.horizon, env_seed=key_seed,
                                         normalizer=self.obs_normalizer)
                    theta, _ = adapt_with_sampler(sampler, self.policy, theta, n_trajectories, steps, step_size, self.gamma,
                                                  baseline, critic)
                finally:
                    env.close()
            else:
                params = params_to(stack_params(tasks), self.device)
                sampler = KernelSampler(self.family, params, self.policy, streams, self.horizon, normalizer=self.obs_normalizer)
                theta, _ = adapt_with_sampler(sampler, self.policy, theta, n_trajectories, steps, step_size, self.gamma, baseline,
                                              critic)
        adapted = []
        for row in theta:
            clone = copy.deepcopy(self.policy)
            clone.theta.data.copy_(row)
            adapted.append(clone)
        return adapted if many else adapted[0]

    def _adaptation_critics(self, tasks: Sequence[Any]) -> Any:
        """The critics of an adaptation step with ``baseline="critic"``: only a model trained with
        the critic has them (:class:`~fedrl_algos.common.agent_critic.AgentCriticMixin`)."""
        raise ValueError(f"baseline='critic' needs a model trained with the critic; {type(self).__name__} keeps no critic")

    # --- environment and persistence -----------------------------------------------------------
    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Bind another environment of the same family (same spaces and number of agents).

        The model's training state carries over: parameters, optimizer and critic states, and the
        observation normalizer's running moments. A refused env (another id, other spaces, another
        number of agents where agents keep state, another episode length for a time-aware critic)
        raises ``ValueError`` and leaves the model bound to its previous env.

        :param env: another environment of the model's id (same spaces and, where agents keep state, agents)
        :param force_reset: unused (kept for SB3 compatibility)
        """
        observation_space, action_space, n_agents = self.observation_space, self.action_space, self.n_agents
        bound = {name: self.__dict__.get(name, _UNSET) for name in _ENV_BINDING}
        normalizer = self.obs_normalizer
        try:
            self._bind_env(env)
            if self.observation_space != observation_space or self.action_space != action_space:
                raise ValueError(
                    f"env must have the model's spaces {observation_space} / {action_space}, got "
                    f"{self.observation_space} / {self.action_space}"
                )
            if self.n_agents != n_agents and not self.allows_new_agent_count:
                raise ValueError(f"env must have the model's {n_agents} agents, got {self.n_agents}")
            # the running moments the policy was trained with, not the last saved ones
            self._obs_normalizer_state = None if normalizer is None else normalizer.state_dict()
            federation = self._make_federation()
            self._check_new_federation(federation)
        except Exception:
            for name, value in bound.items():
                if value is _UNSET:
                    self.__dict__.pop(name, None)
                else:
                    self.__dict__[name] = value
            raise
        finally:
            self._obs_normalizer_state = None
        self.federation = federation
        self.evaluator = self._make_evaluator()

    def _check_new_federation(self, federation: Federation) -> None:
        """Refuse (``ValueError``) a federation that :meth:`set_env` would bind but the model's state
        does not fit; subclasses extend it."""

    #: whether :meth:`set_env` may bind a federation of another size (no per-agent state)
    allows_new_agent_count: ClassVar[bool] = True

    def get_env(self) -> Any:
        """The federated environment this model trains on.

        The one it was built with, or (when built from an id or a family) a native
        :class:`~fedrl_envs.FamilyVectorEnv` with one environment per agent, made on first use.
        """
        if self.fed_env is None and not self.is_generic:
            self.fed_env = FamilyVectorEnv(self.family, self.agent_params, n_envs=1, device=self.device, seed=self.seed)
        return self.fed_env

    def _excluded_save_params(self) -> list[str]:
        # ``_last_info`` is the last round's log record (rebuilt by the next round).
        return [*super()._excluded_save_params(), "fed_env", "federation", "evaluator", "_last_info"]

    def _random_state(self) -> dict[str, Any]:
        """Every random stream of the run (training, server, evaluation, ``predict``), as tensors, and
        on a Gymnasium id its environments' generators (``"envs"``: JSON text, so that a loaded
        model continues the same episodes)."""
        state: dict[str, Any] = self.federation.state_dict()
        predict = getattr(self.policy, "_predict_streams", None)
        if predict is not None:
            state["predict"] = predict.state_dict()
        envs = self.federation.env_random_state()
        if envs is not None:
            state["envs"] = json.dumps(envs)
        return state

    def _load_random_state(self, state: dict[str, Any]) -> None:
        self.federation.load_state_dict(state)
        if "predict" in state and getattr(self.policy, "_predict_streams", None) is not None:
            self.policy._predict_streams.load_state_dict(state["predict"])
        if "envs" not in state and self.federation.env is not None:
            warnings.warn(f"{type(self).__name__}: this file holds no random state of its Gymnasium environments (saved by an "
                          "earlier fedrl); their episodes start from their seed, so the run does not continue bitwise "
                          "(save it again to keep them)", stacklevel=3)
        if "envs" in state and self.federation.env is not None:
            try:
                self.federation.load_env_random_state(json.loads(state["envs"]))
            except (ValueError, KeyError, TypeError) as err:
                # Another layout of environments (load(env=...) with other agents or n_envs): they start afresh.
                warnings.warn(f"{type(self).__name__}: the saved environments' random state does not fit these environments "
                              f"({err}); their episodes start from their seed, so the run does not continue bitwise", stacklevel=3)

    def save(self, path: Any, exclude: Sequence[str] | None = None, include: Sequence[str] | None = None) -> None:
        """Save parameters, configuration and random-stream state in fedrl's safe zip format.

        The file holds data only (JSON and tensors; see :mod:`fedrl_algos.common.model_file` and
        ``docs/persistence.md``), and a save to a path is atomic: the path holds the previous file
        or the complete new one, never a partial one. An attribute that is a callable other than
        fedrl's own schedules and attacks (e.g. a lambda step size) is saved by name only and
        must be passed back to :meth:`load` in ``custom_objects``.

        :param path: file path (``.zip`` appended without a suffix) or writable binary file object
        :param exclude: further attributes not to save
        :param include: attributes to save although excluded by default
        """
        self._rng_state = self._random_state()
        self._obs_normalizer_state = None if self.obs_normalizer is None else self.obs_normalizer.state_dict()
        if self.fed_env is not None and not getattr(self.fed_env, "exact_random_state", True):
            warnings.warn(f"{type(self).__name__}.save: {self.env_id}'s environments keep random state of their own (Atari's "
                          "emulator) that the file cannot hold: a loaded model trains on, but not bitwise as this one would "
                          "(docs/persistence.md)", stacklevel=2)
        try:
            data, params, variables = collect_save_data(self, exclude, include)
            by_name = write_model_file(path, type(self), data, params, variables, policy_aliases=self.policy_aliases)
            if by_name:
                warnings.warn(
                    f"{type(self).__name__}.save: {by_name} are callables saved by name only; "
                    f"load() needs them in custom_objects={{{', '.join(repr(n) + ': ...' for n in by_name)}}}",
                    stacklevel=2,
                )
        finally:
            self._rng_state = None
            self._obs_normalizer_state = None

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfFederatedAlgorithm],
        path: Any,
        env: Any = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        allow_pickle: bool = False,
        **kwargs: Any,
    ) -> SelfFederatedAlgorithm:
        """Load a saved model; ``env`` optionally rebinds it to another env of the same family.

        Loading never runs code from the file: its tensors are read with
        ``torch.load(weights_only=True)`` and everything else is JSON data of a closed list of
        types. A truncated or corrupt file, a file saved by another algorithm class, or a file
        holding pickled objects raises a ``ValueError`` naming the file and the problem.

        :param path: file path or file-like object written by :meth:`save`
        :param env: optional environment of the same id
        :param device: torch device
        :param custom_objects: attribute → object used instead of the saved value (as SB3's;
            required for callables saved by name only)
        :param print_system_info: print the system info the file was saved with
        :param force_reset: unused (kept for SB3 compatibility)
        :param allow_pickle: also load files of SB3's pickle-based format, written by fedrl before
            its safe format. **Unsafe**: it unpickles the file's ``data``, which can run arbitrary
            code; only for files you trust (then save them again to convert them)
        :param kwargs: attributes to override after loading
        """
        if device != "auto":
            device = check_device(device)  # a device this machine lacks is refused, as by the constructor
        if print_system_info:
            print("== CURRENT SYSTEM INFO ==")
            get_system_info()
        data, params, variables = read_model_file(
            path, cls, device=get_device(device), custom_objects=custom_objects, allow_pickle=allow_pickle,
            policy_aliases=cls.policy_aliases, print_system_info=print_system_info,
        )
        if "policy_kwargs" in data and "device" in data["policy_kwargs"]:
            del data["policy_kwargs"]["device"]
        if "policy_kwargs" in kwargs and kwargs["policy_kwargs"] != data.get("policy_kwargs"):
            raise ValueError(f"policy_kwargs {kwargs['policy_kwargs']} differ from the saved ones {data.get('policy_kwargs')}")
        missing = [key for key in ("policy_class", "observation_space", "action_space") if key not in data]
        if missing:
            raise ModelFileError(f"{path}: the saved data lacks {missing}; not a {cls.__name__} file")
        model = cls(policy=data["policy_class"], env=None, device=device, _init_setup_model=False)  # type: ignore[call-arg]
        model.__dict__.update(data)
        model.__dict__.update({name: value for name, value in cls.attributes_of_older_files.items() if name not in data})
        model.__dict__.update(kwargs)
        model._setup_model()
        try:
            model.set_parameters(params, exact_match=True, device=device)
        except (RuntimeError, ValueError, KeyError) as err:
            raise ModelFileError(f"{path}: its parameters do not fit {cls.__name__}'s policy ({err})") from None
        for name, value in (variables or {}).items():
            if value is not None:
                try:
                    recursive_setattr(model, f"{name}.data", value.data)
                except (AttributeError, RuntimeError) as err:
                    raise ModelFileError(f"{path}: torch variable {name!r} does not fit the model ({err})") from None
        model._rng_state = None  # _setup_model restored the random streams from it
        model._obs_normalizer_state = None
        if env is not None:
            state = model._random_state()
            model.set_env(env)
            model._load_random_state(state)
        return model


def check_agent_indices(name: str, value: Any) -> list[int]:
    """A collection of agent indices (``[0, 3]``, a ``range``, a 1-D integer array) as a list of
    ``int`` ≥ 0; ``TypeError`` naming ``name`` for a bare number, a string or non-integer entries
    (the range against the federation's size is checked once the agents are known)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray | torch.Tensor | set | frozenset):
        raise TypeError(f"{name} must be a list of agent indices (e.g. [0, 3]), got {type(value).__name__} {value!r}")
    return [check_int(f"{name}[]", k, 0) for k in (value.tolist() if isinstance(value, np.ndarray | torch.Tensor) else value)]


def check_agents_per_round(agents_per_round: Any, n_agents: int) -> int | None:
    """Client sampling's ``agents_per_round`` as an int in ``[1, n_agents]`` or ``None`` (all agents)."""
    if agents_per_round is None:
        return None
    agents_per_round = check_int("agents_per_round", agents_per_round)
    if agents_per_round > n_agents:
        raise ValueError(f"agents_per_round must be at most the number of agents ({n_agents}), got {agents_per_round}")
    return agents_per_round
