"""The SB3 shell shared by fedrl's policy-gradient federations.

Like sb3-contrib's ARS, these algorithms subclass :class:`~stable_baselines3.common.base_class.BaseAlgorithm`
directly and keep their parameters as one flat vector (``policy.theta``); the numerical work is
delegated to the batched functional core (:mod:`fedrl_algos.core`) with a run axis of length one.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from stable_baselines3.common import utils
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, ProgressBarCallback
from stable_baselines3.common.type_aliases import MaybeCallback

import fedrl_envs
from fedrl_algos.core.federation import Federation, adapt_parameters, combine_seed, seed_from_entropy
from fedrl_algos.core.meta import GradientEstimator
from fedrl_algos.policies import FlatPolicy, MlpPolicy, TabularPolicy
from fedrl_envs.core import FamilyVectorEnv, TaskFamily, check_device, check_int, index_params, params_to, stack_params
from fedrl_envs.rng import RandomStreams, derive_keys

__all__ = ["EnvFreeLearnMixin", "FederatedAlgorithm", "FederatedProgressBar", "resolve_federation_env"]

SelfFederatedAlgorithm = TypeVar("SelfFederatedAlgorithm", bound="FederatedAlgorithm")

# Stream index of adaptation calls (kept apart from training and evaluation streams).
_ADAPT_STREAM = 1 << 42
_PREDICT_STREAM = 1 << 43


class FederatedProgressBar(ProgressBarCallback):
    """SB3's progress bar, advanced by the environment steps a round actually consumed."""

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._start = self.model.num_timesteps

    def _on_step(self) -> bool:
        self.pbar.update(self.model.num_timesteps - self._start - self.pbar.n)
        return True


def resolve_federation_env(env: Any) -> tuple[TaskFamily, Any, Any]:
    """``(family, stacked agent params, env object or None)`` from what a user may pass as ``env``.

    Accepted: a registered fedrl id (its family's training tasks), a :class:`~fedrl_envs.TaskFamily`
    (its training tasks), or any object with ``family`` and ``agent_params`` (a ``FederatedVecEnv``
    on the native backend, a ``FamilyVectorEnv``).
    """
    if isinstance(env, str):
        family = fedrl_envs.get_family(env)
        return family, stack_params(family.train_tasks), None
    if isinstance(env, TaskFamily):
        return env, stack_params(env.train_tasks), None
    family = getattr(env, "family", None)
    params = getattr(env, "agent_params", None)
    if isinstance(family, TaskFamily) and params is not None:
        return family, params, env
    raise ValueError(
        "env must be a registered fedrl family id (e.g. 'fedrl/GridWorld-v0'), a TaskFamily, or a "
        f"FederatedVecEnv over a fedrl family (native backend); got {type(env).__name__}"
    )


def _n_tasks(stacked_params: Any) -> int:
    return int(next(v for v in vars(stacked_params).values() if isinstance(v, torch.Tensor)).shape[0])


def _check_non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return float(value)


