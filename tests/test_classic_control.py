"""Tests of the heterogeneous classic-control families ``fedrl/CartPole-v0`` and ``fedrl/Pendulum-v0`` (issue 6).

The reference for the dynamics is Gymnasium itself (``CartPole-v1``, ``Pendulum-v1``), driven from
the same states with the same actions; the heterogeneous physics is checked against closed forms
derived here by hand.

Tolerances. Our environments keep their state and compute in float32; Gymnasium computes in
float64 and rounds only the observation to float32. From the same state, one step therefore
differs by the float32 rounding of a handful of operations: a few float32 ulps, below 1e-5 for
the magnitudes involved (|values| <= ~20). The kernels compute in the dtype of the state, so the
same kernels fed float64 states and float64 parameters agree with Gymnasium to 1e-12: the
physics is identical and the float32 tolerance is rounding only. Termination flags and rewards
must agree exactly (CartPole) or to the same float32 tolerance (Pendulum's reward).

Measured on 5000 random states: CartPole observations differ by at most 2.4e-7 (one float32 ulp),
rewards and flags never; Pendulum observations by at most 1.4e-6 (theta up to 4 pi, where a
float32 ulp is 1e-6) and rewards by 4.7e-6 (|reward| up to 16.3). Float64 kernels: 4e-16.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gym_check_env
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import fedrl_envs
from fedrl_envs import (
    CARTPOLE,
    PENDULUM,
    CartPoleEnv,
    CartPoleParams,
    FamilyVectorEnv,
    PendulumEnv,
    PendulumParams,
    stack_params,
)

CP = "fedrl/CartPole-v0"
PD = "fedrl/Pendulum-v0"
CP_TOL = 1e-6  # float32 CartPole against float64 Gymnasium (module docstring)
PD_TOL = 1e-5  # float32 Pendulum against float64 Gymnasium
EXACT = 1e-12  # float64 kernels against float64 Gymnasium
DOCS = Path(__file__).resolve().parent.parent / "docs" / "envs"


def gym_ref(env_id: str):
    """A Gymnasium original without its wrappers (no time limit: the random-state tests step one
    transition from each of many states), reset once so that it can be stepped from any state."""
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    return env


def random_cartpole_states(n: int, seed: int) -> np.ndarray:
    """float32 states around and beyond the termination thresholds (|x| = 2.4, |theta| = 0.2094)."""
    rng = np.random.default_rng(seed)
    high = np.array([2.6, 3.0, 0.25, 3.0])
    return rng.uniform(-high, high, size=(n, 4)).astype(np.float32)


def random_pendulum_states(n: int, seed: int) -> np.ndarray:
    """float32 states with theta over several turns (Gymnasium lets theta grow) and any legal speed."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-4 * np.pi, 4 * np.pi, n)
    theta_dot = rng.uniform(-8.0, 8.0, n)
    return np.stack([theta, theta_dot], axis=1).astype(np.float32)


def float64_params(family, task, n: int = 1):
    """``task`` stacked ``n`` times with every tensor field as the float64 value of its Gymnasium
    constant (0.1, not the float32 0.1f)."""
    exact = {k: torch.tensor(v, dtype=torch.float64) for k, v in family.task_kwargs(task).items() if k != "horizon"}
    return stack_params([dataclasses.replace(task, **exact)] * n)


# --------------------------------------------------------------------------------------------
# Equivalence with the Gymnasium originals at default parameters
# --------------------------------------------------------------------------------------------
def test_spaces_and_defaults_are_gymnasiums():
    cart, ref = gym.make(CP).unwrapped, gym.make("CartPole-v1").unwrapped
    assert cart.observation_space == ref.observation_space and cart.action_space == ref.action_space
    params = cart.params
    for name in ("length", "masspole", "masscart", "force_mag"):
        assert getattr(params, name).item() == pytest.approx(getattr(ref, name), rel=1e-7), name
    assert params.total_mass.item() == pytest.approx(ref.total_mass, rel=1e-7)
    assert params.polemass_length.item() == pytest.approx(ref.polemass_length, rel=1e-7)
    assert fedrl_envs.cartpole.GRAVITY == ref.gravity and fedrl_envs.cartpole.TAU == ref.tau
    assert fedrl_envs.cartpole.X_THRESHOLD == ref.x_threshold
    assert fedrl_envs.cartpole.THETA_THRESHOLD == ref.theta_threshold_radians
    assert gym.make("CartPole-v1").spec.max_episode_steps == params.horizon + 1

    pend, ref = gym.make(PD).unwrapped, gym.make("Pendulum-v1").unwrapped
    assert pend.observation_space == ref.observation_space and pend.action_space == ref.action_space
    assert (pend.params.mass.item(), pend.params.length.item(), pend.params.gravity.item()) == (ref.m, ref.l, ref.g)
    assert fedrl_envs.pendulum.DT == ref.dt and fedrl_envs.pendulum.MAX_TORQUE == ref.max_torque
    assert fedrl_envs.pendulum.MAX_SPEED == ref.max_speed
    assert gym.make("Pendulum-v1").spec.max_episode_steps == pend.params.horizon + 1


