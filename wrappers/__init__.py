"""fedrl's federated environments under their public name: the package :mod:`fedrl_wrappers`.

``wrappers`` re-exports :mod:`fedrl_wrappers`: the same classes (``wrappers.FederatedVecEnv is
fedrl_wrappers.FederatedVecEnv``), and ``wrappers.federated``, ``wrappers.sb3`` and
``wrappers.heterogeneity`` are the very module objects ``fedrl_wrappers.federated``, ... .
fedrl's own code imports ``fedrl_wrappers``, so a project with its own module named ``wrappers``
can still use ``fedrl_envs`` and ``fedrl_algos``; such a project imports fedrl's classes from
``fedrl_wrappers``. See ``docs/federated_env.md``.
"""

from fedrl_wrappers import EnvRollout, FederatedVecEnv, GenericFederatedVecEnv, NativeFederatedVecEnv
from fedrl_wrappers import federated as federated

__all__ = ["EnvRollout", "FederatedVecEnv", "GenericFederatedVecEnv", "NativeFederatedVecEnv"]
