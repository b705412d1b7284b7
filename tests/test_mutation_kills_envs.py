"""Tests written to kill the mutants that survived the env-kernel mutation runs (docs/testing.md).

Each test pins the values of a kernel against an independent computation: hand-written gridworld
cells, plain-Python arc-navigation geometry, and Gymnasium's CartPole and Pendulum equations
re-computed on Python floats.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrl_envs.arc_navigation import ArcNavigationFamily
from fedrl_envs.cartpole import CartPoleFamily, CartPoleParams
from fedrl_envs.gridworld import GridWorldFamily, GridWorldParams, _move
from fedrl_envs.pendulum import PendulumFamily, PendulumParams, angle_normalize

# --- gridworld -----------------------------------------------------------------------------------

# Hand-written moves: action 0 = up (y - 1), 1 = down (y + 1), 2 = left (x - 1), 3 = right (x + 1).
_HAND_MOVES = {0: (0, -1), 1: (0, 1), 2: (-1, 0), 3: (1, 0)}


def _hand_next_cell(x: int, y: int, action: int, size: int) -> int:
    dx, dy = _HAND_MOVES[action]
    nx = min(max(x + dx, 0), size - 1)
    ny = min(max(y + dy, 0), size - 1)
    return ny * size + nx


@pytest.mark.parametrize("size", [2, 3, 4])
def test_gridworld_step_table_matches_hand_written_cells(size):
    family = GridWorldFamily()
    params = family.make_params(goal=(size - 1, 0), size=size)
    states = torch.arange(size * size).repeat_interleave(4)
    actions = torch.arange(4).repeat(size * size)
    next_state, reward, done = family.step(states, actions, params)
    expected = [_hand_next_cell(int(s) % size, int(s) // size, int(a), size) for s, a in zip(states, actions)]
    assert next_state.tolist() == expected
    goal = size - 1  # cell (size - 1, 0)
    assert reward.dtype == torch.float32
    assert reward.tolist() == [1.0 if int(s) == goal else 0.0 for s in states]
    assert done.dtype == torch.bool and not bool(done.any())
    table = family.next_state_table(params)
    assert table.tolist() == [[_hand_next_cell(s % size, s // size, a, size) for a in range(4)] for s in range(size * size)]


def test_gridworld_step_on_a_non_square_goal_and_batched_params():
    # Goal (1, 2) on a 3x3 grid is cell 7; a stack of two goals must use each its own.
    family = GridWorldFamily()
    p = family.make_params(goal=(1, 2), size=3)
    _, reward, _ = family.step(torch.tensor([7, 5, 3]), torch.tensor([0, 0, 0]), p)
    assert reward.tolist() == [1.0, 0.0, 0.0]
    assert p.goal_index.item() == 7
    rewards = family.reward_vector(p)
    assert rewards.tolist() == [0.0] * 7 + [1.0, 0.0]
    mu = family.start_distribution(p)
    assert mu.tolist() == [1 / 8] * 7 + [0.0, 1 / 8]
    P = family.transition_tensor(p)
    assert P.shape == (9, 4, 9) and P.dtype == torch.float64
    assert P[4].argmax(-1).tolist() == [1, 7, 3, 5]  # from the centre: up, down, left, right
    assert P[0].argmax(-1).tolist() == [0, 3, 0, 1]  # corner (0, 0): up and left hit walls


@pytest.mark.parametrize(("goal", "u", "expected"), [
    # size 3: 8 non-goal cells, index floor(8 u) clipped to 7, then the goal cell skipped.
    ((0, 0), 0.0, 1),
    ((0, 0), 0.124, 1),
    ((0, 0), 0.125, 2),
    ((0, 0), 0.999, 8),
    ((0, 0), 1.0, 8),  # clipped: never past the last cell
    ((2, 2), 0.0, 0),
    ((2, 2), 0.999, 7),
    ((2, 2), 1.0, 7),
    ((1, 1), 0.499, 3),  # index 3 is below the goal (cell 4)
    ((1, 1), 0.5, 5),  # index 4 equals the goal: skipped to 5
    ((1, 1), 0.625, 6),
])
def test_gridworld_reset_index_boundaries(goal, u, expected):
    family = GridWorldFamily()
    params = family.make_params(goal=goal, size=3)
    state = family.reset(params, torch.tensor([[u]], dtype=torch.float64))
    assert state.tolist() == [expected]
    assert state.dtype == torch.int64


def test_gridworld_reset_uses_float64_products():
    # The kernel scales the noise in float64 whatever its dtype: the float32 just below 11/24 times
    # 24 is 10.99999... (cell index 10), while the same product in float32 rounds up to 11.
    family = GridWorldFamily()
    params = family.make_params(goal=(4, 4), size=5)  # 24 non-goal cells, the goal is the last one
    u = torch.tensor([[np.nextafter(np.float32(11 / 24), np.float32(0))]], dtype=torch.float32)
    assert float(u) * 24 < 11 and float(u.float() * 24) == 11.0  # the premise of the test
    assert family.reset(params, u).tolist() == [10]


def test_gridworld_move_rule_against_hand_written_cells():
    # _move builds the cached step table; checked by itself so that a cached table cannot hide it.
    size = 4
    cells = torch.arange(size * size).repeat_interleave(4)
    actions = torch.arange(4).repeat(size * size)
    expected = [_hand_next_cell(int(c) % size, int(c) // size, int(a), size) for c, a in zip(cells, actions)]
    assert _move(cells, actions, size).tolist() == expected


def test_gridworld_next_state_table_of_a_batch_of_goals():
    family = GridWorldFamily()
    goals = torch.tensor([[[0, 0], [2, 1]], [[1, 2], [2, 2]]])
    params = GridWorldParams(goal=goals, size=3)
    table = family.next_state_table(params)
    assert table.shape == (2, 2, 9, 4)
    hand = [[_hand_next_cell(s % 3, s // 3, a, 3) for a in range(4)] for s in range(9)]
    assert table.tolist() == [[hand, hand], [hand, hand]]
    rewards = family.reward_vector(params)
    assert rewards.shape == (2, 2, 9)
    assert rewards.argmax(-1).tolist() == [[0, 5], [7, 8]]
    assert rewards.sum(-1).tolist() == [[1.0, 1.0], [1.0, 1.0]]


# --- arc navigation ------------------------------------------------------------------------------


def test_arc_reset_maps_the_unit_square_to_the_box():
    family = ArcNavigationFamily()
    params = family.make_params()
    noise = torch.tensor([[0.0, 1.0], [0.25, 0.75]], dtype=torch.float64)
    state = family.reset(params, noise)
    assert state.dtype == torch.float32
    assert state.tolist() == [[-1.0, 1.0], [-0.5, 0.5]]


@pytest.mark.parametrize(("position", "inside"), [
    ((0.5, 0.0), True),  # squared distance exactly the squared radius: inside
    ((0.0, -0.5), True),
    ((0.5, 2.0**-6), False),  # just outside along y
    ((0.6, 0.0), False),  # outside along x only
    ((0.0, 0.6), False),  # outside along y only
    ((0.25, 0.25), True),
])
def test_arc_in_goal_boundary(position, inside):
    # Radius 0.5 and these offsets are exact in binary, so the comparison is exact.
    family = ArcNavigationFamily()
    params = family.make_params(goal=(0.0, 0.0), goal_radius=0.5)
    pos = torch.tensor([position], dtype=torch.float32)
    assert family.in_goal(pos, params).tolist() == [inside]
    # Moved with the goal: the offset is what counts, not the position.
    shifted = family.make_params(goal=(0.25, -0.5), goal_radius=0.5)
    assert family.in_goal(pos + torch.tensor([0.25, -0.5]), shifted).tolist() == [inside]


def test_arc_step_moves_along_the_compass_and_clips_to_the_box():
    family = ArcNavigationFamily()
    params = family.make_params(goal=(0.5, 0.5), goal_radius=0.2, step_size=0.15)
    state = torch.tensor([[0.0, 0.0]] * 8 + [[0.95, -0.95], [0.5, 0.5], [-1.0, 1.0]], dtype=torch.float32)
    action = torch.tensor(list(range(8)) + [7, 1, 3])
    next_state, reward, done = family.step(state, action, params)
    expected = []
    for (x, y), k in zip(state.tolist(), action.tolist()):
        angle = 2 * math.pi * k / 8
        nx = min(max(x + np.float32(0.15 * math.cos(angle)), -1.0), 1.0)
        ny = min(max(y + np.float32(0.15 * math.sin(angle)), -1.0), 1.0)
        expected.append([nx, ny])
    np.testing.assert_allclose(next_state.numpy(), np.array(expected, dtype=np.float32), rtol=0, atol=1e-7)
    assert next_state[8].tolist()[0] == 1.0 and next_state[8].tolist()[1] == -1.0  # both coordinates clipped
    # The reward is that of the state acted in (only [0.5, 0.5] is in the goal), not of the next one.
    assert reward.dtype == torch.float32
    assert reward.tolist() == [0.0] * 9 + [1.0, 0.0]
    assert done.dtype == torch.bool and done.shape == (11,) and not bool(done.any())


def test_arc_step_size_scales_the_compass():
    family = ArcNavigationFamily()
    params = family.make_params(goal=(0.9, 0.9), step_size=0.5)
    next_state, _, _ = family.step(torch.zeros(2, 2), torch.tensor([0, 2]), params)
    np.testing.assert_allclose(next_state.numpy(), [[0.5, 0.0], [0.0, 0.5]], atol=1e-7)


# --- CartPole: Gymnasium's CartPole-v1 equations on Python floats ---------------------------------


def _gym_cartpole_step(state, action, length, masspole, masscart, force_mag):
    """One step of Gymnasium's ``CartPoleEnv.step`` (euler), re-written on Python floats."""
    gravity, tau = 9.8, 0.02
    x, x_dot, theta, theta_dot = state
    total_mass = masspole + masscart
    polemass_length = masspole * length
    force = force_mag if action == 1 else -force_mag
    costheta, sintheta = math.cos(theta), math.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
    thetaacc = (gravity * sintheta - costheta * temp) / (length * (4.0 / 3.0 - masspole * costheta**2 / total_mass))
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    x = x + tau * x_dot
    x_dot = x_dot + tau * xacc
    theta = theta + tau * theta_dot
    theta_dot = theta_dot + tau * thetaacc
    threshold = 12 * 2 * math.pi / 360
    terminated = x < -2.4 or x > 2.4 or theta < -threshold or theta > threshold
    return [x, x_dot, theta, theta_dot], terminated


