"""Captured rollouts (``fedrl_algos.core.capture``) checked on the CPU: they are the eager rollouts.

* With the ``aot_eager`` backend (the compiled graph runs eager's operations) a captured rollout is
  bitwise :func:`generic_rollout` on all four native families, with and without
  ``stop_when_done``, and leaves the random streams where eager leaves them.
* The captured step is one graph: no graph break (``torch._dynamo.explain``).
* With the default ``inductor`` backend (what CUDA runs, here its CPU code): identical actions and
  termination flags, observations and rewards within float32 rounding compounded over the rollout.
* ``capture="auto"`` is off on the CPU (the CPU keeps its numbers); bad values are refused; a
  policy that cannot be captured falls back to the eager rollout with a warning, drawing the same numbers.
"""

from __future__ import annotations

import pytest
import torch

from fedrl_algos import PerFedAvgPG
from fedrl_algos.core.capture import CapturedRollout, captured_rollout, check_capture, resolve_capture
from fedrl_algos.core.sampling import KernelSampler, generic_rollout
from fedrl_algos.policies import MlpPolicy, TabularPolicy
from fedrl_envs import get_family, stack_params
from fedrl_envs.rng import RandomStreams, derive_keys

FAMILIES = ["fedrl/GridWorld-v0", "fedrl/ArcNavigation-v0", "fedrl/CartPole-v0", "fedrl/Pendulum-v0"]


def _setup(env_id: str):
    family = get_family(env_id)
    params = stack_params(family.train_tasks)
    n = len(family.train_tasks)
    task = family.train_tasks[0]
    policy = (TabularPolicy if "Grid" in env_id else MlpPolicy)(family.observation_space(task), family.action_space(task))
    noise = torch.randn(n, policy.theta.numel(), generator=torch.Generator().manual_seed(0))
    theta = policy.theta.detach().expand(n, -1).clone() + 0.3 * noise
    return family, params, policy, theta, n


def _streams(n: int) -> RandomStreams:
    return RandomStreams(derive_keys(0, torch.arange(n)))


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("stop_when_done", [False, True])
@pytest.mark.parametrize("env_id", FAMILIES)
def test_captured_equals_eager_bitwise_with_eager_operations(env_id, stop_when_done, one_thread):
    family, params, policy, theta, n = _setup(env_id)
    horizon = min(family.horizon(params), 60)
    eager_streams, captured_streams = _streams(n), _streams(n)
    eager = generic_rollout(family, params, policy, theta, eager_streams, 6, horizon, stop_when_done)
    runner = CapturedRollout(family, policy, backend="aot_eager", chunk=16)
    captured = runner(params, theta, captured_streams, 6, horizon, stop_when_done)
    for name, a, b in zip(eager._fields, eager, captured, strict=True):
        assert a.shape == b.shape and torch.equal(a, b), name
    assert torch.equal(eager_streams.counters, captured_streams.counters)
    again = runner(params, theta, captured_streams, 6, horizon, stop_when_done)  # the compiled step is kept
    assert torch.equal(again.rewards, generic_rollout(family, params, policy, theta, eager_streams, 6, horizon, stop_when_done).rewards)


def test_stop_when_done_keeps_the_steps_eager_runs(one_thread):
    # CartPole's episodes end long before its horizon: the captured rollout runs whole chunks and
    # keeps as many steps as the eager one, which stopped early.
    family, params, policy, theta, n = _setup("fedrl/CartPole-v0")
    streams = _streams(n)
    eager = generic_rollout(family, params, policy, theta, _streams(n), 4, family.horizon(params), True)
    captured = CapturedRollout(family, policy, backend="aot_eager", chunk=8)(params, theta, streams, 4, family.horizon(params), True)
    assert captured.rewards.shape[-1] == eager.rewards.shape[-1] < family.horizon(params) + 1
    assert torch.equal(captured.rewards, eager.rewards) and torch.equal(streams.counters, _streams_after_eager(n, family, params, policy, theta))


def _streams_after_eager(n, family, params, policy, theta):
    streams = _streams(n)
    generic_rollout(family, params, policy, theta, streams, 4, family.horizon(params), True)
    return streams.counters


