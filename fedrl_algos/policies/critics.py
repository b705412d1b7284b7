"""The value networks of ``baseline="critic"`` for an observation space: SB3's Nature CNN for images
(:class:`CnnCritic`, the trunk of :class:`~fedrl_algos.policies.cnn.CnnPolicy`) and the MLP of
:mod:`fedrl_algos.core.critic` otherwise (:func:`critic_for_space`).

They live with the policies, not in :mod:`fedrl_algos.core.critic`, because the CNN reuses a
policy's network: core stays a leaf (the federated rules, GAE and the fit there work on any
:class:`~fedrl_algos.core.critic.FlatCritic`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from gymnasium import spaces as gym_spaces
from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first

from fedrl_algos.core.critic import FlatCritic, MlpCritic
from fedrl_algos.policies.cnn import CnnPolicy

__all__ = ["CnnCritic", "critic_for_space"]


class CnnCritic(FlatCritic):
    """SB3's Nature CNN value network of every agent for image observations, φ flat ``[*B, d_φ]``.

    Architecture (SB3's ``NatureCNN`` then a linear value head): conv 32 8×8 stride 4 → ReLU → conv 64
    4×4 stride 2 → ReLU → conv 64 3×3 stride 1 → ReLU → flatten → linear ``features_dim`` (512) →
    ReLU → linear 1. ``uint8`` pixels are scaled by 1/255 (SB3's ``normalize_images``);
    channel-last observations ``(H, W, C)`` are transposed to channel-first, the layout of fedrl's
    Atari wrappers (``(4, 84, 84)``). The trunk is :class:`~fedrl_algos.policies.cnn.CnnPolicy`'s
    (a one-logit CnnPolicy: its layer definitions, θ layout, forward and orthogonal
    initialisation, gain √2), so φ's layout is a CnnPolicy θ for one action: convolutions, the
    linear layer ``[n_flatten, features_dim]`` + bias, the output layer ``[features_dim]`` + bias
    (the last ``features_dim + 1`` entries, which PopArt rescales). The output layer starts at zero
    (V = μ), as :class:`MlpCritic`'s. For ``(4, 84, 84)`` frames ``d_φ = 1,684,641``.

    **Batching over the rows of φ** (``conv_batching``, as CnnPolicy's): ``"rows"`` runs one
    ordinary convolution per row of φ over all of that row's frames (a loop over the rows, each
    step one whole batched convolution), ``"grouped"`` stacks the rows as the groups of one grouped
    convolution per layer (no loop); the linear layer is a batched matmul and the output layer an
    elementwise product and sum in both. Measured on this shared 2-core CPU (float32, one thread,
    ``(4, 84, 84)`` ``uint8`` frames, 8 episodes × 250 steps = 2,000 frames per row, best of 2;
    ``docs/algorithms/baselines.md``): forward for 2 / 4 rows 2.7 / 6.0 s ``"rows"``, 4.2 / 7.3 s
    grouped, 4.7 / 9.8 s ``torch.func.vmap`` of the per-row network (functorch lowers it to a
    grouped convolution too); forward and backward 8.0 / 17.4 s, 9.8 / 15.6 s, 9.9 / 21.8 s.
    ``"rows"`` is the fastest forward and level with the grouped form in the fit (within the
    machine's noise); it is also the only one whose result for a row does not depend on
    how many rows the batch holds (a one-agent Flower client computes what the whole federation
    does, bitwise), so ``"auto"`` (the default) takes ``"rows"`` on CPU and the one-kernel
    ``"grouped"`` elsewhere.

    :param observation_space: an image ``Box`` (``uint8``, 3-D; SB3's ``is_image_space``) of at
        least 36×36 pixels
    :param features_dim: width of the linear layer after the convolutions (SB3's 512)
    :param conv_batching: ``"auto"``, ``"rows"`` or ``"grouped"`` (above)
    """

    def __init__(self, observation_space: gym_spaces.Space, features_dim: int = 512, conv_batching: str = "auto") -> None:
        if not isinstance(observation_space, gym_spaces.Box) or not is_image_space(observation_space, check_channels=False):
            raise ValueError(f"CnnCritic needs an image observation space (a 3-D uint8 Box, SB3's is_image_space), got {observation_space}")
        shape = tuple(int(x) for x in observation_space.shape)
        self.observation_space = observation_space
        self.channels_last = not is_image_space_channels_first(observation_space)
        chw = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        # the trunk: a one-logit CnnPolicy (float64, so that initial_phi is exact in any dtype)
        self.trunk = CnnPolicy(gym_spaces.Box(0, 255, chw, observation_space.dtype), gym_spaces.Discrete(1), features_dim=features_dim,
                               conv_batching=conv_batching, dtype=torch.float64)
        self.features_dim, self.conv_batching = self.trunk.features_dim, conv_batching
        self.image_shape = shape
        self.n_params = self.trunk.n_params
        self.head_inputs = self.features_dim

    def initial_phi(self, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """φ ``[d_φ]``: CnnPolicy's orthogonal initialisation from ``seed`` (gain √2, biases zero)
        with a zero output layer (V = μ at the start)."""
        phi = self.trunk.initial_parameters(int(seed) % (2**63)).to(torch.float64).clone()
        phi[-self.head_inputs - 1:] = 0.0
        return phi.to(dtype)

    def network(self, phi: torch.Tensor, obs: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``f_φ(s)`` of every step: ``[*B, m, T]`` from ``obs [*B, m, T, *image]`` (``batch_dims`` =
        3 + len(B)); every row of φ on its own frames (``conv_batching``, class docstring)."""
        batch = phi.shape[:-1]
        lead = obs.shape[:batch_dims]
        if tuple(obs.shape[batch_dims:]) != self.image_shape or tuple(lead[:len(batch)]) != tuple(batch):
            raise ValueError(f"obs must have shape [*B, m, T, {', '.join(map(str, self.image_shape))}] with B = {tuple(batch)} "
                             f"(φ's batch axes), got {tuple(obs.shape)}")
        n_rows = math.prod(batch)
        x = obs.reshape(n_rows, -1, *self.image_shape)  # [rows, frames, *image]
        if self.channels_last:
            x = x.permute(0, 1, 4, 2, 3)
        convs, linears = self.trunk._unflatten(phi.reshape(n_rows, phi.shape[-1]))
        h = self.trunk._conv_features(convs, x)  # [rows, frames, n_flatten]
        (w, b), (w_out, b_out) = linears
        h = torch.relu(torch.baddbmm(b, h, w))  # [rows, frames, features_dim]
        # the output layer: an elementwise product and sum (a row's V does not depend on how many rows there are)
        v = (h * w_out.transpose(-1, -2)).sum(-1) + b_out[..., 0]
        return v.reshape(lead)


def critic_for_space(space: gym_spaces.Space, net_arch: Sequence[int] | None = None, activation: str = "tanh",
                     time_horizon: int | None = None) -> MlpCritic | CnnCritic:
    """The value network of ``baseline="critic"`` for observations of ``space``.

    * An image space (a 3-D ``uint8`` ``Box``, SB3's ``is_image_space``): :class:`CnnCritic`, SB3's
      Nature CNN; ``net_arch`` is then the width of the linear layer after the convolutions, a
      one-element list (default ``None``: ``[512]``, SB3's ``features_dim``); the Nature CNN's
      activations are ReLU, whatever ``activation`` says.
    * Otherwise :class:`MlpCritic` with hidden layers ``net_arch`` (default ``None``: ``[64, 64]``):
      one-hot inputs for a ``Discrete`` space (a table with ``net_arch=[]``), the flattened
      observation otherwise; with ``time_horizon`` (``T = H + 1``, the steps of the longest episode)
      the step's fraction of the horizon ``h/T`` is one more input (:class:`~fedrl_algos.core.critic.MlpCritic`).
    """
    if isinstance(space, gym_spaces.Box) and is_image_space(space, check_channels=False):
        if time_horizon is not None:
            raise ValueError("critic_time_aware=True needs a flat (MLP) critic; image observations get the Nature-CNN critic, "
                             "which takes no time input")
        if net_arch is None:
            return CnnCritic(space)
        if isinstance(net_arch, str | bytes) or not isinstance(net_arch, Sequence) or len(net_arch) != 1 or isinstance(net_arch[0], bool) \
                or not isinstance(net_arch[0], int) or net_arch[0] < 1:
            raise ValueError("critic_net_arch of image observations is the width of the linear layer after the Nature CNN's "
                             f"convolutions, a one-element list such as [512], got {net_arch!r}")
        return CnnCritic(space, int(net_arch[0]))
    discrete = isinstance(space, gym_spaces.Discrete)
    n_inputs = int(space.n) if discrete else int(math.prod(space.shape))
    return MlpCritic(n_inputs, (64, 64) if net_arch is None else net_arch, activation, discrete, time_horizon)
