"""What a user may pass as a federation's ``env``, resolved to a family and its agents' tasks."""

from __future__ import annotations

from typing import Any

import torch

import fedrl_envs
from fedrl_envs.core import TaskFamily, stack_params

__all__ = ["resolve_federation_env", "n_tasks"]


def resolve_federation_env(env: Any) -> tuple[TaskFamily, Any, Any]:
    """``(family, stacked agent params, env object or None)`` from what a user may pass as ``env``.

    Accepted: a registered fedrl id (its family's training tasks), a :class:`~fedrl_envs.TaskFamily`
    (its training tasks), or any object with ``family`` and ``agent_params`` (a ``FederatedVecEnv``
    on the native backend, a ``FamilyVectorEnv``).

    :param env: what was passed as ``env``
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


def n_tasks(stacked_params: Any) -> int:
    """Number of tasks stacked along the leading axis of a params dataclass."""
    return int(next(v for v in vars(stacked_params).values() if isinstance(v, torch.Tensor)).shape[0])