def _cartpole_params(length, masspole, masscart, force_mag, dtype=torch.float64):
    t = lambda v: torch.tensor(v, dtype=dtype)  # noqa: E731
    return CartPoleParams(length=t(length), masspole=t(masspole), masscart=t(masscart), force_mag=t(force_mag))


_CARTPOLE_STATES = [
    [0.01, -0.02, 0.03, 0.04],
    [-1.0, 0.7, -0.15, 1.3],
    [2.0, -1.5, 0.19, -2.0],
    [0.3, 0.0, -0.05, -0.6],
]


@pytest.mark.parametrize("task", [(0.5, 0.1, 1.0, 10.0), (0.7, 0.35, 1.6, 6.5), (0.3, 0.9, 0.45, 14.0)])
@pytest.mark.parametrize("action", [0, 1])
def test_cartpole_step_matches_gymnasium_equations(task, action):
    family = CartPoleFamily()
    state = torch.tensor(_CARTPOLE_STATES, dtype=torch.float64)
    next_state, reward, terminated = family.step(state, torch.full((4,), action), _cartpole_params(*task))
    assert next_state.dtype == torch.float64
    for i, s in enumerate(_CARTPOLE_STATES):
        expected, term = _gym_cartpole_step(s, action, *task)
        np.testing.assert_allclose(next_state[i].tolist(), expected, rtol=1e-13, atol=1e-15)
        assert bool(terminated[i]) == term
    assert reward.tolist() == [1.0] * 4