def test_cartpole_matches_gymnasium_transition_for_transition():
    ref, ours = gym_ref("CartPole-v1"), gym.make(CP).unwrapped
    ours.reset(seed=0)
    states = random_cartpole_states(600, seed=1)
    actions = np.random.default_rng(2).integers(0, 2, len(states))
    n_terminated = 0
    for state, action in zip(states, actions):
        ref.state = state.astype(np.float64)
        ref.steps_beyond_terminated = None  # a fresh step, not one after a termination
        ref_obs, ref_reward, ref_term, ref_trunc, _ = ref.step(int(action))
        ours.set_state(state)
        obs, reward, term, trunc, _ = ours.step(int(action))
        assert obs.dtype == np.float32
        np.testing.assert_allclose(obs, ref_obs, rtol=CP_TOL, atol=CP_TOL)
        assert (reward, term, trunc) == (ref_reward, ref_term, ref_trunc)
        n_terminated += term
    assert 100 < n_terminated < 500  # both outcomes were exercised


def test_cartpole_float64_kernel_equals_gymnasium():
    """The same kernel in float64 agrees to 1e-12: the float32 tolerance above is rounding only."""
    ref = gym_ref("CartPole-v1")
    states = random_cartpole_states(300, seed=3).astype(np.float64)
    actions = np.random.default_rng(4).integers(0, 2, len(states))
    expected, expected_term = [], []
    for state, action in zip(states, actions):
        ref.state = state.copy()
        ref.steps_beyond_terminated = None
        expected_term.append(ref.step(int(action))[2])
        expected.append(ref.state.copy())  # the float64 state, before the float32 observation
    params = float64_params(CARTPOLE, CARTPOLE.train_tasks[0], len(states))
    nxt, reward, term = CARTPOLE.step(torch.from_numpy(states), torch.from_numpy(actions), params)
    assert nxt.dtype == torch.float64
    np.testing.assert_allclose(nxt.numpy(), np.array(expected), rtol=EXACT, atol=EXACT)
    assert term.tolist() == expected_term and reward.tolist() == [1.0] * len(states)


def balancing_action(obs: np.ndarray) -> int:
    """A fixed linear policy that balances every default CartPole agent (see the solvability test)."""
    return int(obs @ np.array([0.1, 0.5, 10.0, 2.0]) > 0)


def synced_step(ours, ref, t: int, action):
    """Put both environments into Gymnasium's current state, rounded to float32, at time ``t``; step both.

    The state is written to ``ref.unwrapped`` (an attribute set on Gymnasium's outer wrapper would
    not reach the environment). Returns ``(ours.step(action), ref.step(action))``.
    """
    state = ref.unwrapped.state.astype(np.float32)
    ref.unwrapped.state = state.astype(np.float64)
    ours.set_state(state, t=t)
    return ours.step(action), ref.step(action)


@pytest.mark.parametrize("policy", ["balance", "random"])
def test_cartpole_whole_episodes_match_gymnasium(policy):
    """Whole episodes from Gymnasium's own starts: termination, the 500-step truncation, rewards.

    Before each step both environments are put into the same float32 state (Gymnasium would
    otherwise drift from ours by float32 rounding, amplified by the unstable upright equilibrium).
    """
    rng = np.random.default_rng(5)
    ours = gym.make(CP).unwrapped
    ours.reset(seed=0)
    ref = gym.make("CartPole-v1")
    lengths = []
    for episode in range(3):
        ref_obs, _ = ref.reset(seed=episode)
        for t in range(1000):
            action = balancing_action(ref_obs) if policy == "balance" else int(rng.integers(2))
            (obs, reward, term, trunc, _), (ref_obs, ref_reward, ref_term, ref_trunc, _) = synced_step(ours, ref, t, action)
            np.testing.assert_allclose(obs, ref_obs, rtol=CP_TOL, atol=CP_TOL)
            assert (reward, term, trunc) == (ref_reward, ref_term, ref_trunc), t
            if term or trunc:
                lengths.append(t + 1)
                break
    if policy == "balance":
        assert lengths == [500, 500, 500]
    else:
        assert all(length < 100 for length in lengths)


def test_pendulum_matches_gymnasium_transition_for_transition():
    ref, ours = gym_ref("Pendulum-v1"), gym.make(PD).unwrapped
    ours.reset(seed=0)
    states = random_pendulum_states(600, seed=6)
    torques = np.random.default_rng(7).uniform(-3.0, 3.0, (len(states), 1)).astype(np.float32)  # beyond ±2 too
    for state, torque in zip(states, torques):
        ref.state = state.astype(np.float64)
        ref_obs, ref_reward, ref_term, ref_trunc, _ = ref.step(torque)
        ours.set_state(state)
        obs, reward, term, trunc, _ = ours.step(torque)
        assert obs.dtype == np.float32
        np.testing.assert_allclose(obs, ref_obs, rtol=PD_TOL, atol=PD_TOL)
        assert reward == pytest.approx(ref_reward, rel=PD_TOL, abs=PD_TOL)
        assert (term, trunc) == (ref_term, ref_trunc) == (False, False)


