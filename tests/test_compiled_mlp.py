"""``FastMlpPolicy(kernels="numba")``: compiled rollouts and policy gradients against the torch kernels and autograd."""

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from fedrl_algos.core.estimators import autograd_score_gradient, policy_gradient, reward_to_go_weights  # noqa: E402
from fedrl_algos.policies import FastMlpPolicy, kernel_choice  # noqa: E402
from fedrl_algos.policies.mlp import compiled as mlp_compiled  # noqa: E402
from fedrl_algos.policies.mlp.kernels import mlp_rollout  # noqa: E402
from fedrl_envs import ARC_NAVIGATION, CARTPOLE, RandomStreams, derive_keys, stack_params  # noqa: E402
from fedrl_envs.arc_navigation import ArcNavigationFamily, _compiled_row_transition  # noqa: E402


def _policy(kernels="numba", family=ARC_NAVIGATION, **kwargs):
    task = family.train_tasks[0]
    return FastMlpPolicy(family.observation_space(task), family.action_space(task), kernels=kernels, **kwargs)


def _thetas(policy, rows, scale=1.0, seed=0):
    """Trained-looking parameters: the init plus noise, so that the policies are far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    base = policy.theta.detach()
    return (base + scale * torch.randn(rows, base.numel(), generator=gen)).to(base.dtype)


def _streams(rows, seed=0):
    return RandomStreams(derive_keys(torch.tensor(seed), torch.arange(rows)))


def _params(rows):
    tasks = ARC_NAVIGATION.train_tasks
    return stack_params([tasks[r % len(tasks)] for r in range(rows)])


def _rollouts(theta, m=16, seed=0, kernels=("torch", "numba")):
    rows = theta.shape[0]
    out = {}
    for k in kernels:
        streams = _streams(rows, seed)
        out[k] = (mlp_rollout(ARC_NAVIGATION, _params(rows), _policy(k).softmax_mlp, theta, streams, m), streams)
    return out


def test_compiled_arc_transition_is_bitwise_the_torch_step():
    gen = torch.Generator().manual_seed(1)
    n = 4096
    tasks = ARC_NAVIGATION.train_tasks + ARC_NAVIGATION.heldout_tasks
    params = stack_params([tasks[i % len(tasks)] for i in range(n)])
    # positions near the goals (the reward's boundary), on the box's edges (the clip) and anywhere
    near = params.goal + 0.2 * (2 * torch.rand(n, 2, generator=gen) - 1)
    edge = torch.sign(torch.randn(n, 2, generator=gen)) * (1 - 0.1 * torch.rand(n, 2, generator=gen))
    state = torch.cat([near[: n // 2], edge[: n // 4], 2 * torch.rand(n - n // 2 - n // 4, 2, generator=gen) - 1]).clamp(-1, 1)
    action = torch.randint(0, 8, (n,), generator=gen)
    want_state, want_reward, want_done = ARC_NAVIGATION.step(state, action, params)
    transition, data = ARC_NAVIGATION.compiled_transition(params, n)
    for function in (transition, transition.py_func):  # compiled, and its Python source
        got_state = state.numpy().copy()
        got = [function(got_state, i, int(action[i]), i, data) for i in range(n)]
        assert np.array_equal(got_state, want_state.numpy())
        assert np.array_equal(np.array([g[0] for g in got], np.float32), want_reward.numpy())
        assert not any(g[1] for g in got) and not bool(want_done.any())
    assert 0 < int(want_reward.sum()) < n and bool((want_state.abs() == 1).any())  # both boundaries were exercised


def test_compiled_rollout_draws_the_torch_trajectories_up_to_rounding():
    policy = _policy("torch")
    theta = _thetas(policy, 12, scale=0.5)
    runs = _rollouts(theta, m=64)
    (a, sa), (b, sb) = runs["torch"], runs["numba"]
    assert torch.equal(sa.counters, sb.counters) and torch.equal(sa.keys, sb.keys)  # the same draws
    for name in ("obs", "actions", "rewards", "mask"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and x.dtype == y.dtype, name
    same = (a.actions == b.actions).all(-1)  # whole trajectories
    assert float(same.float().mean()) > 0.99
    assert torch.equal(a.obs[same], b.obs[same]) and torch.equal(a.rewards[same], b.rewards[same])
    assert torch.equal(a.obs[..., 0, :], b.obs[..., 0, :])  # the same starts
    assert float(a.rewards.sum()) > 0  # some trajectories reach their goal


def test_compiled_rollout_of_a_row_does_not_depend_on_the_batch_and_repeats():
    policy = _policy()
    theta = _thetas(policy, 6, scale=0.3, seed=4)
    params = _params(6)
    whole = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(6), 8)
    again = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(6), 8)
    for x, y in zip(whole, again, strict=True):
        assert torch.equal(x, y)
    streams = _streams(6)
    one = RandomStreams(streams.keys[3:4])
    alone = mlp_rollout(ARC_NAVIGATION, dataclasses.replace(params, goal=params.goal[3:4]), policy.softmax_mlp, theta[3:4], one, 8)
    for x, y in zip(whole, alone, strict=True):
        assert torch.equal(x[3:4], y)


def test_compiled_rollout_keeps_batch_shapes():
    policy = _policy()
    theta = _thetas(policy, 6, scale=0.3).reshape(2, 3, -1)
    streams = RandomStreams(derive_keys(torch.tensor(0), torch.arange(6).reshape(2, 3)))
    traj = mlp_rollout(ARC_NAVIGATION, _params(6), policy.softmax_mlp, theta, streams, 5)
    assert traj.obs.shape == (2, 3, 5, 21, 2) and traj.actions.shape == (2, 3, 5, 21)
    assert traj.actions.dtype == torch.int64 and traj.rewards.dtype == torch.float32


def _weights(traj, gamma=0.9):
    return reward_to_go_weights(traj, gamma)


def test_compiled_policy_gradient_matches_autograd_and_the_torch_closed_form():
    torch_policy, policy = _policy("torch"), _policy()
    theta = _thetas(torch_policy, 5, scale=0.5, seed=2)
    traj, _ = _rollouts(theta, m=12, kernels=("torch",))["torch"]
    weights = _weights(traj)
    got = policy.score_gradient(theta, traj, weights)
    closed = torch_policy.score_gradient(theta, traj, weights)
    exact = autograd_score_gradient(torch_policy, theta.double(), traj._replace(obs=traj.obs.double()), weights.double())
    assert got.dtype == torch.float32 and got.shape == theta.shape
    scale = exact.abs().max()
    assert float((got.double() - exact).abs().max() / scale) < 2e-6
    assert float((closed.double() - exact).abs().max() / scale) < 2e-6
    # accumulated in float64: at least as close to the float64 gradient as the float32 torch kernel
    assert float((got.double() - exact).norm()) <= 1.5 * float((closed.double() - exact).norm())


def test_compiled_policy_gradient_does_not_depend_on_tiling_or_batch():
    policy = _policy()
    theta = _thetas(policy, 7, scale=0.5, seed=5)
    traj, _ = _rollouts(theta, m=9, kernels=("numba",))["numba"]
    weights = _weights(traj)
    whole = mlp_compiled.compiled_policy_gradient(policy.softmax_mlp, theta, traj, weights)
    for chunk in (1, 50, 21 * 9, 10_000):
        assert torch.equal(mlp_compiled.compiled_policy_gradient(policy.softmax_mlp, theta, traj, weights, chunk_samples=chunk), whole)
    row = [x[2:3] for x in traj]
    alone = mlp_compiled.compiled_policy_gradient(policy.softmax_mlp, theta[2:3], type(traj)(*row), weights[2:3])
    assert torch.equal(alone, whole[2:3])


def test_compiled_policy_gradient_skips_zero_weights_exactly():
    policy = _policy()
    theta = _thetas(policy, 3, scale=0.5, seed=6)
    traj, _ = _rollouts(theta, m=6, kernels=("numba",))["numba"]
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(traj.rewards.shape, generator=gen) * (torch.rand(traj.rewards.shape, generator=gen) < 0.3)
    got = policy.score_gradient(theta, traj, weights)
    exact = autograd_score_gradient(policy, theta.double(), traj._replace(obs=traj.obs.double()), weights.double())
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 2e-6
    assert torch.equal(policy.score_gradient(theta, traj, torch.zeros_like(weights)), torch.zeros_like(theta))


def test_a_policy_gradient_step_through_the_estimator_uses_the_compiled_kernel(monkeypatch):
    policy = _policy()
    theta = _thetas(policy, 4, scale=0.5)
    traj, _ = _rollouts(theta, m=5, kernels=("numba",))["numba"]
    calls = []
    real = mlp_compiled.compiled_policy_gradient
    monkeypatch.setattr("fedrl_algos.policies.mlp.kernels.compiled_policy_gradient",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    grad = policy_gradient(policy, theta, traj, 0.9)
    assert calls and torch.equal(grad, real(policy.softmax_mlp, theta, traj, _weights(traj)))


def test_where_the_compiled_kernels_do_not_apply_the_torch_kernels_run(monkeypatch):
    torch_policy = _policy("torch")
    theta = _thetas(torch_policy, 3, scale=0.5)
    params = _params(3)

    def same_as_torch(policy, family=ARC_NAVIGATION, reference=torch_policy, th=theta):
        a = mlp_rollout(family, params, reference.softmax_mlp, th, _streams(3), 4)
        b = mlp_rollout(family, params, policy.softmax_mlp, th, _streams(3), 4)
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    assert same_as_torch(_policy("numba", dtype=torch.float64), reference=_policy("torch", dtype=torch.float64),
                         th=theta.double())
    # float64 parameters, gradients through θ, a subclass with other dynamics, a family without a compiled step
    assert mlp_compiled.compiled_rollout_applies(_policy().softmax_mlp, ARC_NAVIGATION, params, theta.double()) is None
    assert mlp_compiled.compiled_rollout_applies(_policy().softmax_mlp, ARC_NAVIGATION, params, theta.clone().requires_grad_()) is None
    assert mlp_compiled.compiled_rollout_applies(_policy("torch").softmax_mlp, ARC_NAVIGATION, params, theta) is None

    class Windy(ArcNavigationFamily):
        def step(self, state, action, params):
            next_state, reward, done = super().step(state, action, params)
            return (next_state + 0.01).clamp(-1, 1), reward, done

    assert mlp_compiled.compiled_rollout_applies(_policy().softmax_mlp, Windy(), params, theta) is None
    assert same_as_torch(_policy(), family=Windy())
    cart = _policy("numba", family=CARTPOLE)
    cart_theta = cart.theta.detach().expand(2, -1).clone()
    assert mlp_compiled.compiled_rollout_applies(cart.softmax_mlp, CARTPOLE, stack_params(CARTPOLE.train_tasks[:2]), cart_theta) is None
    # without Numba, "numba" and "auto" run the torch kernels
    monkeypatch.setattr(kernel_choice, "numba_available", lambda: False)
    assert kernel_choice.resolve_kernels("auto") == "torch"
    with pytest.warns(UserWarning, match="runs only on a CPU with Numba installed"):
        assert kernel_choice.resolve_kernels("numba") == "torch"  # what runs, and what the experiments record
    with pytest.warns(UserWarning, match="runs only on a CPU with Numba installed"):
        assert same_as_torch(_policy("numba"))
    assert same_as_torch(_policy("auto"))


def test_auto_resolves_to_numba_on_the_cpu_only():
    assert kernel_choice.resolve_kernels("auto", "cpu") == "numba"
    assert kernel_choice.resolve_kernels("auto", "cuda") == "torch"
    assert kernel_choice.resolve_kernels("numba", "cpu") == "numba"
    with pytest.warns(UserWarning, match="the torch kernels run on cuda"):
        assert kernel_choice.resolve_kernels("numba", "cuda") == "torch"
    assert kernel_choice.resolve_kernels("torch", "cpu") == "torch"
    assert mlp_compiled.compiled_rollout_applies(_policy("auto").softmax_mlp, ARC_NAVIGATION, _params(2),
                                                 _thetas(_policy(), 2)) is not None


@pytest.mark.parametrize("bad", ["cuda", "Numba", None, 1])
def test_bad_kernels_are_rejected_with_the_argument_named(bad):
    with pytest.raises(ValueError, match="kernels must be one of"):
        _policy(bad)
    with pytest.raises(ValueError, match="kernels must be one of"):
        kernel_choice.resolve_kernels(bad)


def test_the_kernels_choice_is_saved_with_the_policy(tmp_path):
    policy = _policy("numba")
    policy.save(tmp_path / "policy.pth")
    loaded = FastMlpPolicy.load(tmp_path / "policy.pth")
    assert loaded.kernels == "numba" and torch.equal(loaded.theta, policy.theta)
    assert "kernels" not in _policy("torch")._get_constructor_parameters()


def test_the_arc_transition_is_compiled_once():
    assert _compiled_row_transition() is _compiled_row_transition()
    params = _params(4)
    first, second = ARC_NAVIGATION.compiled_transition(params, 4), ARC_NAVIGATION.compiled_transition(params, 4)
    assert first[0] is second[0]
    assert ARC_NAVIGATION.compiled_transition(params, 5) is None  # goals neither one per row nor one for all
    one = ARC_NAVIGATION.train_tasks[0]
    assert ARC_NAVIGATION.compiled_transition(one, 3)[1][0].shape == (3, 2)


@pytest.mark.parametrize("shape", [(3, 32, 8, 10), (2, 7, 3, 5), (4, 5, 1, 17), (1, 1, 2, 3), (2, 33, 9, 210)])
def test_compiled_layers_are_the_sequential_sums_with_row_or_per_env_weights(shape):
    """Both loop variants compute every pre-activation and logit as the plain definition: terms in
    order, bias last (logits: less their maximum), so rollouts give the same bits whichever runs."""
    rows, n_hidden, n_out, m = shape
    n_in = 3
    rng = np.random.default_rng(0)
    a1 = rng.standard_normal((rows, n_in, n_hidden)).astype(np.float32)
    a1b = rng.standard_normal((rows, n_hidden)).astype(np.float32)
    a2 = rng.standard_normal((rows, n_hidden, n_out)).astype(np.float32)
    a2b = rng.standard_normal((rows, n_out)).astype(np.float32)
    x = rng.standard_normal((n_in, rows * m)).astype(np.float32)
    sig = rng.random((n_hidden, rows * m)).astype(np.float32)
    want_z = np.empty((n_hidden, rows * m), np.float32)
    want_l = np.empty((n_out, rows * m), np.float32)
    for r in range(rows):
        cols = slice(r * m, (r + 1) * m)
        for j in range(n_hidden):
            acc = a1[r, 0, j] * x[0, cols]
            for k in range(1, n_in):
                acc = acc + a1[r, k, j] * x[k, cols]  # float32 arrays: one rounding per operation
            want_z[j, cols] = acc + a1b[r, j]
        for q in range(n_out):
            acc = a2[r, 0, q] * sig[0, cols]
            for j in range(1, n_hidden):
                acc = acc + a2[r, j, q] * sig[j, cols]
            want_l[q, cols] = acc + a2b[r, q]
    want_l -= want_l.max(axis=0, keepdims=True)
    loops = mlp_compiled._loops(None)
    z, logits = np.empty_like(want_z), np.empty_like(want_l)
    loops.hidden_inputs(a1, a1b, x, m, z)
    loops.centred_logits(a2, a2b, sig, m, logits)
    assert np.array_equal(z, want_z) and np.array_equal(logits, want_l)
    e1, e1b = np.empty((n_in, n_hidden, rows * m), np.float32), np.empty((n_hidden, rows * m), np.float32)
    e2, e2b = np.empty((n_hidden, n_out, rows * m), np.float32), np.empty((n_out, rows * m), np.float32)
    loops.per_env_weights(a1, a1b, a2, a2b, m, e1, e1b, e2, e2b)
    loops.hidden_inputs_per_env(e1, e1b, x, z)
    loops.centred_logits_per_env(e2, e2b, sig, logits)
    assert np.array_equal(z, want_z) and np.array_equal(logits, want_l)


def test_rollouts_with_few_or_many_trajectories_a_row_take_either_loop_variant_with_the_same_bits(monkeypatch):
    policy = _policy()
    theta = _thetas(policy, 5, scale=0.5, seed=8)
    params = _params(5)
    default = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(5), 12)  # per-environment weights, one block
    monkeypatch.setattr(mlp_compiled, "ENV_BLOCK", 25)  # blocks of 2 rows
    blocked = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(5), 12)
    monkeypatch.setattr(mlp_compiled, "PER_ENV_WEIGHTS_BELOW", 1)  # the rows' own weights over their segments
    per_row = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(5), 12)
    monkeypatch.setattr(mlp_compiled, "SEGMENT_BLOCK", 30)  # segments in blocks of 2 rows (5 rows: 2, 2, 1)
    per_row_blocked = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(5), 12)
    monkeypatch.setattr(mlp_compiled, "SEGMENT_BLOCK", 1)  # one row at a time
    one_row = mlp_rollout(ARC_NAVIGATION, params, policy.softmax_mlp, theta, _streams(5), 12)
    for a, *others in zip(default, blocked, per_row, per_row_blocked, one_row, strict=True):
        assert all(torch.equal(a, b) for b in others)


def test_compiled_policy_gradient_of_a_network_with_four_inputs_matches_autograd():
    """The gradient loops apply to any paper-shaped network (here CartPole's 4 inputs), not only arc navigation's."""
    policy = FastMlpPolicy(CARTPOLE.observation_space(CARTPOLE.train_tasks[0]), CARTPOLE.action_space(CARTPOLE.train_tasks[0]),
                           net_arch=(7,), kernels="numba")
    gen = torch.Generator().manual_seed(3)
    theta = torch.randn(2, policy.n_params, generator=gen)
    obs = torch.randn(2, 3, 5, 4, generator=gen)
    actions = torch.randint(0, 2, (2, 3, 5), generator=gen)
    mask = torch.ones(2, 3, 5)
    from fedrl_algos.core.trajectories import Trajectories

    traj = Trajectories(obs=obs, actions=actions, rewards=torch.rand(2, 3, 5, generator=gen), mask=mask)
    weights = reward_to_go_weights(traj, 0.9)
    assert mlp_compiled.compiled_gradient_applies(policy.softmax_mlp, theta, traj, weights)
    got = policy.score_gradient(theta, traj, weights)
    exact = autograd_score_gradient(policy, theta.double(), traj._replace(obs=obs.double()), weights.double())
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 2e-6


def test_the_compiled_uniform_draws_are_the_streams_bits_and_advance_them_alike():
    keys = derive_keys(torch.tensor([0, 7, -3, 2**62]), torch.arange(4))
    a, b = RandomStreams(keys.clone()), RandomStreams(keys.clone())
    a.uniform((5,)), b.uniform((5,))  # counters past zero
    b.counters = b.counters + torch.tensor([0, 1, 2**40, -(2**40)])  # unequal, large and negative counters too
    a.counters = b.counters.clone()
    for count in (1, 3, 1000):
        want = a.uniform((count,))
        got = mlp_compiled._uniforms(mlp_compiled._loops(None), b, count)
        assert np.array_equal(got, want.numpy()) and torch.equal(a.counters, b.counters)


def test_the_reproductions_estimate_their_wall_time_for_the_kernels_that_run():
    from fedrl_algos.reproduce import EXPERIMENTS

    for name in ("fewshot", "curvature"):
        experiment = EXPERIMENTS[name]
        compiled = experiment.estimate_wall_time(experiment.config(kernels="numba"), 10)
        plain = experiment.estimate_wall_time(experiment.config(kernels="torch"), 10)
        assert compiled.seconds < plain.seconds and "compiled" in compiled.basis and "compiled" not in plain.basis
        assert experiment.estimate_wall_time(experiment.config(kernels="auto"), 10) == compiled  # Numba is installed here
