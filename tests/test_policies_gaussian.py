"""MlpPolicy's Gaussian heads: plain and tanh-squashed (``squash="tanh"``), and SB3's ``activation_fn``.

* ``∇_θ log π`` of both Gaussians against central finite differences (float64);
* the squashed log-density against an independent change of variables (torch.distributions'
  ``TransformedDistribution`` with ``TanhTransform`` and ``AffineTransform``), and the round trip
  ``log_prob(sample)`` against the density of the pre-squash draw ``u``;
* squashed samples inside the bounds (and, for moderate σ in float64, on neither bound);
* sampling reproducible from the same streams and independent of the other rows of the batch;
* the autograd ``score_gradient``/``hvp`` defaults on the squashed policy against explicit formulas;
* constructor errors naming the argument; the unsquashed Gaussian unchanged.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

from fedrl_algos.core.estimators import masked_log_prob
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies import MlpPolicy
from fedrl_algos.policies.heads import log1m_tanh_squared
from fedrl_envs import RandomStreams, derive_keys

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
# Asymmetric, non-unit bounds so that both the centre and the half-width of the affine map matter.
ACTIONS = gym.spaces.Box(np.array([-2.0, 0.0]), np.array([1.0, 0.5]), dtype=np.float64)


def _policy(squash: str | None = "tanh", **kwargs) -> MlpPolicy:
    kwargs.setdefault("net_arch", [5])
    kwargs.setdefault("init_std", 0.4)
    return MlpPolicy(OBS, ACTIONS, squash=squash, dtype=torch.float64, **kwargs)


def _theta(policy: MlpPolicy, rows: int, seed: int = 0, log_std: float = -0.3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    theta = 0.5 * torch.randn(rows, policy.n_params, dtype=torch.float64, generator=gen)
    theta[:, -policy.action_dim :] = log_std
    return theta


def directional_differences(fn, theta: torch.Tensor, directions: torch.Tensor, step: float = 1e-6) -> torch.Tensor:
    """Central differences ``(fn(θ + h v) − fn(θ − h v)) / 2h`` along each direction ``v``: ``[k, *out]``.

    :param fn: a function of θ ``[*B, d]``
    :param theta: the point ``[*B, d]``
    :param directions: ``[k, *B, d]``
    """
    return torch.stack([(fn(theta + step * v) - fn(theta - step * v)) / (2 * step) for v in directions])


def gradient_along(fn, theta: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """``∇fn(θ)·v`` by autograd for each direction (``fn`` summed to a scalar first): ``[k]``."""
    th = theta.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(th).sum(), th)
    return (directions * grad).flatten(1).sum(-1)


def _directions(theta: torch.Tensor, policy, k: int = 4, seed: int = 1) -> torch.Tensor:
    """Random directions plus the log-σ coordinates (the part of θ the mean does not touch)."""
    gen = torch.Generator().manual_seed(seed)
    random = torch.randn(k, *theta.shape, dtype=torch.float64, generator=gen)
    log_std = torch.zeros(policy.action_dim, *theta.shape, dtype=torch.float64)
    for j in range(policy.action_dim):
        log_std[j, ..., theta.shape[-1] - policy.action_dim + j] = 1.0
    return torch.cat([random, log_std])


@pytest.mark.parametrize("squash", [None, "tanh"])
def test_log_prob_gradient_matches_finite_differences(squash):
    policy = _policy(squash)
    theta = _theta(policy, 3)
    obs = torch.rand(3, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 2 - 1
    actions = policy.sample(theta, obs, RandomStreams(derive_keys(5, torch.arange(3))))

    def total(th: torch.Tensor) -> torch.Tensor:
        return policy.log_prob(th, obs, actions).sum()

    directions = _directions(theta, policy)
    fd = directional_differences(total, theta, directions)
    ad = gradient_along(total, theta, directions)
    torch.testing.assert_close(ad, fd, rtol=1e-6, atol=1e-7)
    assert (ad.abs() > 1e-3).all()  # every direction is tested on a non-trivial derivative


def test_squashed_log_prob_equals_an_independent_change_of_variables():
    policy = _policy()
    theta = _theta(policy, 2)
    obs = torch.rand(2, 50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2 - 1
    actions = policy.sample(theta, obs, RandomStreams(derive_keys(9, torch.arange(2))))
    mean = policy.head(theta, obs)
    sigma = policy.log_std(theta).exp().unsqueeze(-2).expand_as(mean)
    low, high = torch.as_tensor(ACTIONS.low), torch.as_tensor(ACTIONS.high)
    # tanh into (-1, 1), then x ↦ low + (high − low)(x + 1)/2, written as loc + scale·x.
    dist = Independent(
        TransformedDistribution(Normal(mean, sigma), [TanhTransform(), AffineTransform((high + low) / 2, (high - low) / 2)]), 1
    )
    torch.testing.assert_close(policy.log_prob(theta, obs, actions), dist.log_prob(actions), rtol=1e-9, atol=1e-9)
    # The Jacobian term is really there: without it the density would be that of u.
    u = torch.atanh((2 * actions - (high + low)) / (high - low))
    assert (policy.log_prob(theta, obs, actions) - Independent(Normal(mean, sigma), 1).log_prob(u)).abs().min() > 0.1


def test_log_prob_of_own_samples_is_the_density_of_the_pre_squash_draw():
    """The estimators only ever evaluate actions the policy sampled: that round trip (action →
    atanh of the normalized action) recovers the density of the drawn u to 1e-6 in float64."""
    policy = _policy()
    theta = _theta(policy, 4, log_std=0.0)
    obs = torch.rand(4, 3, 200, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 2 - 1
    streams = RandomStreams(derive_keys(11, torch.arange(4)))
    replay = streams[:]
    actions = policy.sample(theta, obs, streams)
    mean = policy.head(theta, obs)
    log_std = policy.log_std(theta).reshape(4, 1, 1, 2)
    u = mean + log_std.exp() * replay.normal(mean.shape[1:], dtype=torch.float64)
    assert u.abs().max() < 6  # away from the boundary: the test is about rounding, not the clip
    half = torch.as_tensor((ACTIONS.high - ACTIONS.low) / 2)
    expected = (
        Normal(mean, log_std.exp()).log_prob(u).sum(-1)
        - torch.log(1 - torch.tanh(u) ** 2).sum(-1)
        - torch.log(half).sum()
    )
    torch.testing.assert_close(policy.log_prob(theta, obs, actions), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(policy.action_head.unsquash_action(actions), u, rtol=0, atol=1e-6)


def test_squashed_samples_stay_inside_the_bounds():
    low, high = torch.as_tensor(ACTIONS.low), torch.as_tensor(ACTIONS.high)
    policy = _policy()
    theta = _theta(policy, 3, log_std=0.0)
    obs = torch.rand(3, 20_000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 2 - 1
    actions = policy.sample(theta, obs, RandomStreams(derive_keys(13, torch.arange(3))))
    assert ((actions > low) & (actions < high)).all()  # strictly: a moderate σ never saturates float64
    assert bool(ACTIONS.contains(actions[0, 0].numpy()))
    # Spread over the whole interval, not collapsed to the centre.
    assert (actions.amin((0, 1)) < low + 0.05 * (high - low)).all() and (actions.amax((0, 1)) > high - 0.05 * (high - low)).all()
    # A huge σ in float32 drives tanh(u) to ±1 exactly; actions still lie in the space, log π stays finite.
    wide = MlpPolicy(OBS, ACTIONS, net_arch=[5], squash="tanh", log_std_init=2.0)
    theta32 = wide.initial_parameters().unsqueeze(0)
    theta32[0, : wide.n_params - 2] *= 60.0  # means far outside tanh's linear range
    obs32 = obs[:1, :2000].float()
    a32 = wide.sample(theta32, obs32, RandomStreams(derive_keys(1, torch.arange(1))))
    assert ((a32 >= low.float()) & (a32 <= high.float())).all()
    assert torch.isfinite(wide.log_prob(theta32, obs32, a32)).all()


def test_mode_is_the_squashed_mean():
    policy = _policy()
    theta = _theta(policy, 2)
    obs = torch.rand(2, 7, 3, dtype=torch.float64) * 2 - 1
    low, high = torch.as_tensor(ACTIONS.low), torch.as_tensor(ACTIONS.high)
    expected = low + (high - low) * (torch.tanh(policy.head(theta, obs)) + 1) / 2
    torch.testing.assert_close(policy.mode(theta, obs), expected, rtol=0, atol=1e-15)
    action, _ = policy.predict(obs[0, 0].numpy(), deterministic=True)
    assert action.shape == (2,) and bool(ACTIONS.contains(action))


@pytest.mark.parametrize("squash", [None, "tanh"])
def test_sampling_is_reproducible_and_independent_of_the_other_rows(squash):
    policy = _policy(squash)
    theta = _theta(policy, 4)
    obs = torch.rand(4, 6, 3, dtype=torch.float64) * 2 - 1
    keys = derive_keys(21, torch.arange(4))
    first = policy.sample(theta, obs, RandomStreams(keys))
    assert torch.equal(first, policy.sample(theta, obs, RandomStreams(keys)))
    alone = policy.sample(theta[2:3], obs[2:3], RandomStreams(keys[2:3]))
    assert torch.equal(alone[0], first[2])
    # Another row's parameters or observations change nothing in row 2.
    theta_b, obs_b = theta.clone(), obs.clone()
    theta_b[0] += 1.0
    obs_b[3] = -obs_b[3]
    assert torch.equal(policy.sample(theta_b, obs_b, RandomStreams(keys))[2], first[2])
    assert not torch.equal(first[0], first[1])  # and rows draw different numbers


def test_unsquashed_gaussian_is_the_plain_diagonal_gaussian():
    """``squash=None`` is the Gaussian of before: the same expression, bitwise, and the same draws."""
    policy = _policy(None)
    theta = _theta(policy, 2)
    obs = torch.rand(2, 5, 3, dtype=torch.float64) * 2 - 1
    keys = derive_keys(3, torch.arange(2))
    actions = policy.sample(theta, obs, RandomStreams(keys))
    mean, log_std = policy.head(theta, obs), policy.log_std(theta).unsqueeze(-2)
    assert torch.equal(actions, mean + torch.exp(log_std) * RandomStreams(keys).normal((5, 2), dtype=torch.float64))
    z = (actions - mean) * torch.exp(-log_std)
    assert torch.equal(policy.log_prob(theta, obs, actions), (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1))
    assert torch.equal(policy.mode(theta, obs), mean)
    assert policy.n_params == _policy("tanh").n_params  # squashing adds no parameter


def test_log1m_tanh_squared_is_stable():
    u = torch.linspace(-30, 30, 601, dtype=torch.float64)
    # 1 − tanh² = 1/cosh², and cosh has no cancellation (the direct form loses digits as tanh → ±1).
    torch.testing.assert_close(log1m_tanh_squared(u), -2 * torch.log(torch.cosh(u)), rtol=1e-12, atol=1e-12)
    assert not torch.log(1 - torch.tanh(u) ** 2).isfinite().all()  # where the direct form fails


def _batch(policy, rows: int = 2, m: int = 3, horizon: int = 4, seed: int = 0) -> tuple[torch.Tensor, Trajectories, torch.Tensor]:
    theta = _theta(policy, rows, seed)
    gen = torch.Generator().manual_seed(seed)
    obs = torch.rand(rows, m, horizon, 3, dtype=torch.float64, generator=gen) * 2 - 1
    actions = policy.sample(theta, obs, RandomStreams(derive_keys(seed, torch.arange(rows))))
    mask = torch.ones(rows, m, horizon, dtype=torch.float64)
    mask[0, 1, 2:] = 0  # one early termination
    psi = torch.randn(rows, m, horizon, dtype=torch.float64, generator=gen) * mask
    return theta, Trajectories(obs, actions, torch.zeros_like(mask), mask), psi


def test_autograd_score_gradient_and_hvp_run_on_the_squashed_policy():
    """Against explicit formulas: ``(1/m) Σ_ξ ∇ν(ξ)`` and ``(1/m) Σ_ξ [∇ν(ξ) ∇log q(ξ)ᵀv + ∇²ν(ξ) v]``
    with per-trajectory Jacobians and Hessians (``torch.autograd.functional``)."""
    policy = _policy(net_arch=[3])
    theta, traj, psi = _batch(policy)
    v = torch.randn_like(theta)
    grad = policy.score_gradient(theta, traj, psi)
    hv = policy.hvp(theta, traj, v, psi)
    for b in range(theta.shape[0]):
        row = Trajectories(*(x[b : b + 1] for x in traj))

        def nu(th: torch.Tensor, row=row, b=b) -> torch.Tensor:  # per-trajectory Σ_h ψ log π: [m]
            return (masked_log_prob(policy, th.unsqueeze(0), row) * psi[b : b + 1]).sum(-1)[0]

        def log_q(th: torch.Tensor, row=row) -> torch.Tensor:
            return masked_log_prob(policy, th.unsqueeze(0), row).sum(-1)[0]

        jac_nu = torch.autograd.functional.jacobian(nu, theta[b])  # [m, d]
        jac_q = torch.autograd.functional.jacobian(log_q, theta[b])
        hessians = torch.stack([torch.autograd.functional.hessian(lambda th, j=j: nu(th)[j], theta[b]) for j in range(3)])
        torch.testing.assert_close(grad[b], jac_nu.mean(0), rtol=1e-10, atol=1e-12)
        expected = (jac_nu * (jac_q @ v[b]).unsqueeze(-1) + hessians @ v[b]).mean(0)
        torch.testing.assert_close(hv[b], expected, rtol=1e-9, atol=1e-11)
    assert grad.abs().max() > 1e-3 and hv.abs().max() > 1e-3


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="squash"):
        MlpPolicy(OBS, gym.spaces.Box(-np.inf, np.inf, (2,)), squash="tanh")
    with pytest.raises(ValueError, match="squash"):
        MlpPolicy(OBS, gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, np.inf]), dtype=np.float64), squash="tanh")
    with pytest.raises(ValueError, match="squash"):
        MlpPolicy(OBS, ACTIONS, squash="sigmoid")
    with pytest.raises(ValueError, match="squash"):
        MlpPolicy(OBS, gym.spaces.Discrete(3), squash="tanh")
    with pytest.raises(ValueError, match="activation"):
        MlpPolicy(OBS, ACTIONS, activation="elu")
    with pytest.raises(ValueError, match="activation_fn"):
        MlpPolicy(OBS, ACTIONS, activation_fn=nn.Linear)  # needs arguments and has weights
    with pytest.raises(ValueError, match="activation_fn"):
        MlpPolicy(OBS, ACTIONS, activation_fn=nn.PReLU)  # its weight would live outside θ
    with pytest.raises(ValueError, match="activation_fn"):
        MlpPolicy(OBS, ACTIONS, activation_fn=torch.tanh)  # a function, not SB3's module class
    with pytest.raises(ValueError, match="activation or activation_fn"):
        MlpPolicy(OBS, ACTIONS, activation="tanh", activation_fn=nn.Tanh)
    # The unsquashed Gaussian still accepts unbounded action spaces.
    assert MlpPolicy(OBS, gym.spaces.Box(-np.inf, np.inf, (2,))).squash is None


def test_sb3_activation_fn_names():
    """``activation_fn=nn.Tanh`` is ``activation="tanh"`` (closed forms kept), ``nn.ReLU`` is ``"relu"``;
    other parameter-free modules apply as they are."""
    discrete = gym.spaces.Discrete(4)
    theta = torch.randn(2, MlpPolicy(OBS, discrete).n_params, dtype=torch.float64)
    obs = torch.rand(2, 5, 3, dtype=torch.float64)
    for cls, name in ((nn.Tanh, "tanh"), (nn.ReLU, "relu")):
        by_class = MlpPolicy(OBS, discrete, activation_fn=cls, dtype=torch.float64)
        by_name = MlpPolicy(OBS, discrete, activation=name, dtype=torch.float64)
        assert by_class.is_softmax_mlp == by_name.is_softmax_mlp == (name == "tanh")
        assert torch.equal(by_class.logits(theta, obs), by_name.logits(theta, obs))
    elu = MlpPolicy(OBS, discrete, activation_fn=nn.ELU, dtype=torch.float64)
    w1, b1 = theta[:, :96].reshape(2, 3, 32), theta[:, 96:128]
    w2, b2 = theta[:, 128:256].reshape(2, 32, 4), theta[:, 256:260]
    hidden = torch.nn.functional.elu(obs @ w1 + b1.unsqueeze(1))
    torch.testing.assert_close(elu.logits(theta, obs), hidden @ w2 + b2.unsqueeze(1))
    assert not elu.is_softmax_mlp


@pytest.mark.parametrize("kwargs", [dict(squash="tanh"), dict(squash=None), dict(activation_fn=nn.ELU, squash="tanh"), dict(activation_fn=nn.ReLU)])
def test_constructor_parameters_rebuild_the_policy(kwargs):
    policy = _policy(**kwargs)
    again = MlpPolicy(**policy._get_constructor_parameters())
    assert again.squash == policy.squash and again.activation_name == policy.activation_name
    assert again.activation_fn is policy.activation_fn
    theta = _theta(policy, 2)
    obs = torch.rand(2, 4, 3, dtype=torch.float64)
    actions = policy.sample(theta, obs, RandomStreams(derive_keys(0, torch.arange(2))))
    assert torch.equal(again.log_prob(theta, obs, actions), policy.log_prob(theta, obs, actions))


def test_save_and_load_keep_the_squash(tmp_path):
    """SB3's ``BasePolicy.save``/``load`` (constructor parameters + θ) round-trip the policy."""
    policy = _policy(activation_fn=nn.ReLU)
    policy.theta.data += 0.25
    policy.save(tmp_path / "policy.pt")
    loaded = MlpPolicy.load(tmp_path / "policy.pt")
    assert loaded.squash == "tanh" and loaded.activation_name == "relu" and torch.equal(loaded.theta, policy.theta)