def test_pendulum_float64_kernel_equals_gymnasium():
    ref = gym_ref("Pendulum-v1")
    states = random_pendulum_states(300, seed=8).astype(np.float64)
    torques = np.random.default_rng(9).uniform(-3.0, 3.0, (len(states), 1))
    expected, rewards = [], []
    for state, torque in zip(states, torques):
        ref.state = state.copy()
        rewards.append(ref.step(torque)[1])
        expected.append(ref.state.copy())
    expected = np.array(expected)
    params = float64_params(PENDULUM, PENDULUM.train_tasks[0], len(states))
    nxt, reward, term = PENDULUM.step(torch.from_numpy(states), torch.from_numpy(torques), params)
    np.testing.assert_allclose(reward.numpy(), rewards, rtol=EXACT, atol=EXACT)
    np.testing.assert_allclose(nxt[:, 1].numpy(), expected[:, 1], rtol=EXACT, atol=EXACT)
    # Our theta is wrapped to [-pi, pi]; Gymnasium's grows: equal modulo 2 pi.
    wrapped = (expected[:, 0] + np.pi) % (2 * np.pi) - np.pi
    np.testing.assert_allclose(np.cos(nxt[:, 0].numpy()), np.cos(wrapped), atol=EXACT)
    np.testing.assert_allclose(np.sin(nxt[:, 0].numpy()), np.sin(wrapped), atol=EXACT)
    assert bool((nxt[:, 0].abs() <= math.pi).all()) and not bool(term.any())


def test_pendulum_whole_episodes_match_gymnasium():
    """Whole 200-step episodes from Gymnasium's starts, states re-synchronized before each step."""
    rng = np.random.default_rng(10)
    ours = gym.make(PD).unwrapped
    ours.reset(seed=0)
    ref = gym.make("Pendulum-v1")
    for episode in range(2):
        ref_obs, _ = ref.reset(seed=episode)
        for t in range(200):
            torque = rng.uniform(-2.5, 2.5, 1).astype(np.float32)
            (obs, reward, term, trunc, _), (ref_obs, ref_reward, ref_term, ref_trunc, _) = synced_step(ours, ref, t, torque)
            np.testing.assert_allclose(obs, ref_obs, rtol=PD_TOL, atol=PD_TOL)
            assert reward == pytest.approx(ref_reward, rel=PD_TOL, abs=PD_TOL)
            assert (term, trunc) == (ref_term, ref_trunc), t
        assert trunc


def test_start_states_follow_gymnasium():
    venv = FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks, n_envs=400, seed=0)
    obs, _ = venv.reset()
    assert obs.shape == (4000, 4) and obs.dtype == torch.float32
    assert float(obs.min()) >= -0.05 and float(obs.max()) < 0.05
    # uniform on [-0.05, 0.05): mean 0, standard deviation 0.1 / sqrt(12)
    assert obs.mean(0).abs().max() < 5 * 0.1 / math.sqrt(12) / math.sqrt(4000)
    np.testing.assert_allclose(obs.std(0).numpy(), 0.1 / math.sqrt(12), rtol=0.05)

    venv = FamilyVectorEnv(PENDULUM, PENDULUM.train_tasks, n_envs=400, seed=0)
    venv.reset()
    theta, theta_dot = venv.state.unbind(-1)
    assert float(theta.min()) >= -math.pi and float(theta.max()) < math.pi
    assert float(theta_dot.min()) >= -1.0 and float(theta_dot.max()) < 1.0
    np.testing.assert_allclose(theta.std().item(), 2 * math.pi / math.sqrt(12), rtol=0.05)
    np.testing.assert_allclose(theta_dot.std().item(), 2 / math.sqrt(12), rtol=0.05)


# --------------------------------------------------------------------------------------------
# Heterogeneous physics
# --------------------------------------------------------------------------------------------
def cartpole_step(state, action, **kwargs):
    """One float64 kernel step of the task ``kwargs`` (float64 parameters: exact closed forms)."""
    params = float64_params(CARTPOLE, CARTPOLE.make_params(**kwargs))
    nxt, reward, term = CARTPOLE.step(torch.tensor([state], dtype=torch.float64), torch.tensor([action]), params)
    return nxt[0], term[0]


@pytest.mark.parametrize("theta", [0.05, 0.15, -0.1])
def test_longer_pole_turns_slower(theta):
    """From rest, the angular acceleration scales as 1/length (the rod's inertia and lever arm)."""
    accel = {}
    for length in (0.25, 0.5, 1.0, 2.0):
        nxt, _ = cartpole_step([0.0, 0.0, theta, 0.0], 1, length=length)
        accel[length] = (nxt[3] / fedrl_envs.cartpole.TAU).item()
    for length, a in accel.items():
        assert a * length == pytest.approx(accel[0.5] * 0.5, rel=1e-12)
    assert abs(accel[2.0]) < abs(accel[1.0]) < abs(accel[0.5]) < abs(accel[0.25])