def test_cartpole_step_in_float32_with_float32_params():
    # The environments step float32 states with float32 params; the float64 reference agrees to float32 rounding.
    family = CartPoleFamily()
    params = family.make_params(length=0.7, masspole=0.35, masscart=1.6, force_mag=6.5)
    state = torch.tensor(_CARTPOLE_STATES, dtype=torch.float32)
    next_state, reward, _ = family.step(state, torch.tensor([1, 0, 1, 0]), params)
    assert next_state.dtype == torch.float32 and reward.dtype == torch.float32
    for i, s in enumerate(state.double().tolist()):
        expected, _ = _gym_cartpole_step(s, [1, 0, 1, 0][i], 0.7, 0.35, 1.6, 6.5)
        np.testing.assert_allclose(next_state[i].tolist(), expected, rtol=1e-5, atol=1e-6)


def test_cartpole_termination_boundaries():
    # Zero velocities: the positions do not move, so the next x / theta are exactly the given ones;
    # the thresholds are strict (|x| > 2.4 terminates, |x| = 2.4 does not).
    family = CartPoleFamily()
    params = _cartpole_params(0.5, 0.1, 1.0, 10.0)
    thr = 12 * 2 * math.pi / 360
    states = torch.tensor([
        [2.4, 0.0, 0.0, 0.0],
        [-2.4, 0.0, 0.0, 0.0],
        [2.41, 0.0, 0.0, 0.0],
        [-2.41, 0.0, 0.0, 0.0],
        [0.0, 0.0, thr, 0.0],
        [0.0, 0.0, -thr, 0.0],
        [0.0, 0.0, thr + 1e-3, 0.0],
        [0.0, 0.0, -thr - 1e-3, 0.0],
        [2.39, 1.0, 0.0, 0.0],  # crosses the boundary in this step: next x = 2.41
        [0.0, 0.0, 0.2, 0.5],  # next theta = 0.21 > 12°
    ], dtype=torch.float64)
    _, _, terminated = family.step(states, torch.zeros(10, dtype=torch.int64), params)
    assert terminated.tolist() == [False, False, True, True, False, False, True, True, True, True]


