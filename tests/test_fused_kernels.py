"""``kernels="numba"``: the fused CPU step (fedrl_envs.fused) against the torch kernels, bit for bit."""

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from fedrl_envs.cartpole import CARTPOLE, accelerations  # noqa: E402
from fedrl_envs.fused import float32_twin, numba_available  # noqa: E402
from fedrl_envs.gridworld import GRIDWORLD  # noqa: E402
from fedrl_envs.vector import FamilyVectorEnv  # noqa: E402
from fedrl_wrappers import FederatedVecEnv  # noqa: E402


def _pair(n_envs=7, horizon=9, **kwargs):
    tasks = [CARTPOLE.make_params(**(CARTPOLE.task_kwargs(t) | {"horizon": horizon})) for t in CARTPOLE.train_tasks[:4]]
    return (FamilyVectorEnv(CARTPOLE, tasks, n_envs=n_envs, seed=2, kernels=k, **kwargs) for k in ("torch", "numba"))


def _assert_same_step(a, b):
    for x, y in zip(a[:4], b[:4], strict=True):
        assert type(y) is type(x) and y.dtype == x.dtype and y.shape == x.shape
        assert np.array_equal(np.asarray(x), np.asarray(y))
    assert a[4].keys() == b[4].keys()
    for key in ("final_obs", "_final_obs", "_final_info"):
        if key in a[4]:
            assert np.array_equal(np.asarray(a[4][key]), np.asarray(b[4][key]))


def _assert_same_env(torch_env, fused_env):
    assert torch.equal(torch_env.state, fused_env.state)
    assert torch.equal(torch_env._t, fused_env._t)
    assert torch.equal(torch_env.streams.counters, fused_env.streams.counters)


@pytest.mark.parametrize("n_envs", [7, 997])  # 997: vectorized loops with a remainder
def test_fused_cartpole_is_bitwise_the_torch_env(n_envs):
    torch_env, fused_env = _pair(n_envs=n_envs)
    assert torch.equal(torch_env.reset()[0], fused_env.reset()[0])
    gen = torch.Generator().manual_seed(0)
    ended = truncated = 0
    for _ in range(45):  # terminations every few steps and several time limits (horizon 9)
        actions = torch.randint(0, 2, (torch_env.num_envs,), generator=gen)
        a, b = torch_env.step(actions), fused_env.step(actions)
        _assert_same_step(a, b)
        _assert_same_env(torch_env, fused_env)
        ended += int(bool(a[4]) and not bool(a[4]["_final_obs"].all()))
        truncated += int(a[3].any())
    assert ended > 5 and truncated >= 4  # partial ends (terminations) and time limits were both exercised


def test_staggered_resets_and_set_state_match():
    torch_env, fused_env = _pair(horizon=30)
    torch_env.reset()
    fused_env.reset()
    gen = torch.Generator().manual_seed(3)
    mask = np.arange(torch_env.num_envs) % 3 == 0
    for k in range(60):
        if k == 5:
            assert torch.equal(torch_env.reset(options={"reset_mask": mask})[0], fused_env.reset(options={"reset_mask": mask})[0])
        if k == 20:
            state = torch.rand(torch_env.num_envs, 4) * 0.4 - 0.2  # row-major: set_state lays it out
            assert torch.equal(torch_env.set_state(state, t=25), fused_env.set_state(state, t=25))
        actions = torch.randint(0, 2, (torch_env.num_envs,), generator=gen)
        _assert_same_step(torch_env.step(actions), fused_env.step(actions))
        _assert_same_env(torch_env, fused_env)


def test_fixed_horizon_mode_and_numpy_arrays_match():
    torch_env, fused_env = _pair(autoreset=False, array_type="numpy")
    obs_a, _ = torch_env.reset(seed=5)
    obs_b, _ = fused_env.reset(seed=5)
    assert isinstance(obs_b, np.ndarray) and np.array_equal(obs_a, obs_b)
    rng = np.random.default_rng(1)
    for _ in range(12):  # past the horizon: truncated stays true, no reset
        actions = rng.integers(0, 2, torch_env.num_envs).astype(np.int32)
        a, b = torch_env.step(actions), fused_env.step(actions)
        _assert_same_step(a, b)
        assert b[4] == {}
        _assert_same_env(torch_env, fused_env)


def test_rejected_actions_leave_the_env_untouched():
    _, env = _pair()
    env.reset()
    env.step(np.ones(env.num_envs, dtype=np.int64))
    before = (env.state.clone(), env._t.clone(), env.streams.counters.clone())
    bad = np.zeros(env.num_envs, dtype=np.int64)
    bad[3] = 2
    with pytest.raises(ValueError, match=r"action must be an int in \[0, 1\], got 2"):
        env.step(bad)
    with pytest.raises(TypeError, match="integer"):
        env.step(np.zeros(env.num_envs, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(env.num_envs + 1, dtype=np.int64))
    assert torch.equal(env.state, before[0]) and torch.equal(env._t, before[1]) and torch.equal(env.streams.counters, before[2])
    env.step(torch.zeros(env.num_envs, dtype=torch.uint8))  # any integer dtype steps


def test_federated_env_and_make_vec_take_numba_kernels():
    torch_env = FederatedVecEnv("fedrl/CartPole-v0", 50, seed=0)
    venv = FederatedVecEnv("fedrl/CartPole-v0", 50, seed=0, kernels="numba")
    assert venv.kernels == "numba" and venv.subset([1, 2]).kernels == "numba"
    assert torch.equal(torch_env.reset()[0], venv.reset()[0])
    gen = torch.Generator().manual_seed(2)
    for _ in range(30):
        actions = torch.randint(0, 2, (venv.num_envs,), generator=gen)
        _assert_same_step(torch_env.step(actions), venv.step(actions))
    made = gym.make_vec("fedrl/CartPole-v0", num_envs=5, vectorization_mode="vector_entry_point", kernels="numba")
    made.reset(seed=0)
    assert made.unwrapped.kernels == "numba"
    made.step(np.zeros(5, dtype=np.int64))


def test_numba_kernels_are_refused_where_they_do_not_apply():
    assert numba_available()
    with pytest.raises(ValueError, match="fused_kernels"):
        FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:1], kernels="numba")
    with pytest.raises(ValueError, match="kernels.*CPU"):
        FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:1], device="meta", kernels="numba")
    with pytest.raises(ValueError, match='"auto", "torch", "numpy" or "numba"'):
        FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:1], kernels="cuda")