@pytest.mark.parametrize(("masspole", "masscart", "force_mag", "length"), [
    (0.1, 1.0, 10.0, 0.5), (0.3, 0.7, 4.0, 0.25), (0.05, 2.0, 15.0, 1.2), (1.0, 0.2, 7.0, 0.4),
])
def test_cart_accelerations_at_upright_rest_match_the_closed_form(masspole, masscart, force_mag, length):
    """Upright and at rest, the pushed cart moves as if it weighed masscart + masspole/4.

    From the equations of motion with theta = theta_dot = 0 (derived by hand):
    x_acc = F / (masscart + masspole / 4) and theta_acc = -3 F / (length (4 masscart + masspole)).
    """
    tau = fedrl_envs.cartpole.TAU
    for action, force in ((1, force_mag), (0, -force_mag)):
        nxt, term = cartpole_step([0.0, 0.0, 0.0, 0.0], action, masspole=masspole, masscart=masscart,
                                  force_mag=force_mag, length=length)
        assert nxt[1].item() / tau == pytest.approx(force / (masscart + masspole / 4), rel=1e-12)
        assert nxt[3].item() / tau == pytest.approx(-3 * force / (length * (4 * masscart + masspole)), rel=1e-12)
        assert nxt[0].item() == 0.0 and nxt[2].item() == 0.0 and not term  # Euler: positions use old velocities


def test_gravity_part_of_cartpole_does_not_depend_on_the_force():
    """The mean of the two actions' angular accelerations is the unforced fall, whatever force_mag."""
    means = []
    for force_mag in (2.0, 10.0, 30.0):
        left, _ = cartpole_step([0.0, 0.0, 0.1, 0.0], 0, force_mag=force_mag)
        right, _ = cartpole_step([0.0, 0.0, 0.1, 0.0], 1, force_mag=force_mag)
        means.append((left[3] + right[3]).item() / 2)
    assert means == pytest.approx([means[0]] * 3, rel=1e-12)
    gravity, length, masspole, total_mass = 9.8, 0.5, 0.1, 1.1
    unforced = gravity * math.sin(0.1) / (length * (4 / 3 - masspole * math.cos(0.1) ** 2 / total_mass))
    assert means[0] / fedrl_envs.cartpole.TAU == pytest.approx(unforced, rel=1e-12)


def pendulum_step(state, torque, **kwargs):
    params = float64_params(PENDULUM, PENDULUM.make_params(**kwargs))
    nxt, reward, _ = PENDULUM.step(
        torch.tensor([state], dtype=torch.float64), torch.tensor([[torque]], dtype=torch.float64), params
    )
    return nxt[0], reward[0].item()


@pytest.mark.parametrize(("mass", "length", "gravity"), [(1.0, 1.0, 10.0), (0.5, 2.0, 9.81), (2.0, 0.6, 3.7)])
def test_pendulum_accelerations_match_the_uniform_rod(mass, length, gravity):
    """theta_acc = 3 g / (2 l) sin(theta) + 3 u / (m l^2) for a uniform rod hinged at one end."""
    dt = fedrl_envs.pendulum.DT
    # horizontal, no torque: gravity alone
    nxt, _ = pendulum_step([math.pi / 2, 0.0], 0.0, mass=mass, length=length, gravity=gravity)
    assert nxt[1].item() / dt == pytest.approx(min(3 * gravity / (2 * length), 8.0 / dt), rel=1e-12)
    # upright, torque alone
    nxt, reward = pendulum_step([0.0, 0.0], 1.5, mass=mass, length=length, gravity=gravity)
    assert nxt[1].item() / dt == pytest.approx(3 * 1.5 / (mass * length**2), rel=1e-12)
    assert nxt[0].item() == pytest.approx(nxt[1].item() * dt, rel=1e-12)  # theta moves with the new speed
    assert reward == pytest.approx(-0.001 * 1.5**2, rel=1e-12)


def test_pendulum_heavier_longer_weaker_gravity_is_slower():
    def speed_after(**kwargs):
        return pendulum_step([1.0, 0.0], 1.0, **kwargs)[0][1].item()

    base = speed_after()
    assert speed_after(mass=2.0) < base  # the same torque turns a heavier rod less
    assert speed_after(length=1.5) < base  # longer: more inertia, less gravity per inertia
    assert speed_after(gravity=5.0) < base
    assert speed_after(gravity=15.0) > base


def test_pendulum_clips_torque_then_speed_like_gymnasium():
    dt = fedrl_envs.pendulum.DT
    clipped, r_clipped = pendulum_step([0.3, 1.0], 2.0)
    beyond, r_beyond = pendulum_step([0.3, 1.0], 7.0)
    assert torch.equal(beyond, clipped) and r_beyond == r_clipped  # the clipped torque is also the one charged
    assert r_clipped == pytest.approx(-(0.3**2 + 0.1 * 1.0 + 0.001 * 4.0), rel=1e-12)
    fast, _ = pendulum_step([0.5, 7.9], 2.0)
    assert fast[1].item() == 8.0 and fast[0].item() == pytest.approx(0.5 + 8.0 * dt, rel=1e-12)