@pytest.mark.parametrize("env_id", FAMILIES)
def test_the_captured_step_is_one_graph(env_id, one_thread):
    family, params, policy, theta, n = _setup(env_id)
    from fedrl_envs.params import repeat_params

    rows = repeat_params(params, 2)
    step = CapturedRollout(family, policy, backend="aot_eager").runner((n,), 2).compiled
    state = family.reset(rows, torch.zeros(2 * n, family.reset_noise_dim))
    streams = _streams(n)
    explanation = torch._dynamo.explain(step._torchdynamo_orig_callable)(state, streams.counters, theta, streams.keys, rows)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("env_id", ["fedrl/GridWorld-v0", "fedrl/CartPole-v0"])
def test_compiled_code_agrees_with_eager(env_id, one_thread):
    family, params, policy, theta, n = _setup(env_id)
    horizon = min(family.horizon(params), 60)
    eager = generic_rollout(family, params, policy, theta, _streams(n), 6, horizon, True)
    captured = CapturedRollout(family, policy)(params, theta, _streams(n), 6, horizon, True)  # inductor
    assert torch.equal(eager.actions, captured.actions) and torch.equal(eager.mask, captured.mask)
    torch.testing.assert_close(captured.obs, eager.obs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(captured.rewards, eager.rewards, rtol=1e-4, atol=1e-4)


def test_auto_is_off_on_the_cpu_and_bad_values_are_refused():
    assert resolve_capture("auto", "cpu") is False and resolve_capture("auto", "cuda") is True
    assert resolve_capture(True, "cpu") is True and resolve_capture(False, "cuda") is False
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="capture must be"):
            check_capture(bad)
    family, params, policy, theta, n = _setup("fedrl/GridWorld-v0")
    with pytest.raises(ValueError, match="capture must be"):
        KernelSampler(family, params, policy, _streams(n), capture="on")
    model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu")
    assert model.capture == "auto"
    with pytest.raises(ValueError, match="capture must be"):
        model.capture = "always"
    model.capture = False
    assert model.federation.sampler.capture is False


class _Untraceable(TabularPolicy):
    """A policy whose sample reads a tensor's value in Python: a graph break, so no capture."""

    def sample(self, theta, obs, streams):
        if float(theta.sum()) > 1e30:
            raise AssertionError
        return super().sample(theta, obs, streams)


def test_what_cannot_be_captured_runs_eager_after_a_warning(one_thread):
    family, params, _, theta, n = _setup("fedrl/GridWorld-v0")
    task = family.train_tasks[0]
    policy = _Untraceable(family.observation_space(task), family.action_space(task))
    streams, eager_streams = _streams(n), _streams(n)
    with pytest.warns(UserWarning, match="could not be captured"):
        assert captured_rollout(family, params, policy, theta, streams, 3, 5, backend="aot_eager") is None
    assert torch.equal(streams.counters, eager_streams.counters)  # nothing drawn by the failed attempt
    sampler = KernelSampler(family, params, policy, streams, capture=True)
    with pytest.warns(UserWarning, match="could not be captured"):
        got = sampler(theta, 3)
    want = KernelSampler(family, params, policy, eager_streams, capture=False)(theta, 3)
    assert torch.equal(got.actions, want.actions) and torch.equal(got.rewards, want.rewards)