def test_float32_twin_computes_in_float32_like_torch():
    # The twin reads the module's Python floats (GRAVITY, FOUR_THIRDS) as float32 constants: on
    # float32 arguments it rounds as torch does on float32 tensors, element by element (computed
    # in float64, as Numba would with the constants left Python floats, nearly every value differs).
    twin = float32_twin(accelerations)
    gen = torch.Generator().manual_seed(4)
    args = [torch.rand(500, generator=gen) * scale + shift for scale, shift in
            [(20, -10), (2, -1), (2, -1), (8, -4), (1, 0.6), (0.2, 0.01), (1, 0.3), (0.5, 0.05)]]
    expected = accelerations(*args)
    for i in range(500):
        got = twin(*(np.float32(a[i].item()) for a in args))
        assert [float(g) for g in got] == [float(e[i]) for e in expected]


def test_fast_step_is_the_kernel_step_bitwise_and_falls_back_where_it_does_not_apply():
    from fedrl_envs.params import repeat_params, stack_params

    params = repeat_params(stack_params(CARTPOLE.train_tasks), 40)
    gen = torch.Generator().manual_seed(5)
    row_major = (torch.rand(400, 4, generator=gen) - 0.5) * torch.tensor([4.8, 4.0, 0.8, 4.0])
    action = torch.randint(0, 2, (400,), generator=gen)
    state = row_major
    for _ in range(5):  # a row-major start (what a rollout resets to), then the components layout
        expected = CARTPOLE.step(state, action, params)
        got = CARTPOLE.fast_step(state, action, params)
        for x, y in zip(expected, got, strict=True):
            assert y.dtype == x.dtype and torch.equal(x, y)
        assert got[0].stride() == (1, 400)  # components, as the torch kernel lays them out
        state = got[0]
    double = row_major.double()  # computed in float64 by the torch kernel: not the float32 loop
    assert torch.equal(CARTPOLE.fast_step(double, action, params)[0], CARTPOLE.step(double, action, params)[0])
    with_grad = row_major.clone().requires_grad_()
    assert CARTPOLE.fast_step(with_grad, action, params)[0].requires_grad


def test_fast_step_falls_back_to_the_kernel_for_what_the_loop_does_not_cover():
    from fedrl_envs.params import repeat_params, stack_params

    gen = torch.Generator().manual_seed(6)
    state = (torch.rand(12, 4, generator=gen) - 0.5) * 0.2
    action = torch.randint(0, 2, (12,), generator=gen)
    one_agent = stack_params(CARTPOLE.train_tasks[:1])  # parameters [1]: broadcast by torch
    cases = [
        (state, action, one_agent),
        (state, action[:1], repeat_params(one_agent, 12)),  # one action for every row
        (state, action, CARTPOLE.make_params(agent=3)),  # one task's 0-d parameters
    ]
    for s, a, p in cases:
        for x, y in zip(CARTPOLE.step(s, a, p), CARTPOLE.fast_step(s, a, p), strict=True):
            assert torch.equal(x, y)
    grad_params = repeat_params(stack_params(CARTPOLE.train_tasks[:1]), 12)
    grad_params = type(grad_params)(**{**grad_params.__dict__, "length": grad_params.length.clone().requires_grad_()})
    assert CARTPOLE.fast_step(state, action, grad_params)[0].requires_grad
    with pytest.raises(RuntimeError):  # the kernel's own shape error, not a read past the array
        CARTPOLE.fast_step(state, torch.zeros(13, dtype=torch.int64), repeat_params(one_agent, 12))


def test_a_subclass_with_its_own_dynamics_is_not_fused():
    class Windy(type(CARTPOLE)):
        def step(self, state, action, params):
            next_state, reward, terminated = super().step(state, action, params)
            return next_state + 0.01, reward, terminated

    windy = Windy()
    assert CARTPOLE.fused_kernels and not windy.fused_kernels
    from fedrl_envs.params import repeat_params, stack_params

    params = repeat_params(stack_params(CARTPOLE.train_tasks[:2]), 3)
    state, action = torch.zeros(6, 4), torch.ones(6, dtype=torch.int64)
    assert torch.equal(windy.fast_step(state, action, params)[0], windy.step(state, action, params)[0])
    with pytest.raises(ValueError, match="fused_kernels"):
        FamilyVectorEnv(windy, CARTPOLE.train_tasks[:1], kernels="numba")


def test_without_a_writable_cache_the_loops_compile_per_process(monkeypatch):
    # A read-only install with no writable home: Numba finds no cache locator and refuses cache=True.
    import numba.core.caching as caching

    from fedrl_envs import fused

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])

    def loop(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] + 1.0

    compiled = fused.compile_loop(loop, {})
    out = np.empty(3)
    compiled(np.zeros(3), out)
    assert out.tolist() == [1.0, 1.0, 1.0]
