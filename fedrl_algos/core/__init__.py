"""The batched functional core: rollouts, estimators, local steps and aggregation.

Every function here works on flat parameter vectors ``theta [*B, d]`` whose leading dimensions
``B`` index independent problems (typically ``(run, agent)``); nothing loops over agents, runs or
trajectories in Python.
"""

from fedrl_algos.core.estimators import (
    autograd_hvp,
    discounted_rewards_to_go,
    hessian_vector_product,
    policy_gradient,
    tabular_hvp,
    tabular_policy_gradient,
)
from fedrl_algos.core.meta import (
    ExactMetaGradient,
    FirstOrderMetaGradient,
    GradientEstimator,
    PolicyGradient,
    aggregate,
    local_update,
)
from fedrl_algos.core.rollout import Sampler, Trajectories, rollout

__all__ = [
    "ExactMetaGradient",
    "FirstOrderMetaGradient",
    "GradientEstimator",
    "PolicyGradient",
    "Sampler",
    "Trajectories",
    "aggregate",
    "autograd_hvp",
    "discounted_rewards_to_go",
    "hessian_vector_product",
    "local_update",
    "policy_gradient",
    "rollout",
    "tabular_hvp",
    "tabular_policy_gradient",
]