# --------------------------------------------------------------------------------------------
# Derived constants come from the fields
# --------------------------------------------------------------------------------------------
def test_derived_constants_follow_the_fields():
    fields = {f.name for f in dataclasses.fields(CartPoleParams)}
    assert fields == {"length", "masspole", "masscart", "force_mag", "horizon"}  # nothing derived is stored
    task = CARTPOLE.make_params(masspole=0.3, length=0.7, masscart=2.0)
    assert task.polemass_length.item() == pytest.approx(0.3 * 0.7, rel=1e-6)  # not 0.3 + 0.7
    assert task.total_mass.item() == pytest.approx(2.3, rel=1e-6)
    changed = dataclasses.replace(task, masspole=torch.tensor(0.9))
    assert changed.polemass_length.item() == pytest.approx(0.9 * 0.7, rel=1e-6)
    assert changed.total_mass.item() == pytest.approx(2.9, rel=1e-6)
    # ... and the dynamics see the change: stepping the replaced parameters equals making them afresh
    state, action = torch.tensor([[0.1, -0.2, 0.05, 0.3]]), torch.tensor([1])
    remade = CARTPOLE.make_params(masspole=0.9, length=0.7, masscart=2.0)
    assert torch.equal(CARTPOLE.step(state, action, stack_params([changed]))[0],
                       CARTPOLE.step(state, action, stack_params([remade]))[0])
    assert not torch.equal(CARTPOLE.step(state, action, stack_params([task]))[0],
                           CARTPOLE.step(state, action, stack_params([remade]))[0])
    stacked = stack_params(CARTPOLE.train_tasks)
    torch.testing.assert_close(stacked.polemass_length, stacked.masspole * stacked.length)
    torch.testing.assert_close(stacked.total_mass, stacked.masspole + stacked.masscart)

    assert {f.name for f in dataclasses.fields(PendulumParams)} == {"mass", "length", "gravity", "horizon"}
    rod = PENDULUM.make_params(mass=2.0, length=0.5, gravity=4.0)
    assert rod.inertia.item() == pytest.approx(2.0 * 0.25 / 3, rel=1e-6)
    assert rod.gravity_torque.item() == pytest.approx(2.0 * 4.0 * 0.5 / 2, rel=1e-6)
    heavier = dataclasses.replace(rod, mass=torch.tensor(3.0))
    assert heavier.inertia.item() == pytest.approx(3.0 * 0.25 / 3, rel=1e-6)
    assert heavier.gravity_torque.item() == pytest.approx(3.0 * 4.0 * 0.5 / 2, rel=1e-6)


# --------------------------------------------------------------------------------------------
# The default populations
# --------------------------------------------------------------------------------------------
def docstring_table(env_cls) -> list[list[float]]:
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", inspect.cleandoc(env_cls.__doc__), flags=re.MULTILINE)
    return [[float(v) for v in values.split(" | ")] for _, values in rows]


@pytest.mark.parametrize(("family", "env_cls", "names", "spread"), [
    (CARTPOLE, CartPoleEnv, ("length", "masspole", "masscart", "force_mag"), 0.5),
    (PENDULUM, PendulumEnv, ("mass", "length", "gravity"), 0.2),
])
def test_default_population_is_the_documented_design(family, env_cls, names, spread):
    tasks = family.train_tasks
    assert len(tasks) == 10
    values = [[getattr(t, n).item() for n in names] for t in tasks]
    np.testing.assert_allclose(values, docstring_table(env_cls), rtol=1e-7)  # the documented table
    np.testing.assert_allclose(values[0], [getattr(family.make_params(), n).item() for n in names])
    defaults = np.array(values[0])
    factors = np.array(values) / defaults
    assert factors.min() == pytest.approx(1 - spread) and factors.max() == pytest.approx(1 + spread)
    for column in factors.T:  # every parameter takes each of the 5 levels twice
        assert sorted(np.unique(column.round(6), return_counts=True)[1].tolist()) == [2] * 5
    for a, b in itertools.combinations(range(10), 2):  # two agents share at most one parameter value
        assert np.isclose(factors[a], factors[b]).sum() <= 1
    for k in range(10):
        assert family.task_kwargs(gym.make(family.env_id, agent=k).unwrapped.params) == family.task_kwargs(tasks[k])


