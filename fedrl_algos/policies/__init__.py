"""Policies over flat parameter vectors ``theta [*B, d]``, each with its own calculus.

:class:`FlatPolicy` (an SB3 ``BasePolicy``) defines what the core calls — ``log_prob``, ``sample``,
``score_gradient``, ``hvp``, ``kernel_rollout_plan`` — with autograd defaults; :class:`TabularPolicy`
and :class:`MlpPolicy` (the paper's softmax network) override them with closed forms next to their
parametrization, and :class:`FastMlpPolicy` adds fused sampling kernels.
"""

from fedrl_algos.policies.base import CategoricalMixin, FlatPolicy, sample_categorical
from fedrl_algos.policies.mlp import FastMlpPolicy, MlpPolicy, is_softmax_mlp
from fedrl_algos.policies.tabular import TabularPolicy

__all__ = ["CategoricalMixin", "FastMlpPolicy", "FlatPolicy", "MlpPolicy", "TabularPolicy", "is_softmax_mlp", "sample_categorical"]
