"""The compiled curvature product (``FastMlpPolicy(kernels="numba")``) against float64 autograd, the torch
closed form, and itself on other tilings and batches."""

import pytest
import torch

pytest.importorskip("numba")

from fedrl_algos.core.curvature import CURVATURES, curvature_hvp, curvature_vector_product, curvature_weights  # noqa: E402
from fedrl_algos.core.trajectories import Trajectories  # noqa: E402
from fedrl_algos.policies import FastMlpPolicy  # noqa: E402
from fedrl_algos.policies.mlp import compiled_hvp as mlp_compiled_hvp  # noqa: E402
from fedrl_algos.policies.mlp.compiled_hvp import compiled_hvp, compiled_hvp_applies  # noqa: E402
from fedrl_algos.policies.mlp.kernels import mlp_hvp, mlp_rollout  # noqa: E402
from fedrl_envs import ARC_NAVIGATION, CARTPOLE, RandomStreams, derive_keys, stack_params  # noqa: E402


def _policy(kernels="numba", family=ARC_NAVIGATION, **kwargs):
    task = family.train_tasks[0]
    return FastMlpPolicy(family.observation_space(task), family.action_space(task), kernels=kernels, **kwargs)


def _batch(rows=5, m=12, seed=0, scale=0.5):
    """Parameters far from uniform, their arc-navigation rollouts and a direction."""
    policy = _policy()
    gen = torch.Generator().manual_seed(seed)
    theta = policy.theta.detach() + scale * torch.randn(rows, policy.n_params, generator=gen)
    tasks = ARC_NAVIGATION.train_tasks
    params = stack_params([tasks[r % len(tasks)] for r in range(rows)])
    traj = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, RandomStreams(derive_keys(torch.tensor(seed), torch.arange(rows))), m)
    v = 0.1 * torch.randn(rows, policy.n_params, generator=gen)
    return policy, theta, traj, v


def _exact(theta, traj, v, weights, coupling):
    """The same quantity by float64 autograd."""
    return curvature_hvp(_policy("torch", dtype=torch.float64), theta.double(), traj._replace(obs=traj.obs.double()),
                         v.double(), weights.double(), coupling, closed_form=False)


@pytest.mark.parametrize("coupling", CURVATURES)
def test_compiled_curvature_product_matches_float64_autograd_and_the_torch_closed_form(coupling):
    policy, theta, traj, v = _batch(seed=1)
    weights = curvature_weights(traj, 0.9, coupling)
    assert compiled_hvp_applies(policy.softmax_mlp, theta, traj, v, weights)
    got = compiled_hvp(policy.softmax_mlp, theta, traj, v, weights, coupling)
    closed = curvature_hvp(_policy("torch"), theta, traj, v, weights, coupling)
    exact = _exact(theta, traj, v, weights, coupling)
    assert got.dtype == torch.float32 and got.shape == theta.shape
    assert float(exact.norm()) > 0
    error = float((got.double() - exact).norm() / exact.norm())
    assert error < 2e-6
    # as close to the float64 product as the torch kernel (float32 both)
    assert error <= 2.0 * float((closed.double() - exact).norm() / exact.norm()) + 1e-7


def test_the_policy_and_the_estimators_use_the_compiled_product_with_numba_kernels():
    policy, theta, traj, v = _batch(seed=2)
    weights = curvature_weights(traj, 0.9, "paper")
    want = compiled_hvp(policy.softmax_mlp, theta, traj, v, weights)
    assert torch.equal(mlp_hvp(policy.softmax_mlp, theta, traj, v, weights), want)
    assert torch.equal(curvature_vector_product(policy, theta, traj, v, 0.9), want)
    # the torch kernels elsewhere: another kernels choice, float64, an explicit tiling of the torch kernel
    torch_policy = _policy("torch")
    assert not compiled_hvp_applies(torch_policy.softmax_mlp, theta, traj, v, weights)
    assert not compiled_hvp_applies(policy.softmax_mlp, theta.double(), traj, v, weights)
    assert not compiled_hvp_applies(policy.softmax_mlp, theta.clone().requires_grad_(), traj, v, weights)
    assert torch.equal(mlp_hvp(policy.softmax_mlp, theta, traj, v, weights, chunk_samples=4096), mlp_hvp(torch_policy.softmax_mlp, theta, traj, v, weights))