def test_keywords_override_the_chosen_agent_and_round_trip():
    task = CARTPOLE.make_params(agent=3, force_mag=4.0)
    assert (task.length.item(), task.force_mag.item()) == (0.25, 4.0)
    assert CARTPOLE.task_kwargs(CARTPOLE.make_params(length=0.8)) == {
        "length": 0.8, "masspole": 0.1, "masscart": 1.0, "force_mag": 10.0, "horizon": 499
    }
    for family in (CARTPOLE, PENDULUM):
        for task in family.train_tasks:
            again = family.make_params(**family.task_kwargs(task))
            for f in dataclasses.fields(task):
                a, b = getattr(task, f.name), getattr(again, f.name)
                assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_one_linear_policy_balances_every_default_cartpole_agent():
    """The default population is solvable by one shared policy (what a federation has to find)."""
    venv = FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks, n_envs=8, seed=0, autoreset=False)
    obs, _ = venv.reset()
    gain = torch.tensor([0.1, 0.5, 10.0, 2.0])
    ever_terminated = torch.zeros(venv.num_envs, dtype=torch.bool)
    for _ in range(500):
        obs, _, terminated, truncated, _ = venv.step((obs @ gain > 0).long())
        ever_terminated |= terminated
    assert not bool(ever_terminated.any()) and bool(truncated.all())


def test_energy_pumping_swings_up_every_default_pendulum_agent():
    venv = FamilyVectorEnv(PENDULUM, PENDULUM.train_tasks, n_envs=4, seed=0, autoreset=False)
    venv.reset()
    venv.set_state(torch.tensor([[math.pi, 0.0]]).repeat(venv.num_envs, 1))  # hanging down, at rest
    p = venv.params
    upright = torch.zeros(venv.num_envs)
    for t in range(200):
        theta, theta_dot = venv.state.unbind(-1)
        energy = 0.5 * p.inertia * theta_dot**2 + p.gravity_torque * torch.cos(theta)
        pump = 2.0 * torch.where(theta_dot >= 0, 1.0, -1.0) * torch.sign(p.gravity_torque - energy)
        hold = -(p.inertia * (40 * theta + 10 * theta_dot) + p.gravity_torque * torch.sin(theta))
        torque = torch.where(torch.cos(theta) > 0.85, hold, pump).clamp(-2, 2)
        obs, *_ = venv.step(torque[:, None])
        if t >= 150:
            upright += (obs[:, 0] > 0.99).float()
    assert bool((upright == 50).all())


# --------------------------------------------------------------------------------------------
# Registration, checkers, vector env
# --------------------------------------------------------------------------------------------
def test_registered_with_both_entry_points():
    for env_id, family, env_cls in ((CP, CARTPOLE, CartPoleEnv), (PD, PENDULUM, PendulumEnv)):
        assert fedrl_envs.FAMILIES[env_id] is family and fedrl_envs.get_family(env_id) is family
        spec = gym.spec(env_id)
        assert spec.entry_point is not None and spec.vector_entry_point is not None
        assert isinstance(gym.make(env_id).unwrapped, env_cls)
        venv = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", agent=2)
        assert isinstance(venv, FamilyVectorEnv) and venv.num_envs == 3
        assert venv.single_observation_space == gym.make(env_id).observation_space
        assert venv.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert venv.horizon == family.train_tasks[2].horizon


CHECKED = [
    (CP, {}), (CP, {"agent": 3}), (CP, {"agent": 9}), (CP, {"length": 1.2, "force_mag": 3.0, "horizon": 50}),
    (PD, {}), (PD, {"agent": 4}), (PD, {"agent": 7}), (PD, {"mass": 0.3, "gravity": 1.6, "horizon": 20}),
]


def ignore_gymnasiums_own_space_warnings() -> None:
    """Any checker warning fails, except the two that Gymnasium's own originals raise as well:
    CartPole's infinite velocity bounds and Pendulum's torque range [-2, 2] (not [-1, 1])."""
    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", message=r".*A Box observation space (minimum|maximum) value is -?infinity")
    warnings.filterwarnings("ignore", message=r".*symmetric and normalized (Box action )?space")


@pytest.mark.parametrize(("env_id", "kwargs"), CHECKED)
def test_gymnasium_check_env(env_id, kwargs):
    with warnings.catch_warnings():
        ignore_gymnasiums_own_space_warnings()
        gym_check_env(gym.make(env_id, **kwargs).unwrapped)


@pytest.mark.parametrize(("env_id", "kwargs"), CHECKED)
def test_sb3_check_env(env_id, kwargs):
    with warnings.catch_warnings():
        ignore_gymnasiums_own_space_warnings()
        sb3_check_env(gym.make(env_id, **kwargs), warn=True)


