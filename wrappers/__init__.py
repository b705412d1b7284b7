"""Federated vectorized environments and adapters to other RL libraries.

``FederatedVecEnv`` (``wrappers.federated``) runs every agent's own MDP in one batched vector env;
its ``rollout`` returns an ``EnvRollout``. ``wrappers.sb3.SB3VecEnv`` (made by
``FederatedVecEnv.to_sb3``) exposes one agent to Stable-Baselines3. See ``docs/federated_env.md``.
"""

from typing import Any

from wrappers.federated import (
    _DEPRECATED,
    EnvRollout,
    FederatedVecEnv,
    GenericFederatedVecEnv,
    NativeFederatedVecEnv,
    _deprecated,
)

__all__ = ["EnvRollout", "FederatedVecEnv", "GenericFederatedVecEnv", "NativeFederatedVecEnv"]


def __getattr__(name: str) -> Any:
    # Deprecated names (``Trajectories``, now ``EnvRollout``) are the federated module's.
    if name in _DEPRECATED:
        return _deprecated(__name__, name, stacklevel=2)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
