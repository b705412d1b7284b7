"""Federated vectorized environments and adapters to other RL libraries.

This is the implementation package; ``wrappers`` is the same package under its public name
(``wrappers.FederatedVecEnv is fedrl_wrappers.FederatedVecEnv``). fedrl's own modules import
``fedrl_wrappers`` only, so a user's own module named ``wrappers`` (a ``wrappers.py`` in the
working directory, common in RL projects) cannot break them; when one is found, importing this
package warns once with :class:`WrappersShadowedWarning`, naming the file.

``FederatedVecEnv`` (``fedrl_wrappers.federated``) runs every agent's own MDP in one batched vector env;
its ``rollout`` returns an ``EnvRollout``. ``fedrl_wrappers.sb3.SB3VecEnv`` (made by
``FederatedVecEnv.to_sb3``) exposes one agent to Stable-Baselines3. See ``docs/federated_env.md``.
"""

from fedrl_wrappers._shadow import WrappersShadowedWarning, warn_if_wrappers_shadowed
from fedrl_wrappers.federated import EnvRollout, FederatedVecEnv, GenericFederatedVecEnv, NativeFederatedVecEnv

__all__ = ["EnvRollout", "FederatedVecEnv", "GenericFederatedVecEnv", "NativeFederatedVecEnv", "WrappersShadowedWarning"]

warn_if_wrappers_shadowed()