@pytest.mark.parametrize("squash", [None, "tanh"])
def test_orthogonal_initialization_is_sb3s_ortho_init(squash):
    """``init_gains=(√2, 0.01)``: every layer's [out, in] weight has orthogonal rows or columns times its gain."""
    obs_space = gym.spaces.Box(-1.0, 1.0, (11,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    policy = MlpPolicy(obs_space, act_space, net_arch=(64, 8), activation="relu", squash=squash, init_gains=(math.sqrt(2.0), 0.01),
                       log_std_init=-0.5, dtype=torch.float64)
    theta, offset = policy.theta.detach(), 0
    for k, (i, o) in enumerate([(11, 64), (64, 8), (8, 3)]):
        weight = theta[offset : offset + i * o].reshape(i, o).T  # torch's [out, in]
        gain = 0.01 if k == 2 else math.sqrt(2.0)
        gram = weight @ weight.T if o <= i else weight.T @ weight
        torch.testing.assert_close(gram, gain**2 * torch.eye(min(i, o), dtype=torch.float64), rtol=0, atol=1e-12)
        assert bool((theta[offset + i * o : offset + i * o + o] == 0).all())
        offset += i * o + o
    assert offset + 3 == policy.n_params and theta[-3:].tolist() == [-0.5] * 3
    again = MlpPolicy(**policy._get_constructor_parameters())
    assert again.init_gains == (math.sqrt(2.0), 0.01) and torch.equal(again.theta, policy.theta)
    assert not torch.equal(policy.initial_parameters(seed=1), policy.theta)
    default = MlpPolicy(obs_space, act_space, net_arch=(64, 8), dtype=torch.float64)
    assert default.init_gains is None and default.init_std == [0.5, 0.5, 0.1]


@pytest.mark.parametrize("gains", [(1.0,), (1.0, 0.0), (1.0, float("nan")), "ab", ("1", "2"), (True, 1.0), 1.0])
def test_orthogonal_initialization_gains_are_checked(gains):
    with pytest.raises(ValueError, match=r"^init_gains must be a pair of positive numbers \(hidden, last\), got "):
        MlpPolicy(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2), init_gains=gains)


def test_a_default_policy_saves_no_init_gains_and_an_orthogonal_one_round_trips(tmp_path):
    obs_space, act_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2)
    assert "init_gains" not in MlpPolicy(obs_space, act_space)._get_constructor_parameters()  # loadable by earlier versions
    policy = MlpPolicy(obs_space, act_space, init_gains=(1.0, 0.5))
    policy.save(tmp_path / "policy.pt")
    loaded = MlpPolicy.load(tmp_path / "policy.pt")
    assert loaded.init_gains == (1.0, 0.5) and torch.equal(loaded.theta, policy.theta)
