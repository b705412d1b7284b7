"""CnnPolicy (SB3's Nature CNN over flat θ).

* the forward equals an ``nn.Sequential`` Nature CNN loaded with one row's weights (θ layout,
  flattening order, uint8 scaling), and batched θ equals a loop over rows in both ``conv_batching`` forms;
* ``∇_θ log π`` (categorical and Gaussian heads) against central finite differences (float64);
* the autograd ``score_gradient``/``hvp`` defaults against finite differences of the score;
* sampling reproducible and independent of the other rows; deterministic orthogonal initialization;
* constructor errors naming the argument; save/load.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_policies_gaussian import directional_differences, gradient_along
from torch import nn

from fedrl_algos.core.estimators import masked_log_prob
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies import CnnPolicy
from fedrl_envs import RandomStreams, derive_keys

# 40×44 gives a 1×2 final feature map, so the flattening order (channel-major) is tested too.
IMAGES = gym.spaces.Box(0, 255, (2, 40, 44), np.uint8)
FLOAT_IMAGES = gym.spaces.Box(0.0, 1.0, (2, 40, 44), np.float32)


def _policy(action_space=None, **kwargs) -> CnnPolicy:
    kwargs.setdefault("features_dim", 8)
    kwargs.setdefault("dtype", torch.float64)
    return CnnPolicy(kwargs.pop("observation_space", IMAGES), action_space or gym.spaces.Discrete(3), **kwargs)


def _theta(policy: CnnPolicy, rows: int, seed: int = 0) -> torch.Tensor:
    """Rows near the initialization, each different (biases non-zero, so they are tested too)."""
    gen = torch.Generator().manual_seed(seed)
    base = policy.initial_parameters()
    return base + 0.05 * torch.randn(rows, policy.n_params, dtype=base.dtype, generator=gen)


def _frames(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (*shape, *IMAGES.shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _reference_network(policy: CnnPolicy, theta: torch.Tensor) -> nn.Sequential:
    """The Nature CNN as torch modules, weights read from one row of θ by the documented layout."""
    c = IMAGES.shape[0]
    layers, offset = [], 0
    for in_ch, out_ch, k, s in ((c, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1)):
        conv = nn.Conv2d(in_ch, out_ch, k, s).double()
        n = out_ch * in_ch * k * k
        conv.weight.data = theta[offset : offset + n].reshape(out_ch, in_ch, k, k).clone()
        conv.bias.data = theta[offset + n : offset + n + out_ch].clone()
        offset += n + out_ch
        layers += [conv, nn.ReLU()]
    layers.append(nn.Flatten())
    for k, (i, o) in enumerate(((policy.n_flatten, policy.features_dim), (policy.features_dim, policy.action_dim))):
        linear = nn.Linear(i, o).double()
        linear.weight.data = theta[offset : offset + i * o].reshape(i, o).T.clone()  # θ stores [in, out]
        linear.bias.data = theta[offset + i * o : offset + i * o + o].clone()
        offset += i * o + o
        layers += [linear] + ([nn.ReLU()] if k == 0 else [])
    assert offset == policy.n_params - (policy.action_dim if policy.gaussian else 0)
    return nn.Sequential(*layers)


def test_forward_is_the_nature_cnn():
    policy = _policy()
    assert policy.n_flatten == 64 * 1 * 2
    theta = _theta(policy, 1)[0]
    frames = _frames(5)
    expected = _reference_network(policy, theta)(frames.double() / 255.0)
    torch.testing.assert_close(policy.logits(theta, frames), expected, rtol=1e-12, atol=1e-12)
    # Float images are used as they are: the same network on frames already in [0, 1].
    floats = _policy(observation_space=FLOAT_IMAGES)
    torch.testing.assert_close(floats.logits(theta, frames.double() / 255.0), expected, rtol=1e-12, atol=1e-12)
    # normalize_images=False feeds raw pixel values, as SB3's option does.
    raw = _policy(normalize_images=False)
    torch.testing.assert_close(raw.logits(theta, frames), _reference_network(policy, theta)(frames.double()), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("conv_batching", ["grouped", "rows", "auto"])
def test_batched_theta_equals_a_loop_over_rows(conv_batching):
    policy = _policy(conv_batching=conv_batching)
    theta = _theta(policy, 6).reshape(2, 3, -1)  # two batch axes (run, agent)
    frames = _frames(2, 3, 4, 5)  # and two trajectory axes (trajectory, time)
    logits = policy.logits(theta, frames)
    assert logits.shape == (2, 3, 4, 5, 3)
    for r in range(2):
        for a in range(3):
            torch.testing.assert_close(logits[r, a], policy.logits(theta[r, a], frames[r, a]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits, _policy(conv_batching="grouped" if conv_batching == "rows" else "rows").logits(theta, frames), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.Box(-2.0, 2.0, (2,))])
def test_log_prob_gradient_matches_finite_differences(action_space):
    squash = "tanh" if isinstance(action_space, gym.spaces.Box) and action_space.high[0] == 2.0 else None
    policy = _policy(action_space, squash=squash, init_gains=(math.sqrt(2.0), 1.0))
    theta = _theta(policy, 2)
    frames = _frames(2, 3, seed=1)
    actions = policy.sample(theta, frames, RandomStreams(derive_keys(2, torch.arange(2))))

    def total(th: torch.Tensor) -> torch.Tensor:
        return policy.log_prob(th, frames, actions).sum()

    gen = torch.Generator().manual_seed(3)
    directions = torch.randn(4, *theta.shape, dtype=torch.float64, generator=gen)
    # Unit directions and a small step: a larger move crosses ReLU kinks, where differences are not derivatives.
    directions = directions / directions.flatten(1).norm(dim=1).reshape(-1, 1, 1)
    # Single coordinates too: a first-layer weight, the head bias, and (Gaussian) a log σ.
    for index in (5, policy.n_params - policy.action_dim - (policy.action_dim if policy.gaussian else 0), policy.n_params - 1):
        e = torch.zeros(1, *theta.shape, dtype=torch.float64)
        e[0, 1, index] = 1.0
        directions = torch.cat([directions, e])
    fd = directional_differences(total, theta, directions, step=1e-6)
    ad = gradient_along(total, theta, directions)
    torch.testing.assert_close(ad, fd, rtol=1e-5, atol=1e-7)
    assert (ad.abs() > 1e-4).all()


@pytest.mark.parametrize("conv_batching", ["grouped", "rows"])
def test_autograd_score_gradient_and_hvp_run_on_the_cnn(conv_batching):
    """``hvp`` = ``(1/m) Σ_ξ [∇ν(ξ) (∇log q(ξ)·v) + ∇²ν(ξ) v]``: the directional derivative of log q
    and the Hessian term by central differences of log q and of the autograd gradient of ν."""
    policy = _policy(init_gains=(math.sqrt(2.0), 1.0), conv_batching=conv_batching)  # forward-mode AD through both
    rows, m, horizon = 2, 2, 3
    theta = _theta(policy, rows, seed=4)
    obs = _frames(rows, m, horizon, seed=5)
    actions = policy.sample(theta, obs, RandomStreams(derive_keys(6, torch.arange(rows))))
    mask = torch.ones(rows, m, horizon, dtype=torch.float64)
    mask[1, 0, 1:] = 0
    traj = Trajectories(obs, actions, torch.zeros_like(mask), mask)
    psi = torch.randn(rows, m, horizon, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * mask
    # Seeded: the global generator's state depends on which tests ran before, and some directions
    # make the central differences below cross a ReLU kink.
    v = torch.randn(theta.shape, dtype=theta.dtype, generator=torch.Generator().manual_seed(8)) * 0.1

    def grad_of(fn, th: torch.Tensor) -> torch.Tensor:
        th = th.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(th).sum(), th)
        return g

    def nu(th: torch.Tensor) -> torch.Tensor:  # [rows, m]
        return (masked_log_prob(policy, th, traj) * psi).sum(-1)

    grad = policy.score_gradient(theta, traj, psi)
    torch.testing.assert_close(grad, grad_of(nu, theta) / m, rtol=1e-12, atol=1e-12)
    h = 1e-6 / float(v.norm())  # a small move: larger ones cross ReLU kinks
    log_q = lambda th: masked_log_prob(policy, th, traj).sum(-1)  # noqa: E731
    directional = (log_q(theta + h * v) - log_q(theta - h * v)) / (2 * h)  # [rows, m]
    first = grad_of(lambda th: nu(th) * directional, theta)
    second = (grad_of(nu, theta + h * v) - grad_of(nu, theta - h * v)) / (2 * h)
    expected = (first + second) / m
    torch.testing.assert_close(policy.hvp(theta, traj, v, psi), expected, rtol=1e-5, atol=1e-8)
    assert second.abs().max() > 1e-3


def test_sampling_is_reproducible_and_independent_of_the_other_rows():
    for policy in (_policy(), _policy(gym.spaces.Box(-1.0, 1.0, (2,)), squash="tanh")):
        theta = _theta(policy, 3)
        frames = _frames(3, 50)
        keys = derive_keys(8, torch.arange(3))
        first = policy.sample(theta, frames, RandomStreams(keys))
        assert torch.equal(first, policy.sample(theta, frames, RandomStreams(keys)))
        alone = policy.sample(theta[1:2], frames[1:2], RandomStreams(keys[1:2]))
        torch.testing.assert_close(alone[0], first[1], rtol=0, atol=1e-12)
        other = theta.clone()
        other[0] += 0.3
        torch.testing.assert_close(policy.sample(other, _frames(3, 50, seed=9).index_copy(0, torch.tensor([1]), frames[1:2]), RandomStreams(keys))[1], first[1], rtol=0, atol=1e-12)
        assert not torch.equal(first[0], first[2])


def test_mode_and_predict():
    policy = _policy()
    theta = policy.theta.detach()
    frames = _frames(4)
    assert torch.equal(policy.mode(theta, frames), policy.logits(theta, frames).argmax(-1))
    action, _ = policy.predict(frames[0].numpy(), deterministic=True)
    assert int(action) == int(policy.mode(theta, frames[:1])[0])
    box = _policy(gym.spaces.Box(-1.0, 1.0, (2,)), squash="tanh")
    action, _ = box.predict(frames[0].numpy())
    assert action.shape == (2,) and np.all(np.abs(action) < 1)


def test_orthogonal_initialization_is_deterministic():
    policy = _policy()
    theta = policy.initial_parameters()
    assert torch.equal(theta, _policy().initial_parameters())
    assert not torch.equal(theta, policy.initial_parameters(seed=1))
    gain = math.sqrt(2.0)
    w1 = theta[: 32 * 2 * 64].reshape(32, 2 * 64)  # [out, in·k·k]: 32 orthonormal rows
    torch.testing.assert_close(w1 @ w1.T, gain**2 * torch.eye(32, dtype=torch.float64))
    offset = policy.n_params - (8 * 3 + 3) - (policy.n_flatten * 8 + 8)
    w = theta[offset : offset + policy.n_flatten * 8].reshape(policy.n_flatten, 8)  # θ's [in, out]
    torch.testing.assert_close(w.T @ w, gain**2 * torch.eye(8, dtype=torch.float64))
    head = theta[-27:-3].reshape(8, 3)
    torch.testing.assert_close(head.T @ head, 0.01**2 * torch.eye(3, dtype=torch.float64))
    assert not theta[-3:].any()  # biases start at zero


def test_atari_size():
    """The θ size of the module docstring: Atari frames (4, 84, 84), 6 actions."""
    atari = CnnPolicy(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
    assert atari.n_params == 8_224 + 32_832 + 36_928 + 1_606_144 + 3_078 == 1_687_206
    assert atari.theta.dtype == torch.float32


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="observation_space"):
        CnnPolicy(gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="observation_space"):
        CnnPolicy(gym.spaces.Discrete(5), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="observation_space"):
        CnnPolicy(gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="channel-first observation_space"):
        CnnPolicy(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="observation_space.*36"):
        CnnPolicy(gym.spaces.Box(0, 255, (4, 35, 84), np.uint8), gym.spaces.Discrete(2))
    CnnPolicy(gym.spaces.Box(0, 255, (4, 36, 36), np.uint8), gym.spaces.Discrete(2), features_dim=4)  # the smallest
    with pytest.raises(ValueError, match="features_dim"):
        _policy(features_dim=0)
    with pytest.raises(ValueError, match="conv_batching"):
        _policy(conv_batching="vmap")
    with pytest.raises(ValueError, match="squash"):
        _policy(squash="tanh")
    with pytest.raises(ValueError, match="squash"):
        _policy(gym.spaces.Box(-np.inf, np.inf, (2,)), squash="tanh")
    with pytest.raises(ValueError, match="init_gains"):
        _policy(init_gains=(1.0, -1.0))
    with pytest.raises(ValueError, match="action space"):
        _policy(gym.spaces.MultiDiscrete([2, 2]))
    with pytest.raises(ValueError, match="obs must have shape"):
        policy = _policy()
        policy.logits(_theta(policy, 2), _frames(3, 4))


def test_save_and_load(tmp_path):
    policy = _policy(gym.spaces.Box(-1.0, 1.0, (2,)), squash="tanh", features_dim=6, normalize_images=False, conv_batching="rows")
    policy.theta.data += 0.01
    policy.save(tmp_path / "cnn.pt")
    loaded = CnnPolicy.load(tmp_path / "cnn.pt")
    assert (loaded.features_dim, loaded.normalize_images, loaded.squash, loaded.conv_batching) == (6, False, "tanh", "rows")
    assert torch.equal(loaded.theta, policy.theta)
