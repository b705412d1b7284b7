"""Multilayer perceptron policies: softmax (``Discrete``) or Gaussian (``Box``) heads over flat θ.

Layout of θ: per layer ``W`` (``[in, out]``, row-major) then ``b`` (``[out]``), layers in order,
then (Gaussian head) the ``log_std`` vector. The paper's arc-navigation network 2 → 32 tanh → 8 has
``d = 2·32 + 32 + 32·8 + 8 = 360``; for it the policy gradient and the Hessian-vector product are
closed forms.

The modules:

* :mod:`.policy` — :class:`MlpPolicy` and :class:`FastMlpPolicy` (imported from here:
  ``fedrl_algos.policies.mlp.MlpPolicy`` is their name in saved model files);
* :mod:`.network` — :class:`~.network.SoftmaxMlp`, the paper's softmax network as the kernels take
  it (``MlpPolicy.softmax_mlp``: layer sizes and kernel choice), and θ's layout for it;
* :mod:`.kernels` — the closed forms of that network in torch (sampling, rollout, policy gradient,
  Hessian-vector product);
* :mod:`.compiled` — the rollouts and policy gradients as compiled loops (``kernels="numba"``,
  :mod:`fedrl_algos.policies.kernel_choice`);
* :mod:`.compiled_hvp` — the Hessian-vector product as compiled loops.
"""

from fedrl_algos.policies.mlp.policy import FastMlpPolicy, MlpPolicy, is_softmax_mlp, resolve_activation

__all__ = ["MlpPolicy", "FastMlpPolicy", "is_softmax_mlp", "resolve_activation"]