def test_a_federation_trains_captured(one_thread):
    eager = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", local_steps=2, seed=0, device="cpu").learn(total_rounds=2)
    model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", local_steps=2, seed=0, device="cpu")
    model.capture = True
    model.learn(total_rounds=2)
    torch.testing.assert_close(model.theta, eager.theta, rtol=1e-5, atol=1e-6)
    assert not torch.equal(model.theta, PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu").theta)


# --- the env's own rollouts: FederatedVecEnv.rollout(capture=...) --------------------------------
def _env(env_id: str, backend: str = "aot_eager"):
    from fedrl_wrappers import FederatedVecEnv

    env = FederatedVecEnv(env_id, 6, autoreset=True, seed=3, kernels="torch")
    env._capture_backend = backend
    return env


def _hash_policy(space):
    from fedrl_algos.bench.vector import _hash_policy as policy

    return policy(space)


@pytest.mark.parametrize("env_id", FAMILIES)
def test_the_envs_captured_rollout_equals_its_eager_rollout(env_id, one_thread):
    # Past GridWorld's, arc navigation's and Pendulum's horizons and CartPole's failures (autoresets).
    eager_env, captured_env = _env(env_id), _env(env_id)
    policy = _hash_policy(eager_env.single_action_space)
    steps = 210 if "Pendulum" in env_id else 70  # Pendulum's episodes end at its time limit, 200
    eager = eager_env.rollout(policy, n_steps=steps, capture=False)
    captured = captured_env.rollout(policy, n_steps=steps, capture=True)
    for name, a, b in zip(eager._fields, eager, captured, strict=True):
        assert torch.equal(a, b), name
    assert bool(eager.terminated.any() | eager.truncated.any())  # autoresets happened inside
    # ... and the environments go on from the same state
    action = policy(eager.last_observations).reshape(eager_env.num_envs, *(eager_env.single_action_space.shape or ()))
    for a, b in zip(eager_env.step(action)[:4], captured_env.step(action)[:4], strict=True):
        assert torch.equal(a, b)


def test_the_envs_captured_rollout_checks_actions_and_falls_back(one_thread):
    env = _env("fedrl/ArcNavigation-v0")
    with pytest.raises(ValueError, match="action"):  # checked once per chunk, as eager checks every step
        env.rollout(lambda obs: torch.full((*obs.shape[:2], 2), float("nan")), n_steps=5, capture=True)
    env = _env("fedrl/GridWorld-v0")
    env.reset()
    before = env.snapshot()
    with pytest.raises(ValueError, match="action"):  # out of range: clamped for the kernel, then refused
        env.rollout(lambda obs: torch.full(obs.shape[:2], 9, dtype=torch.long), n_steps=5, capture=True)
    assert env.snapshot() == before  # a refused rollout leaves the environments as they were

    def untraceable(obs):
        if float(obs.float().sum()) > 1e30:
            raise AssertionError
        return torch.zeros(obs.shape[:2], dtype=torch.long)

    eager_env = _env("fedrl/GridWorld-v0")
    with pytest.warns(UserWarning, match="could not be captured"):
        got = env.rollout(untraceable, n_steps=5, capture=True, seed=1)
    assert torch.equal(got.observations, eager_env.rollout(untraceable, n_steps=5, capture=False, seed=1).observations)


def test_many_policies_and_partial_participation_never_exhaust_recompilation(one_thread):
    # torch.compile allows 8 recompilations per code object: each runner compiles a fresh copy of
    # the step, and new task-parameter objects (partial participation's rows) are inputs, not constants.
    import warnings

    family, params, _, theta, n = _setup("fedrl/GridWorld-v0")
    task = family.train_tasks[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(10):
            policy = TabularPolicy(family.observation_space(task), family.action_space(task))
            assert captured_rollout(family, params, policy, theta, _streams(n), 2, 5, backend="aot_eager") is not None
        model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", local_steps=1, agents_per_round=3, seed=0, device="cpu")
        model.capture = True
        model.learn(total_rounds=10)
    assert not [w for w in seen if "could not be captured" in str(w.message)]
    eager = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", local_steps=1, agents_per_round=3, seed=0, device="cpu").learn(total_rounds=10)
    torch.testing.assert_close(model.theta, eager.theta, rtol=1e-5, atol=1e-6)


def test_a_graph_is_keyed_and_fed_by_everything_a_step_reads_of_its_parameters():
    # A CUDA graph copies its inputs' tensors into static buffers before each replay: the derived
    # quantities a family caches on its parameter object (CartPole's total mass) are among them, and
    # the non-tensor fields (a gridworld's size) key the graph.
    from fedrl_envs.capture import _statics, _tensors

    cartpole = get_family("fedrl/CartPole-v0")
    a, b = (stack_params([cartpole.make_params(length=x)]) for x in (0.5, 0.9))
    fields = [f for f in vars(a) if isinstance(getattr(a, f), torch.Tensor)]
    tensors_a, tensors_b = _tensors((a,)), _tensors((b,))
    assert len(tensors_a) > len(fields)  # the derived quantities too
    assert any(not torch.equal(x, y) for x, y in zip(tensors_a[len(fields):], tensors_b[len(fields):], strict=True))
    grid = get_family("fedrl/GridWorld-v0")
    small, large = (stack_params([grid.make_params(size=n)]) for n in (5, 7))
    assert _statics((small,)) != _statics((large,)) and _statics((small,)) == _statics((stack_params([grid.make_params(size=5)]),))
