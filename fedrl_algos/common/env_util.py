"""What a user may pass as a federation's ``env``, resolved to the agents' environments.

One meaning of ``env`` across algorithms:

* a registered fedrl family id or a :class:`~fedrl_envs.TaskFamily`: its training tasks, one agent
  each (or, with ``agent_kwargs``, one task per dict of ``make_params`` arguments), sampled through
  the family's batched kernels;
* a :class:`~fedrl_wrappers.FederatedVecEnv` of either backend (or a native ``FamilyVectorEnv``): its agents;
* any other registered Gymnasium id with ``agent_kwargs=[{...}, ...]`` (one ``gym.make`` dict per
  agent) or ``n_agents=N`` (identical copies): a generic ``FederatedVecEnv`` is built for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

import fedrl_envs
from fedrl_envs.family import TaskFamily
from fedrl_envs.params import stack_params
from fedrl_envs.validation import check_int
from fedrl_wrappers.federated import FederatedVecEnv, resolve_env_id

__all__ = ["FederationEnv", "resolve_federation_env", "n_tasks", "DEFAULT_ENVS_PER_AGENT", "envs_per_agent"]

#: environments per agent of a generic federated env built from a Gymnasium id (each sampling call
#: makes ``ceil(m / n_envs)`` passes; pass your own ``FederatedVecEnv`` to choose)
DEFAULT_ENVS_PER_AGENT = 16


def envs_per_agent(batch: int | None, most: int = DEFAULT_ENVS_PER_AGENT) -> int:
    """Environments per agent for sampling ``batch`` episodes per agent and call.

    A generic env steps all its environments on every pass, so a call that keeps fewer episodes
    than the env has pays for the rest: the fewest passes ``most`` environments allow, with the
    episodes spread evenly over them (``ceil(batch / passes)``; 20 episodes: 2 passes of 10, not
    of 16).

    :param batch: episodes per agent of one sampling call (``None``: ``most``)
    :param most: the most environments per agent
    """
    if batch is None:
        return most
    batch = check_int("batch", batch)
    passes = -(-batch // most)
    return -(-batch // passes)


@dataclass
class FederationEnv:
    """The agents of a federation, whichever way they were given.

    :param family: the fedrl family (``None`` for a Gymnasium env)
    :param agent_params: the agents' stacked task parameters (family only)
    :param env: the environment object: the one passed, or the generic ``FederatedVecEnv`` built
        for a Gymnasium id (``None`` for a family id or ``TaskFamily``)
    :param env_id: the registered id
    :param n_agents: number of agents
    :param observation_space: one environment's observation space
    :param action_space: one environment's action space
    :param agent_kwargs: each agent's ``gym.make`` keyword arguments (Gymnasium envs)
    """

    family: TaskFamily | None
    agent_params: Any
    env: Any
    env_id: str
    n_agents: int
    observation_space: gym.Space
    action_space: gym.Space
    agent_kwargs: list[dict[str, Any]] | None = None

    @property
    def generic(self) -> bool:
        """Whether the agents are Gymnasium envs (sampled through the federated env's rollouts)."""
        return self.family is None


def n_tasks(stacked_params: Any) -> int:
    """Number of tasks stacked along the leading axis of a params dataclass."""
    return int(next(v for v in vars(stacked_params).values() if isinstance(v, torch.Tensor)).shape[0])


def _check_spaces(name: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    if isinstance(observation_space, gym.spaces.Dict | gym.spaces.Tuple):
        raise ValueError(
            f"{name} must have a Box or Discrete observation space; got {type(observation_space).__name__} "
            "(flatten it with gymnasium.wrappers.FlattenObservation)"
        )
    if not isinstance(action_space, gym.spaces.Box | gym.spaces.Discrete):
        raise ValueError(f"{name} must have a Box or Discrete action space, got {action_space}")


def _family_env(family: TaskFamily, agent_kwargs: Any) -> FederationEnv:
    tasks = family.train_tasks if agent_kwargs is None else [family.make_params(**dict(kw)) for kw in agent_kwargs]
    params = stack_params(tasks)
    return FederationEnv(family, params, None, family.env_id, n_tasks(params), family.observation_space(tasks[0]),
                         family.action_space(tasks[0]))


def resolve_federation_env(
    env: Any, agent_kwargs: Any = None, n_agents: int | None = None, n_envs: int | None = None, seed: int | None = None,
    device: Any = "cpu",
) -> FederationEnv:
    """The agents' environments from what a user may pass as ``env`` (see the module docstring).

    :param env: a fedrl id, a ``TaskFamily``, a ``FederatedVecEnv`` / ``FamilyVectorEnv``, or a Gymnasium id
    :param agent_kwargs: one dict per agent (a fedrl id: ``make_params`` arguments; a Gymnasium id:
        ``gym.make`` arguments)
    :param n_agents: a Gymnasium id only: that many identical agents
    :param n_envs: a Gymnasium id only: environments per agent of the env built for it
        (default :data:`DEFAULT_ENVS_PER_AGENT`)
    :param seed: seed of the env built for a Gymnasium id
    :param device: torch device of the env built for a Gymnasium id
    :raise ValueError: naming the argument, for anything else
    """
    if agent_kwargs is not None and n_agents is not None:
        raise ValueError("pass either agent_kwargs (one dict per agent) or n_agents (identical agents), not both")
    if isinstance(env, str):
        env = resolve_env_id(env)  # "module:EnvId", as gym.make takes it
    if isinstance(env, TaskFamily) or (isinstance(env, str) and fedrl_envs.family_of(env) is not None):
        if n_agents is not None:
            raise ValueError("n_agents applies to Gymnasium ids; a fedrl family's agents are its training tasks, or one per agent_kwargs dict")
        family = env if isinstance(env, TaskFamily) else fedrl_envs.get_family(env)
        return _family_env(family, agent_kwargs)
    if isinstance(env, str):
        if env not in gym.registry:
            raise ValueError(f"env must be a registered fedrl family or Gymnasium id, got {env!r}")
        if agent_kwargs is None and n_agents is None:
            raise ValueError(
                f"agent_kwargs (one gym.make dict per agent) or n_agents (identical agents) must be given to federate {env!r}"
            )
        if n_agents is not None:
            agent_kwargs = [{} for _ in range(check_int("n_agents", n_agents))]
        try:
            built = FederatedVecEnv(env, check_int("n_envs", DEFAULT_ENVS_PER_AGENT if n_envs is None else n_envs), agent_kwargs=agent_kwargs,
                                    autoreset=False, seed=seed, device=device)
        except TypeError as err:
            raise ValueError(f"env {env!r}: {err}") from err
        return _generic_env(built, "env")
    if agent_kwargs is not None or n_agents is not None:
        raise ValueError("agent_kwargs and n_agents go with an env id; an env object already has its agents")
    if isinstance(env, FederatedVecEnv) and env.backend == "generic":
        return _generic_env(env, "env")
    family = getattr(env, "family", None)
    params = getattr(env, "agent_params", None)
    if isinstance(family, TaskFamily) and params is not None:
        one = fedrl_envs.index_params(params, 0)
        return FederationEnv(family, params, env, family.env_id, n_tasks(params), family.observation_space(one), family.action_space(one))
    raise ValueError(
        "env must be a registered fedrl family id (e.g. 'fedrl/GridWorld-v0'), a TaskFamily, a FederatedVecEnv, or a "
        f"registered Gymnasium id with agent_kwargs or n_agents; got {type(env).__name__}"
    )


def _generic_env(env: FederatedVecEnv, name: str) -> FederationEnv:
    _check_spaces(name, env.single_observation_space, env.single_action_space)
    return FederationEnv(None, None, env, env.env_id, env.n_agents, env.single_observation_space, env.single_action_space,
                         [dict(kw) for kw in env.agent_kwargs])
