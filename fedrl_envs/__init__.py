"""fedrl task families as Gymnasium environments.

Importing this package registers every family under the ``fedrl/`` namespace with both an
``entry_point`` (single env) and a ``vector_entry_point`` (native batched torch env)::

    >>> import gymnasium as gym, fedrl_envs
    >>> env = gym.make("fedrl/GridWorld-v0", agent=3)
    >>> venv = gym.make_vec("fedrl/ArcNavigation-v0", num_envs=4, vectorization_mode="vector_entry_point")
"""

from __future__ import annotations

from functools import partial

import gymnasium as gym

from fedrl_envs.arc_navigation import ARC_NAVIGATION, ArcNavigationEnv, ArcNavigationFamily, ArcNavigationParams
from fedrl_envs.cartpole import CARTPOLE, CartPoleEnv, CartPoleFamily, CartPoleParams
from fedrl_envs.core import (
    FamilyEnv,
    FamilyVectorEnv,
    TaskFamily,
    index_params,
    params_to,
    repeat_params,
    stack_params,
)
from fedrl_envs.gridworld import GRIDWORLD, GridWorldEnv, GridWorldFamily, GridWorldParams
from fedrl_envs.pendulum import PENDULUM, PendulumEnv, PendulumFamily, PendulumParams
from fedrl_envs.rng import RandomStreams, derive_keys

__all__ = [
    "ARC_NAVIGATION",
    "CARTPOLE",
    "GRIDWORLD",
    "PENDULUM",
    "FAMILIES",
    "ArcNavigationEnv",
    "ArcNavigationFamily",
    "ArcNavigationParams",
    "CartPoleEnv",
    "CartPoleFamily",
    "CartPoleParams",
    "FamilyEnv",
    "FamilyVectorEnv",
    "GridWorldEnv",
    "GridWorldFamily",
    "GridWorldParams",
    "PendulumEnv",
    "PendulumFamily",
    "PendulumParams",
    "RandomStreams",
    "TaskFamily",
    "derive_keys",
    "get_family",
    "index_params",
    "params_to",
    "repeat_params",
    "stack_params",
]

#: every registered family, by Gymnasium id
FAMILIES: dict[str, TaskFamily] = {}


def _register(family: TaskFamily, entry_point: str) -> None:
    FAMILIES[family.env_id] = family
    if family.env_id not in gym.registry:
        gym.register(
            id=family.env_id,
            entry_point=entry_point,
            vector_entry_point=partial(FamilyVectorEnv.from_gym_kwargs, family),
        )


def get_family(env_id: str) -> TaskFamily:
    """The family registered under ``env_id`` (``ValueError`` listing the known ids otherwise)."""
    try:
        return FAMILIES[env_id]
    except KeyError:
        raise ValueError(f"env_id must be a registered fedrl family, one of {sorted(FAMILIES)}; got {env_id!r}") from None


_register(GRIDWORLD, "fedrl_envs.gridworld:GridWorldEnv")
_register(ARC_NAVIGATION, "fedrl_envs.arc_navigation:ArcNavigationEnv")
_register(CARTPOLE, "fedrl_envs.cartpole:CartPoleEnv")
_register(PENDULUM, "fedrl_envs.pendulum:PendulumEnv")