class EnvFreeLearnMixin:
    """``learn`` set-up for SB3 algorithms that do not own one SB3 ``VecEnv``.

    SB3's ``_setup_learn`` resets ``self.env``; a federation samples through its own kernels (or
    its agents' own SB3 models), so this version keeps only the counters, the logger and the
    callbacks, and swaps SB3's progress bar for one advanced by the steps actually consumed.
    """

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        self.start_time = time.time_ns()
        if reset_num_timesteps:
            self.num_timesteps = 0
            self._episode_num = 0
        else:
            total_timesteps += self.num_timesteps
        self._total_timesteps = total_timesteps
        self._num_timesteps_at_start = self.num_timesteps
        if not self._custom_logger:
            self._logger = utils.configure_logger(self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps)
        return total_timesteps, self._init_callback(callback, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        if progress_bar:
            callback = [cb for cb in ([callback] if not isinstance(callback, list) else callback) if cb is not None]
            callback = [*callback, FederatedProgressBar()]
        return super()._init_callback(callback, progress_bar=False)


class FederatedAlgorithm(EnvFreeLearnMixin, BaseAlgorithm):
    """Base class: a federation of agents trained by rounds of local policy-gradient steps.

    Subclasses provide :meth:`_make_estimator` (the local update direction) and may override
    :meth:`_train_round`. See :class:`~fedrl_algos.PerFedAvgPG` for the arguments.
    """

    policy_aliases: ClassVar[dict[str, type[FlatPolicy]]] = {"TabularPolicy": TabularPolicy, "MlpPolicy": MlpPolicy}
    policy: FlatPolicy

    def __init__(
        self,
        policy: str | type[FlatPolicy],
        env: Any,
        beta: float,
        tau: int = 5,
        alpha: float = 0.0,
        gamma: float = 0.9,
        agents_per_round: int | None = None,
        eval_trajectories: int | None = None,
        eval_adapt_trajectories: int | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        tensorboard_log: str | None = None,
        seed: int | None = None,
        device: torch.device | str = "auto",
        verbose: int = 0,
        _init_setup_model: bool = True,
    ) -> None:
        if isinstance(policy, str):
            if policy not in self.policy_aliases:
                raise ValueError(f"policy must be one of {sorted(self.policy_aliases)} or a FlatPolicy class, got {policy!r}")
        elif not (isinstance(policy, type) and issubclass(policy, FlatPolicy)):
            raise TypeError(f"policy must be a policy name or a FlatPolicy subclass, got {policy!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
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
        if env is None:
            if _init_setup_model:
                raise ValueError("env must be given (a fedrl family id, a TaskFamily or a FederatedVecEnv)")
            return
        self.beta = _check_non_negative("beta", beta)
        self.tau = check_int("tau", tau)
        self.alpha = _check_non_negative("alpha", alpha)
        if isinstance(gamma, bool) or not (isinstance(gamma, int | float) and 0.0 <= gamma <= 1.0):
            raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        self._bind_env(env)
        # Families with an exact model log exact F and f; the others get a Monte Carlo estimate
        # sized to cost about as much as a round of training (raise it for precise numbers).
        if eval_trajectories is None:
            eval_trajectories = 0 if hasattr(self.family, "next_state_table") else 32
        if eval_adapt_trajectories is None:
            eval_adapt_trajectories = 64
        self.eval_trajectories = check_int("eval_trajectories", eval_trajectories, 0)
        self.eval_adapt_trajectories = check_int("eval_adapt_trajectories", eval_adapt_trajectories, 0)
        if agents_per_round is not None:
            agents_per_round = check_int("agents_per_round", agents_per_round)
            if agents_per_round > self.n_agents:
                raise ValueError(
                    f"agents_per_round must be at most the number of agents ({self.n_agents}), got {agents_per_round}"
                )
        self.agents_per_round = agents_per_round
        if self.seed is None:
            self.seed = seed_from_entropy()
        self.rounds_done = 0
        self.trajectories_per_agent = 0
        self._rng_state: dict[str, Any] | None = None
        if _init_setup_model:
            self._setup_model()

    # --- set-up --------------------------------------------------------------------------------
    def _bind_env(self, env: Any) -> None:
        family, agent_params, env_obj = resolve_federation_env(env)
        if hasattr(self, "family") and type(family) is not type(self.family):
            raise ValueError(f"env must be of family {self.family.env_id}, got {family.env_id}")
        self.family = family
        self.env_id = family.env_id
        self.agent_params = params_to(agent_params, "cpu")
        self.fed_env = env_obj
        one = index_params(self.agent_params, 0)
        self.observation_space = family.observation_space(one)
        self.action_space = family.action_space(one)
        self.n_agents = _n_tasks(self.agent_params)
        self.n_envs = self.n_agents

    def _setup_model(self) -> None:
        try:
            policy = self.policy_class(self.observation_space, self.action_space, **self.policy_kwargs)
        except TypeError as err:
            raise ValueError(f"policy_kwargs {self.policy_kwargs} do not fit {self.policy_class.__name__}: {err}") from err
        self.policy = policy.to(self.device)
        self.policy.seed_predictions(combine_seed(self.seed, _PREDICT_STREAM))
        self.federation = Federation(
            self.family, params_to(self.agent_params, self.device), self.policy, torch.tensor([self.seed]), self.gamma
        )
        if self._rng_state is not None:
            self.federation.load_state_dict(self._rng_state)
        self.estimator = self._make_estimator()
        self.evaluator = self._make_evaluator()

    def _make_estimator(self) -> GradientEstimator:
        raise NotImplementedError

    def _make_evaluator(self) -> Any:
        """Exact evaluator for tabular families (``None`` otherwise)."""
        if not hasattr(self.family, "next_state_table") or not isinstance(self.policy, TabularPolicy):
            return None
        from fedrl_algos.exact import TabularEvaluator

        tasks = [index_params(self.agent_params, i) for i in range(self.n_agents)]
        return TabularEvaluator(self.family, gamma=self.gamma, tasks=tasks)

    # --- properties ----------------------------------------------------------------------------
    @property
    def theta(self) -> torch.Tensor:
        """The shared initialization (server parameters) as a flat tensor ``[d]`` (a copy)."""
        return self.policy.theta.detach().clone()

    @property
    def steps_per_trajectory(self) -> int:
        return self.family.horizon(self.agent_params) + 1

    @property
    def participating_agents(self) -> int:
        return self.agents_per_round or self.n_agents

    @property
    def timesteps_per_round(self) -> int:
        """Environment steps one round consumes, summed over participating agents."""
        return self.participating_agents * self.tau * self.estimator.trajectories_per_step * self.steps_per_trajectory

    # --- training ------------------------------------------------------------------------------
    def _train_round(self) -> None:
        theta = self.policy.theta.detach().unsqueeze(0)
        new_theta, _ = self.federation.round(theta, self.estimator, self.beta, self.tau, self.agents_per_round)
        self.policy.theta.data.copy_(new_theta[0])

    def _log_round(self) -> None:
        if not self.logger.output_formats:
            return  # nothing would show the metrics: spend no rollouts on them
        self.logger.record("train/round", self.rounds_done)
        self.logger.record("train/trajectories_per_agent", self.trajectories_per_agent)
        for key, value in self.evaluate_round().items():
            self.logger.record(f"eval/{key}", value)
        elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")

    def evaluate_round(self) -> dict[str, float]:
        """Metrics of the current parameters: exact ``F`` (post-adaptation) and ``f`` (pre) for
        tabular families; Monte Carlo pre/post-adaptation returns when ``eval_trajectories > 0``."""
        theta = self.policy.theta.detach().unsqueeze(0)
        out: dict[str, float] = {}
        if self.evaluator is not None:
            big_f, small_f = self.evaluator.meta_objective(theta.to(torch.float64).cpu(), self.alpha)
            out["F"] = float(big_f.reshape(-1)[0])
            out["f"] = float(small_f.reshape(-1)[0])
        if self.eval_trajectories > 0:
            pre = self.federation.evaluate(theta, self.eval_trajectories)
            adapted = self.federation.adapted(theta, self.alpha, self.eval_adapt_trajectories)
            post = self.federation.evaluate(adapted, self.eval_trajectories)
            out["pre_adaptation_return"] = float(pre.mean())
            out["post_adaptation_return"] = float(post.mean())
        return out

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
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name or type(self).__name__, progress_bar
        )
        callback.on_training_start(locals(), globals())
        rounds_this_call = 0
        while self.num_timesteps < total_timesteps:
            callback.on_rollout_start()
            self._train_round()
            self.rounds_done += 1
            rounds_this_call += 1
            self.trajectories_per_agent += self.tau * self.estimator.trajectories_per_step
            self.num_timesteps += self.timesteps_per_round
            self._n_updates += self.tau
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

    # --- personalization -----------------------------------------------------------------------
    def _resolve_tasks(self, task: Any) -> Any:
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
    ) -> FlatPolicy | list[FlatPolicy]:
        """Personalize the shared initialization to a task with policy-gradient steps.

        :param task: a training-agent index, a goal tuple, a dict of ``gym.make`` kwargs,
            task parameters (e.g. ``fedrl_envs.ARC_NAVIGATION.heldout_tasks[0]``), or a list of
            these (adapted together in one batched call)
        :param n_trajectories: trajectories per adaptation step (0 returns the initialization)
        :param steps: number of policy-gradient steps
        :param step_size: step size (default: the model's ``alpha``)
        :param seed: seed of the adaptation trajectories (default: derived from the model's seed
            and the number of adaptations so far)
        :return: a copy of the policy (with ``predict``) holding the personalized ``theta``; a list
            for a list of tasks
        """
        many = isinstance(task, list)
        tasks = [self._resolve_tasks(t) for t in (task if many else [task])]
        n_trajectories = check_int("n_trajectories", n_trajectories, 0)
        steps = check_int("steps", steps, 0)
        step_size = self.alpha if step_size is None else _check_non_negative("step_size", step_size)
        params = params_to(stack_params(tasks), self.device)
        theta = self.policy.theta.detach().expand(len(tasks), -1).clone()
        if n_trajectories > 0 and steps > 0:
            counter = getattr(self, "_adapt_calls", 0)
            self._adapt_calls = counter + 1
            key_seed = seed if seed is not None else combine_seed(self.seed, _ADAPT_STREAM + counter)
            streams = RandomStreams(derive_keys(key_seed, torch.arange(len(tasks)) + _ADAPT_STREAM), self.device)
            theta, _ = adapt_parameters(
                self.family, params, self.policy, theta, streams, n_trajectories, steps, step_size, self.gamma
            )
        adapted = []
        for row in theta:
            clone = copy.deepcopy(self.policy)
            clone.theta.data.copy_(row)
            adapted.append(clone)
        return adapted if many else adapted[0]

    # --- environment and persistence -----------------------------------------------------------
    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Bind another environment of the same family (same spaces).

        :param env: a fedrl id, a family or a federated env of the model's family
        :param force_reset: unused (kept for SB3 compatibility)
        """
        observation_space, action_space = self.observation_space, self.action_space
        self._bind_env(env)
        if self.observation_space != observation_space or self.action_space != action_space:
            raise ValueError(
                f"env must have the model's spaces {observation_space} / {action_space}, got "
                f"{self.observation_space} / {self.action_space}"
            )
        self.federation = Federation(
            self.family, params_to(self.agent_params, self.device), self.policy, torch.tensor([self.seed]), self.gamma
        )
        self.evaluator = self._make_evaluator()

    def get_env(self) -> Any:
        """The federated environment this model trains on.

        The one it was built with, or (when built from an id or a family) a native
        :class:`~fedrl_envs.FamilyVectorEnv` with one environment per agent, made on first use.
        """
        if self.fed_env is None:
            self.fed_env = FamilyVectorEnv(self.family, self.agent_params, n_envs=1, device=self.device, seed=self.seed)
        return self.fed_env

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "fed_env", "federation", "estimator", "evaluator"]

    def save(self, path: Any, exclude: Sequence[str] | None = None, include: Sequence[str] | None = None) -> None:
        """Save parameters, configuration and random-stream state (SB3 zip format).

        :param path: file path or file-like object
        :param exclude: further attributes not to save
        :param include: attributes to save although excluded by default
        """
        self._rng_state = self.federation.state_dict()
        try:
            super().save(path, exclude=exclude, include=include)
        finally:
            self._rng_state = None

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfFederatedAlgorithm],
        path: Any,
        env: Any = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfFederatedAlgorithm:
        """Load a saved model; ``env`` optionally rebinds it to another env of the same family.

        :param path: file path or file-like object written by :meth:`save`
        :param env: optional environment of the same family
        :param device: torch device
        :param custom_objects: as SB3's ``load``
        :param print_system_info: as SB3's ``load``
        :param force_reset: unused (kept for SB3 compatibility)
        :param kwargs: attributes to override after loading
        """
        model = super().load(path, env=None, device=device, custom_objects=custom_objects, print_system_info=print_system_info, **kwargs)
        model._rng_state = None
        if env is not None:
            state = model.federation.state_dict()
            model.set_env(env)
            model.federation.load_state_dict(state)
        return model