def test_cartpole_reset_range():
    family = CartPoleFamily()
    state = family.reset(family.make_params(), torch.tensor([[0.0, 0.5, 1.0, 0.25]], dtype=torch.float64))
    assert state.dtype == torch.float32
    np.testing.assert_allclose(state.tolist(), [[-0.05, 0.0, 0.05, -0.025]], atol=1e-8)


def test_cartpole_params_derived_quantities_and_cast():
    p = _cartpole_params(0.7, 0.35, 1.6, 6.5, dtype=torch.float32)
    assert p.total_mass.item() == pytest.approx(1.95)
    assert p.polemass_length.item() == pytest.approx(0.245)
    q = p.to_dtype(torch.float64)
    assert q.length.dtype == q.masspole.dtype == q.masscart.dtype == q.force_mag.dtype == torch.float64
    assert (q.length.item(), q.masspole.item(), q.masscart.item(), q.force_mag.item()) == (
        p.length.item(), p.masspole.item(), p.masscart.item(), p.force_mag.item())
    assert p.to_dtype(torch.float32) is p


# --- Pendulum: Gymnasium's Pendulum-v1 equations on Python floats ----------------------------------


def _gym_pendulum_step(state, u, mass, length, gravity):
    """One step of Gymnasium's ``PendulumEnv.step`` on Python floats, θ then wrapped to [-π, π)."""
    dt, max_speed, max_torque = 0.05, 8.0, 2.0
    th, thdot = state
    u = min(max(u, -max_torque), max_torque)
    norm = ((th + math.pi) % (2 * math.pi)) - math.pi
    cost = norm**2 + 0.1 * thdot**2 + 0.001 * u**2
    newthdot = thdot + (3 * gravity / (2 * length) * math.sin(th) + 3.0 / (mass * length**2) * u) * dt
    newthdot = min(max(newthdot, -max_speed), max_speed)
    newth = th + newthdot * dt
    newth = ((newth + math.pi) % (2 * math.pi)) - math.pi
    return [newth, newthdot], -cost


def _pendulum_params(mass, length, gravity, dtype=torch.float64):
    t = lambda v: torch.tensor(v, dtype=dtype)  # noqa: E731
    return PendulumParams(mass=t(mass), length=t(length), gravity=t(gravity))


_PENDULUM_STATES = [[0.3, -0.4], [-2.5, 3.0], [3.0, 7.9], [-1.0, -7.95], [1.5, 0.0]]
_PENDULUM_ACTIONS = [0.5, -1.7, 3.0, -2.5, 2.0]  # two of them beyond the torque limit


@pytest.mark.parametrize("task", [(1.0, 1.0, 10.0), (1.2, 0.8, 9.0), (0.8, 1.1, 11.0)])
def test_pendulum_step_matches_gymnasium_equations(task):
    family = PendulumFamily()
    state = torch.tensor(_PENDULUM_STATES, dtype=torch.float64)
    action = torch.tensor(_PENDULUM_ACTIONS, dtype=torch.float64).unsqueeze(-1)
    next_state, reward, done = family.step(state, action, _pendulum_params(*task))
    assert next_state.dtype == torch.float64
    for i, (s, u) in enumerate(zip(_PENDULUM_STATES, _PENDULUM_ACTIONS)):
        expected, r = _gym_pendulum_step(s, u, *task)
        np.testing.assert_allclose(next_state[i].tolist(), expected, rtol=1e-13, atol=1e-14)
        assert reward[i].item() == pytest.approx(r, rel=1e-13, abs=1e-15)
    assert done.dtype == torch.bool and done.shape == (5,) and not bool(done.any())


