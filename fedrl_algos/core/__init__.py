"""The batched functional core: trajectory batches, samplers, estimators, aggregation and server optimizers.

Every function here works on flat parameter vectors ``theta [*B, d]`` whose leading dimensions
``B`` index independent problems (typically ``(run, agent)``); nothing loops over agents, runs or
trajectories in Python. The core is a leaf of ``fedrl_algos``: it imports only ``fedrl_envs``, and
reaches a policy's closed forms through the policy's own methods
(:class:`~fedrl_algos.core.protocols.FlatPolicyProtocol`), never by inspecting its type.
"""

from fedrl_algos.core.aggregation import aggregate
from fedrl_algos.core.directions import GradientEstimator, PolicyGradient, local_update
from fedrl_algos.core.estimators import (
    autograd_hvp,
    autograd_score_gradient,
    discounted_rewards_to_go,
    hessian_vector_product,
    masked_log_prob,
    policy_gradient,
    reward_to_go_weights,
)
from fedrl_algos.core.federation import Federation
from fedrl_algos.core.protocols import FlatPolicyProtocol
from fedrl_algos.core.sampling import KernelSampler, Sampler, rollout
from fedrl_algos.core.schedules import ExponentialStepSize, MomentumSchedule
from fedrl_algos.core.trajectories import Trajectories

__all__ = [
    "ExponentialStepSize",
    "Federation",
    "FlatPolicyProtocol",
    "GradientEstimator",
    "KernelSampler",
    "MomentumSchedule",
    "PolicyGradient",
    "Sampler",
    "Trajectories",
    "aggregate",
    "autograd_hvp",
    "autograd_score_gradient",
    "discounted_rewards_to_go",
    "hessian_vector_product",
    "local_update",
    "masked_log_prob",
    "policy_gradient",
    "reward_to_go_weights",
    "rollout",
]
