"""Federated vectorized environments and adapters to other RL libraries.

``FederatedVecEnv`` (``wrappers.federated``) runs every agent's own MDP in one batched vector env;
``wrappers.sb3.SB3VecEnv`` (made by ``FederatedVecEnv.to_sb3``) exposes one agent to
Stable-Baselines3. See ``docs/federated_env.md``.
"""

from wrappers.federated import FederatedVecEnv, GenericFederatedVecEnv, NativeFederatedVecEnv, Trajectories

__all__ = ["FederatedVecEnv", "GenericFederatedVecEnv", "NativeFederatedVecEnv", "Trajectories"]
