"""Policies over flat parameter vectors ``theta [*B, d]``, each with its own calculus.

:class:`FlatPolicy` (an SB3 ``BasePolicy``) defines what the core calls — ``log_prob``, ``sample``,
``score_gradient``, ``hvp``, ``kernel_rollout_plan`` — with autograd defaults; :class:`TabularPolicy`
and :class:`MlpPolicy` (the paper's softmax network) override them with closed forms next to their
parametrization, and :class:`FastMlpPolicy` adds fused sampling kernels. :class:`CnnPolicy` is SB3's
Nature CNN for image observations. The network policies share their action heads (categorical, or a
diagonal Gaussian optionally tanh-squashed into the action bounds: :mod:`.heads`). ``docs/policies.md``
lists them all.
"""

from fedrl_algos.policies.base import CategoricalMixin, FlatPolicy, sample_categorical
from fedrl_algos.policies.cnn import CnnPolicy
from fedrl_algos.policies.heads import ActionHeadMixin, GaussianHead
from fedrl_algos.policies.mlp import FastMlpPolicy, MlpPolicy, is_softmax_mlp
from fedrl_algos.policies.tabular import TabularPolicy

__all__ = ["ActionHeadMixin", "CategoricalMixin", "CnnPolicy", "FastMlpPolicy", "FlatPolicy", "GaussianHead", "MlpPolicy", "TabularPolicy", "is_softmax_mlp", "sample_categorical"]
