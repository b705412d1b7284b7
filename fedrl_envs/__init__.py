"""fedrl task families as Gymnasium environments.

Importing this package registers every family under the ``fedrl/`` namespace with both an
``entry_point`` (single env) and a ``vector_entry_point`` (the native batched env, which steps its
kernels in torch and returns NumPy arrays by default, as Gymnasium's vector envs do; torch tensors
with ``array_type="torch"``)::

    >>> import gymnasium as gym, fedrl_envs
    >>> env = gym.make("fedrl/GridWorld-v0", agent=3)
    >>> venv = gym.make_vec("fedrl/ArcNavigation-v0", num_envs=4, vectorization_mode="vector_entry_point")
    >>> type(venv.reset(seed=0)[0]).__name__
    'ndarray'
    >>> tvenv = gym.make_vec("fedrl/ArcNavigation-v0", num_envs=4, array_type="torch")
    >>> type(tvenv.reset(seed=0)[0]).__name__
    'Tensor'
"""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym

from fedrl_envs.arc_navigation import ARC_NAVIGATION, ArcNavigationEnv, ArcNavigationFamily, ArcNavigationParams
from fedrl_envs.cartpole import CARTPOLE, CartPoleEnv, CartPoleFamily, CartPoleParams
from fedrl_envs.family import TaskFamily
from fedrl_envs.gridworld import GRIDWORLD, GridWorldEnv, GridWorldFamily, GridWorldParams
from fedrl_envs.params import index_params, params_to, repeat_params, stack_params
from fedrl_envs.pendulum import PENDULUM, PendulumEnv, PendulumFamily, PendulumParams
from fedrl_envs.rng import RandomStreams, derive_keys
from fedrl_envs.single import FamilyEnv
from fedrl_envs.vector import FamilyVectorEnv

__all__ = [
    "ARC_NAVIGATION",
    "CARTPOLE",
    "GRIDWORLD",
    "PENDULUM",
    "FAMILIES",
    "family_of",
    "get_family",
    "register_family",
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
    "index_params",
    "params_to",
    "repeat_params",
    "stack_params",
]

#: every registered family, by Gymnasium id
FAMILIES: dict[str, TaskFamily] = {}


def register_family(family: TaskFamily, entry_point: Any) -> None:
    """Register a family under its ``env_id``: ``gym.make`` builds its single env from ``entry_point``
    and ``gym.make_vec(..., vectorization_mode="vector_entry_point")`` (``make_vec``'s default mode
    for such an id) its native batched env (NumPy out by default, ``array_type="torch"`` for tensors), and
    the algorithms and ``FederatedVecEnv`` sample it through its kernels when given the id.

    :param family: the family (its ``env_id`` is the id)
    :param entry_point: the single env: a ``"module:Class"`` string or a callable, as ``gym.register``'s
    """
    FAMILIES[family.env_id] = family
    if family.env_id not in gym.registry:
        gym.register(
            id=family.env_id,
            entry_point=entry_point,
            vector_entry_point=partial(FamilyVectorEnv.from_gym_kwargs, family),
        )


def family_of(env_id: str) -> TaskFamily | None:
    """The family behind a registered id, or ``None`` for any other Gymnasium id.

    A family is one of :data:`FAMILIES`, or any id registered (by :func:`register_family` or by a
    plain ``gym.register``) with ``vector_entry_point=partial(FamilyVectorEnv.from_gym_kwargs, family)``.

    :param env_id: a Gymnasium id
    """
    if env_id in FAMILIES:
        return FAMILIES[env_id]
    spec = gym.registry.get(env_id)
    maker = getattr(spec, "vector_entry_point", None)
    if isinstance(maker, partial) and maker.func == FamilyVectorEnv.from_gym_kwargs and maker.args and isinstance(maker.args[0], TaskFamily):
        return maker.args[0]
    return None


def get_family(env_id: str) -> TaskFamily:
    """The family registered under ``env_id`` (``ValueError`` listing the known ids otherwise)."""
    family = family_of(env_id) if isinstance(env_id, str) else None
    if family is None:
        raise ValueError(f"env_id must be a registered fedrl family, one of {sorted(FAMILIES)}; got {env_id!r}")
    return family


register_family(GRIDWORLD, "fedrl_envs.gridworld:GridWorldEnv")
register_family(ARC_NAVIGATION, "fedrl_envs.arc_navigation:ArcNavigationEnv")
register_family(CARTPOLE, "fedrl_envs.cartpole:CartPoleEnv")
register_family(PENDULUM, "fedrl_envs.pendulum:PendulumEnv")
