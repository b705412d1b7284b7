"""SB3's Nature CNN over flat θ, for image observations (Atari ``(4, 84, 84)`` ``uint8`` frames).

Architecture (Mnih et al. 2015, as SB3's ``NatureCNN``): conv 32 filters 8×8 stride 4 → ReLU →
conv 64 4×4 stride 2 → ReLU → conv 64 3×3 stride 1 → ReLU → flatten → linear ``features_dim`` (512)
→ ReLU, then a linear action head: softmax logits (``Discrete``) or a Gaussian mean (``Box``, with the
state-independent ``log_std`` of :class:`~fedrl_algos.policies.heads.ActionHeadMixin`).

Layout of θ (``[*B, d]``, each row its own network):

* each conv layer: weight ``[out, in, kh, kw]`` (row-major, torch's ``conv2d`` layout) then bias ``[out]``;
* the linear layer and the head: weight ``[in, out]`` (row-major, as :class:`~fedrl_algos.policies.mlp.MlpPolicy`)
  then bias ``[out]``; the linear layer's input is the flattened ``[64, h, w]`` feature map (channel-major);
* Gaussian head: the ``action_dim`` log standard deviations last.

For ``(4, 84, 84)`` inputs and 6 actions ``d = 8,224 + 32,832 + 36,928 + 1,606,144 + 3,078 = 1,687,206``.

**Batched forward.** Every row of θ has its own weights. Two ways to run them, chosen by
``conv_batching``: ``"grouped"`` stacks the rows as the *groups* of one grouped convolution per layer
(input ``[N, B·C, H, W]``, weights ``[B·32, C, 8, 8]``, ``groups=B``); ``"rows"`` runs one ordinary
convolution per row over all of that row's frames. The linear layers are batched matmuls in both.
Measured on this 2-core CPU (float32, one thread, B = 10 rows × N = 200 frames of ``(4, 84, 84)``
``uint8``, best of 3): forward 1.36 s grouped, 1.02 s ``torch.func.vmap`` of the per-row network
(functorch lowers the batched weights to a grouped convolution too), 0.46 s rows; forward and backward
3.0 s, 2.5 s, 1.7 s. At N = 20 frames per row: forward 0.076 s grouped, 0.070 s vmap, 0.048 s rows.
oneDNN's grouped kernel handles many narrow groups poorly, so ``"auto"`` (the default) uses
``"rows"`` on CPU and the one-kernel ``"grouped"`` form elsewhere (CUDA: not measured here).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from fedrl_algos.policies.base import CategoricalMixin, FlatPolicy, check_init_gains, orthogonal_matrix
from fedrl_algos.policies.heads import ActionHeadMixin, action_head_for, check_log_std_bounds
from fedrl_envs.rng import RandomStreams, derive_keys
from fedrl_envs.validation import check_bool, check_int, check_real

__all__ = ["CONV_BATCHINGS", "CnnPolicy", "NATURE_CONVS", "orthogonal_matrix"]

#: Values of ``CnnPolicy``'s ``conv_batching``.
CONV_BATCHINGS = ("auto", "grouped", "rows")

#: The Nature CNN's convolutions: ``(out_channels, kernel, stride)``.
NATURE_CONVS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


class CnnPolicy(ActionHeadMixin, CategoricalMixin, FlatPolicy):
    """SB3's Nature CNN (image observations) with a softmax (``Discrete``) or Gaussian (``Box``) head.

    Observations are channel-first ``Box(C, H, W)`` images; ``uint8`` images are scaled by 1/255 as
    SB3 does for image spaces (``normalize_images``), float images are used as they are. The
    initialization is SB3's orthogonal one — gain √2 for the convolutions and the linear layer, 0.01
    for the action head (SB3's ``ActorCriticCnnPolicy``), biases zero — drawn from ``init_seed``
    through :class:`~fedrl_envs.rng.RandomStreams` (:func:`orthogonal_matrix`). Score gradients and
    Hessian-vector products are the autograd defaults of :class:`~fedrl_algos.policies.base.FlatPolicy`.

    :param observation_space: ``Box`` of shape ``(C, H, W)`` with ``H, W >= 36`` (``uint8``, e.g. Atari's
        ``(4, 84, 84)`` stacked frames, or float)
    :param action_space: ``Discrete(A)`` or a flat ``Box``
    :param features_dim: width of the linear layer after the convolutions (SB3's ``features_dim``)
    :param normalize_images: divide ``uint8`` observations by 255 (SB3's ``normalize_images``)
    :param init_seed: seed of the initialization
    :param init_gains: orthogonal-initialization gains ``(features, head)``
    :param log_std_init: initial log standard deviation (Gaussian head only)
    :param log_std_bounds: ``(low, high)`` clamp of the log standard deviation, or ``None``
    :param squash: ``None`` or ``"tanh"`` (Gaussian head squashed into the ``Box``'s finite bounds)
    :param conv_batching: how the rows of θ go through the convolutions: ``"grouped"`` (one grouped
        convolution for all rows), ``"rows"`` (one convolution per row over all its frames) or
        ``"auto"`` (``"rows"`` on CPU, where it is faster, ``"grouped"`` on other devices); the
        results agree to rounding
    :param dtype: parameter dtype
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        features_dim: int = 512,
        normalize_images: bool = True,
        init_seed: int = 0,
        init_gains: tuple[float, float] = (math.sqrt(2.0), 0.01),
        log_std_init: float = 0.0,
        log_std_bounds: tuple[float, float] | None = (-20.0, 2.0),
        squash: str | None = None,
        conv_batching: str = "auto",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if conv_batching not in CONV_BATCHINGS:
            raise ValueError(f"conv_batching must be one of {CONV_BATCHINGS}, got {conv_batching!r}")
        self.conv_batching = conv_batching
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 3:
            raise ValueError(
                f"policy CnnPolicy needs an image observation_space, a Box of shape (C, H, W), got {observation_space} "
                "(flat Box observations: use MlpPolicy)"
            )
        c, h, w = (int(x) for x in observation_space.shape)
        if w < c and w <= 4:
            raise ValueError(
                f"policy CnnPolicy needs a channel-first observation_space (C, H, W); {observation_space.shape} looks channel-last "
                "(transpose it, e.g. gymnasium.wrappers.TransposeObservation or SB3's VecTransposeImage)"
            )
        sizes = [(h, w)]
        for _, kernel, stride in NATURE_CONVS:
            sizes.append((_conv_out(sizes[-1][0], kernel, stride), _conv_out(sizes[-1][1], kernel, stride)))
        if min(sizes[-1]) < 1:
            raise ValueError(f"policy CnnPolicy needs observation_space images of at least 36×36 (the Nature CNN's receptive field), got {observation_space.shape}")
        self.gaussian, out_dim, self.action_head = action_head_for(action_space, squash, "CnnPolicy")
        if isinstance(features_dim, bool) or not isinstance(features_dim, int | np.integer) or features_dim < 1:
            raise ValueError(f"features_dim must be a positive int, got {features_dim!r}")
        self.features_dim = int(features_dim)
        self.init_seed, self.init_gains = check_int("init_seed", init_seed, -(2**63)), check_init_gains(init_gains, "(features, head)")
        self.log_std_init = check_real("log_std_init", log_std_init)
        self.log_std_bounds = check_log_std_bounds(log_std_bounds, self.log_std_init)
        self.squash, self.action_dim = squash, out_dim
        self._obs_scale = 255.0 if normalize_images and observation_space.dtype == np.uint8 else None
        # (shape of the weight in θ, bias size) per layer, in θ order.
        in_channels, self._convs = c, []
        for out_channels, kernel, stride in NATURE_CONVS:
            self._convs.append(((out_channels, in_channels, kernel, kernel), stride))
            in_channels = out_channels
        self.n_flatten = in_channels * sizes[-1][0] * sizes[-1][1]
        self._linears = [(self.n_flatten, self.features_dim), (self.features_dim, out_dim)]
        super().__init__(observation_space, action_space, dtype)
        # After SB3's BaseModel.__init__, which sets its own default (True).
        self.normalize_images = check_bool("normalize_images", normalize_images)

    @property
    def n_params(self) -> int:
        d = sum(math.prod(shape) + shape[0] for shape, _ in self._convs)
        d += sum(i * o + o for i, o in self._linears)
        return d + (self.action_dim if self.gaussian else 0)

    def initial_parameters(self, seed: int | None = None) -> torch.Tensor:
        """The orthogonal initialization from ``seed`` (default ``init_seed``): ``[d]``."""
        streams = RandomStreams(derive_keys(self.init_seed if seed is None else seed, torch.arange(1)))
        feature_gain, head_gain = self.init_gains
        pieces = []
        for shape, _ in self._convs:
            # torch's orthogonal_ on a conv weight orthogonalizes its [out, in·kh·kw] flattening.
            pieces += [orthogonal_matrix(shape[0], math.prod(shape[1:]), feature_gain, streams).reshape(-1), torch.zeros(shape[0], dtype=torch.float64)]
        for k, (i, o) in enumerate(self._linears):
            gain = feature_gain if k == 0 else head_gain
            # Drawn as torch's [out, in] Linear weight, stored transposed as the [in, out] of θ.
            pieces += [orthogonal_matrix(o, i, gain, streams).T.reshape(-1), torch.zeros(o, dtype=torch.float64)]
        if self.gaussian:
            pieces.append(torch.full((self.action_dim,), self.log_std_init, dtype=torch.float64))
        return torch.cat(pieces).to(self.param_dtype)

    def _unflatten(self, theta: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
        """θ ``[n, d]`` → conv ``(weight [n, out, in, k, k], bias [n, out])`` and linear ``(W [n, in, out], b [n, 1, out])``."""
        n, offset = theta.shape[0], 0
        convs, linears = [], []
        for shape, _ in self._convs:
            size = math.prod(shape)
            convs.append((theta[:, offset : offset + size].reshape(n, *shape), theta[:, offset + size : offset + size + shape[0]]))
            offset += size + shape[0]
        for i, o in self._linears:
            w = theta[:, offset : offset + i * o].reshape(n, i, o)
            b = theta[:, offset + i * o : offset + i * o + o].reshape(n, 1, o)
            linears.append((w, b))
            offset += i * o + o
        return convs, linears

    def _preprocess(self, obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x = obs.to(dtype)
        # Dividing uint8 pixels by 255 is SB3's preprocessing of image spaces; float images pass unchanged.
        return x if self._obs_scale is None else x / self._obs_scale

    def _conv_features(self, convs: list[tuple[torch.Tensor, torch.Tensor]], obs: torch.Tensor) -> torch.Tensor:
        """Raw images ``[n, N, C, H, W]`` through each row's convolutions → flattened ``[n, N, n_flatten]``."""
        n_rows, n_frames = obs.shape[:2]
        dtype = convs[0][0].dtype
        grouped = self.conv_batching == "grouped" or (self.conv_batching == "auto" and convs[0][0].device.type != "cpu")
        if not grouped:
            # One ordinary conv2d per row of θ, each over all of that row's frames: on CPU this is
            # about 3x faster than the grouped convolution (module docstring). A loop over rows, but
            # each step is a whole batched convolution, so the loop costs nothing measurable.
            # Each row converts only its own frames (a float copy of all rows' uint8 frames is itself
            # a large share of the time).
            rows = []
            for i in range(n_rows):
                h = self._preprocess(obs[i], dtype)
                for (w, b), (_, stride) in zip(convs, self._convs):
                    h = F.relu(F.conv2d(h, w[i], b[i], stride=stride))
                rows.append(h.reshape(n_frames, self.n_flatten))
            return torch.stack(rows)
        # Rows of θ become the groups of one grouped convolution: [frames, rows·C, H, W].
        h = self._preprocess(obs, dtype).transpose(0, 1).reshape(n_frames, n_rows * obs.shape[2], *obs.shape[3:])
        for (w, b), (_, stride) in zip(convs, self._convs):
            h = F.relu(F.conv2d(h, w.reshape(-1, *w.shape[2:]), b.reshape(-1), stride=stride, groups=n_rows))
        # [frames, rows·64, h, w] → [rows, frames, 64·h·w] (channel-major flattening, as nn.Flatten).
        return h.reshape(n_frames, n_rows, self.n_flatten).transpose(0, 1)

    def features(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The CNN's features (after the linear layer and its ReLU): ``[*B, *M, features_dim]``."""
        return self._forward(theta, obs, with_head=False)

    def head(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Network output ``[*B, *M, out]`` (logits, or the Gaussian mean) for ``obs [*B, *M, C, H, W]``."""
        return self._forward(theta, obs, with_head=True)

    def _forward(self, theta: torch.Tensor, obs: torch.Tensor, with_head: bool) -> torch.Tensor:
        batch = theta.shape[:-1]
        image = tuple(self.observation_space.shape)
        if obs.dim() < len(batch) + 3 or tuple(obs.shape[obs.dim() - 3 :]) != image or tuple(obs.shape[: len(batch)]) != tuple(batch):
            raise ValueError(f"obs must have shape [*B, *M, {', '.join(map(str, image))}] with B = {tuple(batch)} (θ's batch axes), got {tuple(obs.shape)}")
        m_shape = obs.shape[len(batch) : -3]
        n_rows, n_frames = math.prod(batch), math.prod(m_shape)
        convs, linears = self._unflatten(theta.reshape(n_rows, theta.shape[-1]))
        x = self._conv_features(convs, obs.reshape(n_rows, n_frames, *image))
        (w, b), (w_head, b_head) = linears
        x = F.relu(torch.baddbmm(b, x, w))
        if with_head:
            x = torch.baddbmm(b_head, x, w_head)
        return x.reshape(*batch, *m_shape, x.shape[-1])

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            features_dim=self.features_dim,
            normalize_images=self.normalize_images,
            init_seed=self.init_seed,
            init_gains=self.init_gains,
            log_std_init=self.log_std_init,
            log_std_bounds=self.log_std_bounds,
            squash=self.squash,
            conv_batching=self.conv_batching,
        )
        return data