@pytest.mark.parametrize("coupling", CURVATURES)
def test_a_rows_product_depends_neither_on_the_tiling_nor_on_the_batch(coupling, monkeypatch):
    policy, theta, traj, v = _batch(rows=6, m=40, seed=3)
    weights = curvature_weights(traj, 0.9, coupling)
    whole = compiled_hvp(policy.softmax_mlp, theta, traj, v, weights, coupling)
    for tile in (1, 21 * 5, 21 * 37, 100_000):
        assert torch.equal(compiled_hvp(policy.softmax_mlp, theta, traj, v, weights, coupling, tile_samples=tile), whole)
    alone = compiled_hvp(policy.softmax_mlp, theta[3:4], Trajectories(*[x[3:4] for x in traj]), v[3:4], weights[3:4], coupling)
    assert torch.equal(alone, whole[3:4])
    monkeypatch.setattr(mlp_compiled_hvp, "HVP_BLOCK_TRAJECTORIES", 3)  # other blocks: other float32 sums, same value
    reblocked = compiled_hvp(policy.softmax_mlp, theta, traj, v, weights, coupling)
    assert torch.allclose(reblocked, whole, rtol=1e-5, atol=1e-6 * float(whole.abs().max()))


def test_trajectories_without_weight_add_exactly_nothing():
    policy, theta, traj, v = _batch(rows=4, m=10, seed=4)
    weights = curvature_weights(traj, 0.9, "paper").clone()
    weights[1] = 0.0  # a row with no rewarded trajectory
    weights[2, 3:] = 0.0  # a row with three
    got = compiled_hvp(policy.softmax_mlp, theta, traj, v, weights)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    kept = Trajectories(*[x[2:3, :3] for x in traj])
    # (1/m) normalization: the three trajectories alone, scaled from m = 3 to m = 10
    alone = compiled_hvp(policy.softmax_mlp, theta[2:3], kept, v[2:3], weights[2:3, :3])
    assert torch.allclose(got[2:3], alone * 3 / 10, rtol=1e-6, atol=0)
    assert torch.equal(compiled_hvp(policy.softmax_mlp, theta, traj, v, torch.zeros_like(weights)), torch.zeros_like(theta))
    exact = _exact(theta, traj, v, weights, "paper")
    assert float((got.double() - exact).norm() / exact.norm()) < 2e-6


@pytest.mark.parametrize("coupling", CURVATURES)
def test_compiled_product_of_other_network_sizes_matches_autograd(coupling):
    """Odd sizes (4 inputs, 7 hidden units, 2 actions: every loop's remainder path) and batch shapes."""
    task = CARTPOLE.train_tasks[0]
    policy = FastMlpPolicy(CARTPOLE.observation_space(task), CARTPOLE.action_space(task), net_arch=(7,), kernels="numba")
    gen = torch.Generator().manual_seed(5)
    theta = torch.randn(2, 3, policy.n_params, generator=gen)
    obs = torch.randn(2, 3, 4, 6, 4, generator=gen)
    actions = torch.randint(0, 2, (2, 3, 4, 6), generator=gen)
    mask = (torch.rand(2, 3, 4, 6, generator=gen) < 0.8).float().cummin(-1).values  # early terminations
    traj = Trajectories(obs=obs, actions=actions, rewards=torch.rand(2, 3, 4, 6, generator=gen) * mask, mask=mask)
    v = torch.randn(2, 3, policy.n_params, generator=gen)
    weights = curvature_weights(traj, 0.9, coupling)
    got = compiled_hvp(policy.softmax_mlp, theta, traj, v, weights, coupling)
    exact = curvature_hvp(FastMlpPolicy(CARTPOLE.observation_space(task), CARTPOLE.action_space(task), net_arch=(7,),
                                        dtype=torch.float64), theta.double(), traj._replace(obs=obs.double()), v.double(),
                          weights.double(), coupling, closed_form=False)
    assert got.shape == theta.shape
    assert float((got.double() - exact).norm() / exact.norm()) < 2e-6
