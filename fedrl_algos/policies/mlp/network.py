"""The paper's softmax network as its kernels see it: :class:`SoftmaxMlp` and θ's layout.

The closed forms (:mod:`.kernels`) and the compiled loops (:mod:`.compiled`, :mod:`.compiled_hvp`)
need three things of the policy: the layer sizes, the number of actions (the last size) and which
kernels to run. They take them as a :class:`SoftmaxMlp` (``MlpPolicy.softmax_mlp``), never the
policy object, so no kernel module imports the policy module.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["SoftmaxMlp", "unpack_weights"]


class SoftmaxMlp(NamedTuple):
    """``π(·|x; θ) = softmax(W2ᵀ tanh(W1ᵀx + b1) + b2)``: one tanh hidden layer, ``Discrete`` actions.

    θ ``[*B, d]`` holds ``W1 [i, h]`` (row-major), ``b1 [h]``, ``W2 [h, o]``, ``b2 [o]`` in that
    order: ``d = i·h + h + h·o + o`` (:func:`unpack_weights`).
    """

    #: ``i``, the observation's features
    n_inputs: int
    #: ``h``, the tanh units
    n_hidden: int
    #: ``o``, the actions (the softmax's outputs)
    n_actions: int
    #: ``FastMlpPolicy``'s choice, ``"torch"``, ``"numba"`` or ``"auto"``
    #: (:func:`fedrl_algos.policies.kernel_choice.resolve_kernels`); ``"torch"`` for an ``MlpPolicy``
    kernels: str = "torch"


def unpack_weights(net: SoftmaxMlp, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``theta [R, d]`` → ``W1 [R, i, h]``, ``b1 [R, h]``, ``W2 [R, h, o]``, ``b2 [R, o]`` (views)."""
    i, h, o = net.n_inputs, net.n_hidden, net.n_actions
    rows = theta.shape[0]
    w1 = theta[:, : i * h].reshape(rows, i, h)
    b1 = theta[:, i * h : i * h + h]
    w2 = theta[:, i * h + h : i * h + h + h * o].reshape(rows, h, o)
    b2 = theta[:, i * h + h + h * o :]
    return w1, b1, w2, b2