@pytest.mark.parametrize("family", [CARTPOLE, PENDULUM])
def test_vector_env_agrees_with_single_envs(family):
    """Every row of a 10-agent native vector env steps like that agent's single env, over many steps."""
    venv = FamilyVectorEnv(family, family.train_tasks, n_envs=3, seed=0, autoreset=False)
    venv.reset()
    singles = [gym.make(family.env_id, agent=k).unwrapped for k in range(10)]
    for env in singles:
        env.reset(seed=0)
    rng = np.random.default_rng(11)
    for _ in range(5):
        if family is CARTPOLE:
            states = random_cartpole_states(venv.num_envs, int(rng.integers(1000)))
            actions = rng.integers(0, 2, venv.num_envs)
        else:
            states = random_pendulum_states(venv.num_envs, int(rng.integers(1000)))
            actions = rng.uniform(-2.5, 2.5, (venv.num_envs, 1)).astype(np.float32)
        venv.set_state(states)
        obs, reward, terminated, truncated, _ = venv.step(actions)
        for row in range(venv.num_envs):
            env = singles[row // venv.n_envs]
            env.set_state(states[row])
            s_obs, s_reward, s_term, s_trunc, _ = env.step(actions[row] if family is PENDULUM else int(actions[row]))
            # batched and single-row float32 math may round a transcendental differently by an ulp
            np.testing.assert_allclose(obs[row].numpy(), s_obs, rtol=1e-6, atol=1e-6)
            assert reward[row].item() == pytest.approx(s_reward, rel=1e-6, abs=1e-6)
            assert (bool(terminated[row]), bool(truncated[row])) == (s_term, s_trunc)


@pytest.mark.parametrize("env_id", [CP, PD])
def test_single_env_equals_agent_zero_of_a_vector_env_seeded_alike(env_id):
    """The single env (NumPy kernels) and agent 0 of a vector env (torch kernels) seeded alike.

    Start states are bitwise equal: the same counter-based random numbers, and the reset kernels
    are float32 ``+ - *`` only. Transitions (and Pendulum's observations, ``cos``/``sin`` of the
    angle) agree to one float32 ulp, not bitwise: NumPy and torch
    round ``sin``/``cos`` of about 5% of float32 arguments differently by one ulp
    (:mod:`fedrl_envs.ops`), so each step starts both from the single env's state and is compared
    to 1e-6 (measured: at most 6e-8).
    """
    family = fedrl_envs.get_family(env_id)
    env = gym.make(env_id).unwrapped
    venv = FamilyVectorEnv(family, [family.train_tasks[0]], n_envs=1, seed=123)
    obs, _ = env.reset(seed=123)
    v_obs, _ = venv.reset()
    assert torch.equal(venv.state[0], env.state)
    np.testing.assert_allclose(v_obs[0].numpy(), obs, rtol=1e-6, atol=1e-6)
    rng = np.random.default_rng(0)
    n_resets = 0
    for _ in range(300):
        venv.set_state(env.state[None], t=env._t)  # the same start for this transition
        action = int(rng.integers(2)) if env_id == CP else rng.uniform(-2, 2, 1).astype(np.float32)
        obs, reward, term, trunc, _ = env.step(action)
        v_obs, v_reward, v_term, v_trunc, info = venv.step(np.array([action]))
        assert (bool(v_term[0]), bool(v_trunc[0])) == (term, trunc)
        assert v_reward[0].item() == pytest.approx(reward, rel=1e-6, abs=1e-6)
        if term or trunc:
            np.testing.assert_allclose(info["final_obs"][0].numpy(), obs, rtol=1e-6, atol=1e-6)
            obs, _ = env.reset()
            n_resets += 1
            assert torch.equal(venv.state[0], env.state)  # the next start: bitwise
        np.testing.assert_allclose(v_obs[0].numpy(), obs, rtol=1e-6, atol=1e-6)
    assert n_resets >= 1 if env_id == PD else n_resets >= 5


def test_cartpole_autoreset_with_terminations_at_different_times():
    venv = FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:2], n_envs=2, seed=0)
    venv.reset()
    start = torch.tensor([
        [2.39, 3.0, 0.0, 0.0],  # agent 0, pushed right: leaves the track in the first step
        [2.30, 2.0, 0.0, 0.0],  # agent 0, pushed right: at 2.34, 2.38, then 2.43 > 2.4
        [0.0, 0.0, 0.19, 0.5],  # agent 1, pushed left: at 0.2 rad, then past 12 degrees (0.2094)
        [0.0, 0.0, 0.0, 0.0],  # agent 1, pushed right: stays up
    ])
    venv.set_state(start, t=torch.tensor([5, 0, 0, 7]))
    actions = torch.tensor([1, 1, 0, 1])
    expected_done = [[True, False, False, False], [False, False, True, False], [False, True, False, False]]
    prev = start.clone()
    for step, done_now in enumerate(expected_done):
        obs, reward, terminated, truncated, info = venv.step(actions)
        assert terminated.tolist() == done_now and not bool(truncated.any()), step
        assert reward.tolist() == [1.0] * 4  # the terminating step is rewarded too
        done = torch.tensor(done_now)
        assert info["_final_obs"].tolist() == done_now
        final = info["final_obs"][done]
        assert bool(((final[:, 0].abs() > 2.4) | (final[:, 2].abs() > 0.2094)).all())
        # the terminal observation is one Euler step from the previous state
        np.testing.assert_allclose(final[:, 0].numpy(), (prev[done, 0] + 0.02 * prev[done, 1]).numpy(), rtol=1e-6)
        np.testing.assert_allclose(final[:, 2].numpy(), (prev[done, 2] + 0.02 * prev[done, 3]).numpy(), rtol=1e-6)
        assert bool((obs[done].abs() <= 0.05).all())  # already the start of the next episode
        assert bool((obs[~done] != prev[~done]).any(dim=1).all())  # the others move on
        prev = obs.clone()


