"""The multilayer perceptron policies :class:`MlpPolicy` and :class:`FastMlpPolicy` (θ's layout: the package docstring).

For the paper's softmax network the policy gradient and the Hessian-vector product are closed forms
(:mod:`fedrl_algos.policies.mlp.kernels`).

The classes are known by the package's name, ``fedrl_algos.policies.mlp`` (their ``__module__``),
where they are imported from and what model files saved before this module moved record as their
class path (``fedrl_algos.common.model_file.class_path``): those files load, and pickles of them too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from fedrl_algos.core.protocols import KernelRolloutPlan
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies.base import CategoricalMixin, FlatPolicy, check_init_gains, orthogonal_matrix
from fedrl_algos.policies.heads import ActionHeadMixin, action_head_for, check_log_std_bounds
from fedrl_algos.policies.kernel_choice import check_policy_kernels
from fedrl_algos.policies.mlp.kernels import mlp_hvp, mlp_policy_gradient, mlp_rollout, mlp_sample
from fedrl_algos.policies.mlp.network import SoftmaxMlp
from fedrl_envs.rng import RandomStreams, derive_keys
from fedrl_envs.validation import check_int, check_real, is_real

__all__ = ["MlpPolicy", "FastMlpPolicy", "is_softmax_mlp", "resolve_activation"]

#: the classes' module as saved model files and pickles name it: the package, not this module
_PUBLIC_MODULE = "fedrl_algos.policies.mlp"

# The activations known by name; their functions are what the closed forms of .kernels assume.
_NAMED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"tanh": torch.tanh, "relu": torch.relu}
_ACTIVATION_NAMES: dict[type[nn.Module], str] = {nn.Tanh: "tanh", nn.ReLU: "relu"}


def resolve_activation(
    activation: str | None, activation_fn: type[nn.Module] | None
) -> tuple[str | None, type[nn.Module] | None, Callable[[torch.Tensor], torch.Tensor]]:
    """The hidden activation from fedrl's ``activation`` name or SB3's ``activation_fn`` class.

    ``torch.nn.Tanh`` and ``torch.nn.ReLU`` are the same as ``"tanh"`` and ``"relu"`` (so the
    paper's network keeps its closed forms whichever way it is named); any other ``torch.nn``
    module class without parameters (``nn.ELU``, ``nn.SiLU``, ...) is instantiated once and applied.

    :param activation: ``"tanh"``, ``"relu"`` or ``None``
    :param activation_fn: a ``torch.nn.Module`` subclass or ``None``
    :return: ``(name or None, class or None, function)``; neither given means ``"tanh"``
    """
    if activation is not None and activation_fn is not None:
        raise ValueError(f"give activation or activation_fn, not both (got activation={activation!r}, activation_fn={activation_fn!r})")
    if activation_fn is None:
        name = "tanh" if activation is None else activation
        if name not in _NAMED_ACTIVATIONS:
            raise ValueError(f"activation must be 'tanh' or 'relu', got {activation!r}")
        return name, None, _NAMED_ACTIVATIONS[name]
    if not (isinstance(activation_fn, type) and issubclass(activation_fn, nn.Module)):
        raise ValueError(f"activation_fn must be a torch.nn.Module class such as torch.nn.Tanh or torch.nn.ReLU, got {activation_fn!r}")
    if activation_fn in _ACTIVATION_NAMES:
        name = _ACTIVATION_NAMES[activation_fn]
        return name, None, _NAMED_ACTIVATIONS[name]
    try:
        module = activation_fn()
    except TypeError as err:
        raise ValueError(f"activation_fn must be constructible without arguments, got {activation_fn!r}: {err}") from err
    if any(True for _ in module.parameters()):
        # Its weights would live outside the flat θ, untrained and unsaved.
        raise ValueError(f"activation_fn must have no parameters (they would not be part of θ), got {activation_fn.__name__}")
    return None, activation_fn, module.forward


class MlpPolicy(ActionHeadMixin, CategoricalMixin, FlatPolicy):
    """Multilayer perceptron with a softmax (``Discrete`` actions) or Gaussian (``Box``) head.

    The default architecture and initialization are the paper's arc-navigation network:
    one hidden layer of 32 tanh units, first-layer weights ~ N(0, 0.5²), last-layer weights
    ~ N(0, 0.1²), biases zero, drawn from ``init_seed`` — so every run of an experiment starts
    from the same shared initialization unless it asks for another seed.

    For ``Box`` actions the head outputs the mean and the policy adds a state-independent
    ``log_std`` vector (initialized to ``log_std_init``) as the last ``action_dim`` parameters.
    The log standard deviation the policy acts with is that vector clamped to ``log_std_bounds``
    (SB3's SAC bounds, −20 and 2): with actions clipped by the environment, a policy gradient can
    otherwise push ``log_std`` without limit (bang-bang actions from a huge σ; measured on
    Pendulum: log σ = 64 after 24 MFPO rounds, then NaN from ``exp(-log_std)²``). The clamp is
    exact, gradient included: beyond a bound the objective does not depend on the parameter, so
    its gradient is zero there and a parameter that steps past a bound stays where it is.

    With ``squash="tanh"`` the Gaussian sample ``u`` becomes the action ``low + (high − low)(tanh(u) + 1)/2``
    and ``log π`` includes the change of variables (:class:`~fedrl_algos.policies.heads.GaussianHead`,
    ``docs/policies.md``).

    :param observation_space: a flat ``Box``
    :param action_space: ``Discrete(A)`` or a ``Box``
    :param net_arch: hidden layer sizes (a list, as SB3's ``net_arch``)
    :param activation: ``"tanh"`` or ``"relu"`` (default ``"tanh"``); give this or ``activation_fn``
    :param activation_fn: the activation as SB3 names it, a ``torch.nn`` module class without
        parameters (``torch.nn.Tanh``, ``torch.nn.ReLU``, ``torch.nn.ELU``, ...)
    :param init_std: standard deviation of each weight layer's initialization (first, ..., last);
        a single float applies to all layers
    :param init_gains: ``(hidden, last)``: orthogonal initialization instead, as SB3's
        ``ActorCriticPolicy`` makes it (``ortho_init``: gain √2 for the hidden layers and 0.01 for
        the action layer, biases zero), drawn from ``init_seed``; ``None`` (default): ``init_std``
    :param init_seed: seed of the initialization
    :param log_std_init: initial log standard deviation (Gaussian head only)
    :param log_std_bounds: ``(low, high)`` clamp of the log standard deviation, or ``None``
    :param squash: ``None`` (an unbounded Gaussian) or ``"tanh"`` (actions squashed into the
        ``Box``'s bounds, which must be finite); ``Box`` actions only
    :param dtype: parameter dtype
    """

    __module__ = _PUBLIC_MODULE

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        net_arch: Sequence[int] = (32,),
        activation: str | None = None,
        init_std: float | Sequence[float] = (0.5, 0.1),
        init_seed: int = 0,
        init_gains: tuple[float, float] | None = None,
        log_std_init: float = 0.0,
        log_std_bounds: tuple[float, float] | None = (-20.0, 2.0),
        squash: str | None = None,
        activation_fn: type[nn.Module] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        # Discrete observations are one-hot encoded, as SB3's MlpPolicy does (FrozenLake, Taxi, ...).
        self.one_hot_observations = isinstance(observation_space, spaces.Discrete)
        if not self.one_hot_observations and (not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 1):
            raise ValueError(f"policy MlpPolicy needs a flat Box or a Discrete observation space, got {observation_space}")
        self.gaussian, out_dim, self.action_head = action_head_for(action_space, squash, "MlpPolicy")
        self.activation_name, self.activation_fn, self._activation = resolve_activation(activation, activation_fn)
        n_inputs = int(observation_space.n) if self.one_hot_observations else int(observation_space.shape[0])
        if isinstance(net_arch, str | bytes) or not isinstance(net_arch, Sequence) or not all(
                isinstance(h, int | np.integer) and not isinstance(h, bool) and h > 0 for h in net_arch):
            raise ValueError(f"net_arch must be a list of hidden layer sizes (positive ints, e.g. [64, 64]), got {net_arch!r}")
        self.sizes = [n_inputs, *[int(h) for h in net_arch], out_dim]
        n_layers = len(self.sizes) - 1
        if isinstance(init_std, np.ndarray):
            init_std = init_std.tolist()
        if isinstance(init_std, str | bytes) or not (is_real(init_std) or isinstance(init_std, Sequence)):
            raise TypeError(f"init_std must be a number >= 0 or one per weight layer, got {init_std!r}")
        stds = ([check_real("init_std", init_std, 0)] * n_layers if not isinstance(init_std, Sequence)
                else [check_real(f"init_std[{k}]", s, 0) for k, s in enumerate(init_std)])
        if len(stds) == 2 and n_layers > 2:
            stds = [stds[0]] * (n_layers - 1) + [stds[1]]
        if len(stds) != n_layers:
            raise ValueError(f"init_std must give one value per weight layer ({n_layers}), got {init_std}")
        self.net_arch, self.init_std = list(net_arch), stds
        self.init_gains = None if init_gains is None else check_init_gains(init_gains, "(hidden, last)")
        self.init_seed, self.log_std_init = check_int("init_seed", init_seed, -(2**63)), check_real("log_std_init", log_std_init)
        self.log_std_bounds = check_log_std_bounds(log_std_bounds, self.log_std_init)
        self.squash = squash
        self.action_dim = out_dim
        super().__init__(observation_space, action_space, dtype)

    @property
    def n_params(self) -> int:
        d = sum(i * o + o for i, o in zip(self.sizes[:-1], self.sizes[1:]))
        return d + (self.action_dim if self.gaussian else 0)

    def initial_parameters(self, seed: int | None = None) -> torch.Tensor:
        """The initialization from ``seed`` (default ``init_seed``): ``[d]``."""
        streams = RandomStreams(derive_keys(self.init_seed if seed is None else seed, torch.arange(1)))
        layers = list(zip(self.sizes[:-1], self.sizes[1:]))
        z = None if self.init_gains is not None else streams.normal((self.n_params,), dtype=torch.float64)[0]
        pieces, offset = [], 0
        for k, (i, o) in enumerate(layers):
            if z is None:  # orthogonal, drawn as torch's [out, in] Linear weight and stored as θ's [in, out]
                gain = self.init_gains[1] if k == len(layers) - 1 else self.init_gains[0]
                pieces.append(orthogonal_matrix(o, i, gain, streams).T.reshape(-1))
            else:
                pieces.append(z[offset : offset + i * o] * self.init_std[k])
            pieces.append(torch.zeros(o, dtype=torch.float64))
            offset += i * o + o
        if self.gaussian:
            pieces.append(torch.full((self.action_dim,), self.log_std_init, dtype=torch.float64))
        return torch.cat(pieces).to(self.param_dtype)

    def sample_initializations(self, seeds: torch.Tensor) -> torch.Tensor:
        """Fresh initializations, one per seed: ``[len(seeds), d]`` (for from-scratch baselines)."""
        return torch.stack([self.initial_parameters(int(s)) for s in seeds])

    def _layers(self, theta: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        batch = theta.shape[:-1]
        layers, offset = [], 0
        for i, o in zip(self.sizes[:-1], self.sizes[1:]):
            w = theta[..., offset : offset + i * o].reshape(*batch, i, o)
            b = theta[..., offset + i * o : offset + i * o + o]
            layers.append((w, b))
            offset += i * o + o
        return layers

    def head(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Network output ``[*B, *M, out]`` (logits, or the Gaussian mean)."""
        batch = theta.shape[:-1]
        if self.one_hot_observations:  # obs [*B, *M] of integer states → [*B, *M, n]
            space = self.observation_space
            obs = torch.nn.functional.one_hot((obs.long() - int(space.start)).clamp(0, int(space.n) - 1), int(space.n))
        m_shape = obs.shape[len(batch) : -1]
        x = obs.to(theta.dtype).reshape(*batch, -1, obs.shape[-1])
        act = self._activation
        layers = self._layers(theta)
        for k, (w, b) in enumerate(layers):
            x = torch.matmul(x, w) + b.unsqueeze(-2)
            if k < len(layers) - 1:
                x = act(x)
        return x.reshape(*batch, *m_shape, x.shape[-1])

    # --- closed forms of the paper's softmax MLP ------------------------------------------------
    @property
    def is_softmax_mlp(self) -> bool:
        """Whether this is the paper's network: ``Discrete`` actions and one ``tanh`` hidden layer
        (then :meth:`score_gradient` and :meth:`hvp` are closed forms, :mod:`.kernels`)."""
        return not self.gaussian and not self.one_hot_observations and len(self.sizes) == 3 and self.activation_name == "tanh"

    @property
    def softmax_mlp(self) -> SoftmaxMlp:
        """This network as the closed forms of :mod:`.kernels` take it (its sizes and kernel choice).

        :raises ValueError: when it is not the paper's network (:attr:`is_softmax_mlp`)
        """
        if not self.is_softmax_mlp:
            raise ValueError("the closed-form MLP kernels need a discrete MlpPolicy with one tanh hidden layer")
        n_inputs, n_hidden, n_actions = self.sizes
        return SoftmaxMlp(n_inputs, n_hidden, n_actions)

    def score_gradient(self, theta: torch.Tensor, traj: Trajectories, weights: torch.Tensor) -> torch.Tensor:
        """:meth:`FlatPolicy.score_gradient`; hand-written backprop for the paper's softmax MLP."""
        if self.is_softmax_mlp:
            return mlp_policy_gradient(self.softmax_mlp, theta, traj, weights)
        return super().score_gradient(theta, traj, weights)

    def hvp(self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """:meth:`FlatPolicy.hvp`; hand-written forward-over-backward for the paper's softmax MLP."""
        if self.is_softmax_mlp:
            return mlp_hvp(self.softmax_mlp, theta, traj, v, weights)
        return super().hvp(theta, traj, v, weights)

    def curvature_hvp(
        self, theta: torch.Tensor, traj: Trajectories, v: torch.Tensor, weights: torch.Tensor, coupling: str
    ) -> torch.Tensor:
        """:meth:`FlatPolicy.curvature_hvp`; the closed form of :meth:`hvp` with another coupling for the paper's softmax MLP."""
        if self.is_softmax_mlp:
            return mlp_hvp(self.softmax_mlp, theta, traj, v, weights, coupling=coupling)
        return super().curvature_hvp(theta, traj, v, weights, coupling)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            net_arch=self.net_arch,
            activation=self.activation_name,
            init_std=self.init_std,
            init_seed=self.init_seed,
            log_std_init=self.log_std_init,
            log_std_bounds=self.log_std_bounds,
            squash=self.squash,
        )
        if self.init_gains is not None:  # only when set: files of the default policy stay loadable by earlier versions
            data.update(init_gains=self.init_gains)
        if self.activation_name is None:
            # An activation other than tanh/relu is saved as its class (SB3 saves activation_fn so too).
            data.update(activation=None, activation_fn=self.activation_fn)
        return data


class FastMlpPolicy(MlpPolicy):
    """:class:`MlpPolicy` whose sampling uses the fused kernels of :mod:`.kernels`.

    Same parameters, initialization, ``log_prob`` and save format; for the paper's softmax MLP
    (discrete actions, one tanh hidden layer) ``sample`` is :func:`~.kernels.mlp_sample` and
    rollouts through a family's kernels are :func:`~.kernels.mlp_rollout` (same random numbers,
    same rule, about 5× faster on CPU for large batches). Its draws agree with
    :meth:`MlpPolicy.sample` except where a uniform falls within rounding error of a CDF boundary,
    so runs with the two policies are not bitwise comparable.

    ``kernels="numba"`` (``pip install "fedrl[fast]"``) runs the rollouts through a family with a
    compiled transition (arc navigation) and the policy gradients as compiled loops on the CPU
    (:mod:`.compiled`: rollouts 3×, gradients 2.3× faster at the neural experiments' batches; the
    curvature products, :mod:`.compiled_hvp`, 1.7–2.3×; reproducible, not bitwise
    the torch kernels' numbers); ``"auto"`` is ``"numba"`` where Numba is installed. Elsewhere (CUDA,
    float64, other families, gradients through θ) the torch kernels run.

    :param args: as :class:`MlpPolicy`
    :param kernels: ``"torch"`` (default), ``"numba"`` or ``"auto"``
    :param kwargs: as :class:`MlpPolicy`
    """

    __module__ = _PUBLIC_MODULE

    def __init__(self, *args: Any, kernels: str = "torch", **kwargs: Any) -> None:
        self.kernels = check_policy_kernels(kernels)
        super().__init__(*args, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        if self.kernels != "torch":  # only when set: files of the default policy stay loadable by earlier versions
            data.update(kernels=self.kernels)
        return data

    @property
    def softmax_mlp(self) -> SoftmaxMlp:
        """:attr:`MlpPolicy.softmax_mlp` with this policy's ``kernels``."""
        return super().softmax_mlp._replace(kernels=self.kernels)

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        if not self.is_softmax_mlp:
            return super().sample(theta, obs, streams)
        return mlp_sample(self.softmax_mlp, theta, obs, streams)

    def kernel_rollout_plan(self, family: Any, params: Any) -> KernelRolloutPlan | None:
        """:func:`~.kernels.mlp_rollout` for the paper's network (not with early stopping)."""
        if not self.is_softmax_mlp:
            return None

        def plan(theta: torch.Tensor, streams: RandomStreams, n_trajectories: int, horizon: int, stop_when_done: bool) -> Trajectories | None:
            if stop_when_done:
                return None
            return mlp_rollout(family, params, self.softmax_mlp, theta, streams, n_trajectories, horizon)

        return plan


def is_softmax_mlp(policy: Any) -> bool:
    """Whether ``policy`` is an :class:`MlpPolicy` with the paper's softmax architecture."""
    return isinstance(policy, MlpPolicy) and policy.is_softmax_mlp