def test_pendulum_speed_is_clipped_both_ways():
    family = PendulumFamily()
    state = torch.tensor([[1.5, 7.99], [-1.5, -7.99]], dtype=torch.float64)
    next_state, _, _ = family.step(state, torch.tensor([[2.0], [-2.0]], dtype=torch.float64), _pendulum_params(1.0, 1.0, 10.0))
    assert next_state[:, 1].tolist() == [8.0, -8.0]
    np.testing.assert_allclose(next_state[:, 0].tolist(), [1.5 + 0.4, -1.5 - 0.4], rtol=1e-14)


def test_pendulum_reset_and_observe():
    family = PendulumFamily()
    params = family.make_params()
    state = family.reset(params, torch.tensor([[0.0, 0.0], [0.75, 1.0], [0.5, 0.25]], dtype=torch.float64))
    assert state.dtype == torch.float32
    np.testing.assert_allclose(state.tolist(), [[-math.pi, -1.0], [math.pi / 2, 1.0], [0.0, -0.5]], atol=1e-6)
    obs = family.observe(torch.tensor([[0.5, -3.0], [-2.0, 7.0]], dtype=torch.float64), params)
    np.testing.assert_allclose(
        obs.tolist(), [[math.cos(0.5), math.sin(0.5), -3.0], [math.cos(-2.0), math.sin(-2.0), 7.0]], rtol=1e-15)


def test_angle_normalize_wraps_to_the_half_open_interval():
    theta = torch.tensor([math.pi, -math.pi, 0.0, 3 * math.pi / 2, -3 * math.pi / 2, 7.0, -7.0], dtype=torch.float64)
    expected = [((t + math.pi) % (2 * math.pi)) - math.pi for t in theta.tolist()]
    np.testing.assert_allclose(angle_normalize(theta).tolist(), expected, atol=1e-15)
    assert angle_normalize(theta)[0].item() == pytest.approx(-math.pi)


def test_pendulum_params_derived_quantities_and_cast():
    p = _pendulum_params(1.2, 0.8, 9.0, dtype=torch.float32)
    assert p.inertia.item() == pytest.approx(1.2 * 0.8 * 0.8 / 3.0, rel=1e-6)
    assert p.gravity_torque.item() == pytest.approx(1.2 * 9.0 * 0.8 / 2.0, rel=1e-6)
    q = p.to_dtype(torch.float64)
    assert q.mass.dtype == q.length.dtype == q.gravity.dtype == torch.float64
    assert (q.mass.item(), q.length.item(), q.gravity.item()) == (p.mass.item(), p.length.item(), p.gravity.item())
    assert p.to_dtype(torch.float32) is p


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_angle_normalize_is_bitwise_gymnasiums(dtype):
    # Gymnasium's Pendulum-v1 angle_normalize, ((x + pi) % (2 pi)) - pi, in the array's own dtype:
    # the same bits, not only the same angle (θ - π instead of θ + π is one rounding off in places).
    x = np.linspace(-20.0, 20.0, 20001).astype(dtype)
    gymnasium = ((x + np.pi) % (2 * np.pi)) - np.pi
    ours = angle_normalize(torch.from_numpy(x))
    assert isinstance(ours, torch.Tensor) and ours.dtype == torch.from_numpy(x).dtype
    np.testing.assert_array_equal(ours.numpy(), gymnasium)


def test_gridworld_tables_and_moves_are_built_on_the_goals_device():
    # PyTorch's meta device stands in for an accelerator (any operation mixing its data-less
    # tensors with CPU tensors raises): a dropped device= is caught without a GPU.
    meta = torch.device("meta")
    family = GridWorldFamily()
    params = GridWorldParams(torch.tensor([[3, 1], [0, 4]], device="meta"), 5, 15)
    table = family.next_state_table(params)
    assert table.device == meta and table.dtype == torch.int64 and tuple(table.shape) == (2, 25, 4)
    reward = family.reward_vector(params)
    assert reward.device == meta and reward.dtype == torch.float64 and tuple(reward.shape) == (2, 25)
    moved = _move(torch.zeros(3, dtype=torch.int64, device="meta"), torch.zeros(3, dtype=torch.int64, device="meta"), 5)
    assert moved.device == meta and tuple(moved.shape) == (3,)


def test_angle_normalize_of_a_tensor_stays_a_tensor_on_its_device():
    out = angle_normalize(torch.zeros(4, device="meta", dtype=torch.float64))
    assert out.device == torch.device("meta") and out.dtype == torch.float64 and tuple(out.shape) == (4,)