def test_federated_vec_env_runs_the_families_natively():
    from fedrl_wrappers import FederatedVecEnv

    for env_id, action in ((CP, lambda n: torch.randint(0, 2, (n,))), (PD, lambda n: torch.rand(n, 1) * 4 - 2)):
        venv = FederatedVecEnv(env_id, n_envs=2, seed=0)
        assert venv.backend == "native" and venv.n_agents == 10 and venv.num_envs == 20
        obs, _ = venv.reset()
        for _ in range(30):
            obs, reward, terminated, truncated, info = venv.step(action(venv.num_envs))
        assert obs.shape[0] == 20 and reward.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("env_id", "name"), [
    (CP, "length"), (CP, "masspole"), (CP, "masscart"), (CP, "force_mag"),
    (PD, "mass"), (PD, "length"), (PD, "gravity"),
])
@pytest.mark.parametrize("value", [0.0, -0.5, -3, float("nan"), float("inf"), 1e-60, 1e60])
def test_non_positive_or_non_finite_parameters_raise_naming_the_argument(env_id, name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number > 0"):
        gym.make(env_id, **{name: value})


@pytest.mark.parametrize("env_id", [CP, PD])
def test_bad_argument_types_and_ranges(env_id):
    name = "length"
    for value in ("0.5", True, [0.5], None.__class__):
        with pytest.raises(TypeError, match=name):
            gym.make(env_id, **{name: value})
    with pytest.raises(ValueError, match=r"agent must be in \[0, 9\], got 10"):
        gym.make(env_id, agent=10)
    with pytest.raises(ValueError, match="horizon"):
        gym.make(env_id, horizon=-1)
    assert gym.make(env_id, length=np.float32(0.7)).unwrapped.params.length.item() == pytest.approx(0.7)
    assert gym.make(env_id, length=torch.tensor(0.7)).unwrapped.params.length.item() == pytest.approx(0.7)


def test_bad_actions_and_states():
    cart = gym.make(CP).unwrapped
    cart.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must be an int in \[0, 1\], got 2"):
        cart.step(2)
    with pytest.raises(TypeError, match="integer"):
        cart.step(1.0)
    with pytest.raises(ValueError, match="state"):
        cart.set_state([0.0, 0.0, float("nan"), 0.0])
    with pytest.raises(ValueError, match="state"):
        cart.set_state([5.0, 0.0, 0.0, 0.0])  # outside the observation bounds

    pend = gym.make(PD).unwrapped
    pend.reset(seed=0)
    for bad in ([float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match="action must be finite"):
            pend.step(np.array(bad, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        pend.step(np.array([1.0, 1.0], dtype=np.float32))
    with pytest.raises(TypeError):
        pend.step(np.array([True]))
    assert pend.step(np.array([1], dtype=np.int64))[0].shape == (3,)  # integers are numbers
    with pytest.raises(ValueError, match="theta_dot"):
        pend.set_state([0.0, 9.0])
    venv = FamilyVectorEnv(PENDULUM, PENDULUM.train_tasks[:2], n_envs=2, seed=0)
    venv.reset()
    with pytest.raises(ValueError, match="shape"):
        venv.step(torch.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        venv.step(torch.tensor([[0.0], [float("nan")], [0.0], [0.0]]))


# --------------------------------------------------------------------------------------------
# Docs
# --------------------------------------------------------------------------------------------
def render_page(env_cls) -> str:
    """The family page: title, generation note, then the class docstring (as tests/test_envs_docs.py)."""
    title = f"# {env_cls.__name__} (`{env_cls.family.env_id}`)"
    note = (
        f"<!-- Generated from the docstring of {env_cls.__module__}.{env_cls.__qualname__} "
        "by `python tests/test_classic_control.py`; edit the docstring, not this page. -->"
    )
    return f"{title}\n\n{note}\n\n{inspect.cleandoc(env_cls.__doc__)}\n"


PAGES = {"cartpole.md": CartPoleEnv, "pendulum.md": PendulumEnv}


@pytest.mark.parametrize(("page", "env_cls"), PAGES.items())
def test_family_page_is_the_class_docstring(page, env_cls):
    headings = re.findall(r"^## (.+)$", inspect.cleandoc(env_cls.__doc__), flags=re.MULTILINE)
    assert headings == ["Description", "Action Space", "Observation Space", "Rewards", "Starting State",
                        "Episode End", "Arguments", "Version History"]
    text = (DOCS / page).read_text(encoding="utf-8")
    assert text == render_page(env_cls), f"docs/envs/{page} is stale: run `python tests/test_classic_control.py`"


if __name__ == "__main__":
    for page, env_cls in PAGES.items():
        (DOCS / page).write_text(render_page(env_cls), encoding="utf-8")
        print(f"wrote {DOCS / page}")
