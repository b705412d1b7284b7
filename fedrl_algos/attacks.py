"""Deprecated location of the Byzantine attacks: they live in :mod:`fedrl_algos.core.attacks`.

FedPG-BR and FedAvg-PG both apply them, and algorithms do not import each other, so the attacks
moved to the shared core. Importing a name from here still works for one release, with a
``DeprecationWarning``.
"""

from fedrl_algos.common.deprecation import moved_names

__getattr__ = moved_names(__name__, dict.fromkeys(("ATTACKS", "Attack", "NoAttack", "RandomNoise", "SignFlip", "ZeroGradient", "RandomAction", "RewardFlip", "RandomActionPolicy", "AttackedEstimator", "make_attack", "attack_streams"), "fedrl_algos.core.attacks"))
