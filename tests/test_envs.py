"""Tests of the task families (issue 2): registration, dynamics, exact models, vector env, RNG, bad input.

Expected values are computed here by hand (or by an independent reference), never by calling the
code under test a second time.
"""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gym_check_env
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import fedrl_envs
from fedrl_envs import (
    ARC_NAVIGATION,
    GRIDWORLD,
    FamilyVectorEnv,
    GridWorldParams,
    RandomStreams,
    derive_keys,
    stack_params,
)
from fedrl_envs.rng import _GOLDEN as _GOLDEN_FOR_TEST
from fedrl_envs.rng import mix64, uniform32_of_mix64, words_to_uniform

GRID = "fedrl/GridWorld-v0"
ARC = "fedrl/ArcNavigation-v0"

# The paper's 8 gridworld goals (x, y) for size 5, in agent order (issue 2).
PAPER_GRID_GOALS = [(0, 0), (4, 0), (0, 4), (4, 4), (2, 0), (0, 2), (4, 2), (2, 4)]
# chi-square 1 - 1e-6 quantiles (df = 23 and df = 3) and the Kolmogorov 1 - 1e-6 quantile
CHI2_23 = 70.55
CHI2_3 = 30.66
KS_CRIT = 2.70


def grid_next(s: int, a: int, size: int) -> int:
    """Hand-written gridworld move: 0 up (y-1), 1 down (y+1), 2 left (x-1), 3 right (x+1); walls stop."""
    x, y = s % size, s // size
    if a == 0:
        y = max(y - 1, 0)
    elif a == 1:
        y = min(y + 1, size - 1)
    elif a == 2:
        x = max(x - 1, 0)
    elif a == 3:
        x = min(x + 1, size - 1)
    else:
        raise AssertionError(a)
    return y * size + x


def unwrapped(env_id: str, **kwargs):
    return gym.make(env_id, **kwargs).unwrapped


def rollout(env, seed: int, n_steps: int, action_seed: int = 0):
    """Observations, rewards and flags of ``n_steps`` steps (resetting after truncation) with seeded actions."""
    rng = np.random.default_rng(action_seed)
    obs, _ = env.reset(seed=seed)
    trace = [np.asarray(obs).tolist()]
    for _ in range(n_steps):
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        trace.append((np.asarray(obs).tolist(), reward, terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            trace.append(np.asarray(obs).tolist())
    return trace


# --------------------------------------------------------------------------------------------
# Registration and the two environment checkers
# --------------------------------------------------------------------------------------------
CHECKED_TASKS = [
    (GRID, {}),
    (GRID, {"agent": 3}),
    (GRID, {"agent": 7}),
    (GRID, {"goal": (1, 2), "size": 3, "horizon": 4}),
    (ARC, {}),
    (ARC, {"agent": 5}),
    (ARC, {"goal": (-0.3, 0.9), "horizon": 5}),
]


def test_registered_ids_have_single_and_vector_entry_points():
    assert set(fedrl_envs.FAMILIES) >= {GRID, ARC}
    for env_id, family in fedrl_envs.FAMILIES.items():
        spec = gym.spec(env_id)
        assert spec.entry_point is not None and spec.vector_entry_point is not None
        assert fedrl_envs.get_family(env_id) is family
        assert family.env_id == env_id
    with pytest.raises(ValueError, match="env_id"):
        fedrl_envs.get_family("fedrl/Nope-v0")


@pytest.mark.parametrize(("env_id", "kwargs"), CHECKED_TASKS)
def test_gymnasium_check_env(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        gym_check_env(env.unwrapped)  # also renders every declared render mode through env.spec


@pytest.mark.parametrize(("env_id", "kwargs"), CHECKED_TASKS)
def test_sb3_check_env(env_id, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sb3_check_env(gym.make(env_id, **kwargs), warn=True)


def test_make_vec_modes_give_the_same_spaces():
    native = gym.make_vec(GRID, num_envs=3, vectorization_mode="vector_entry_point", agent=2)
    sync = gym.make_vec(GRID, num_envs=3, vectorization_mode="sync", agent=2)
    assert isinstance(native, FamilyVectorEnv)
    assert native.num_envs == 3 and native.n_agents == 1
    assert native.single_observation_space == sync.single_observation_space == gym.spaces.Discrete(25)
    assert native.single_action_space == sync.single_action_space == gym.spaces.Discrete(4)
    assert native.agent_params.goal.tolist() == [[0, 4]]
    assert native.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    arc = gym.make_vec(ARC, num_envs=2, vectorization_mode="vector_entry_point", horizon=7)
    assert arc.horizon == 7 and arc.single_observation_space == gym.spaces.Box(-1, 1, (2,), np.float32)


# --------------------------------------------------------------------------------------------
# Task catalogues
# --------------------------------------------------------------------------------------------
def test_gridworld_tasks_follow_the_paper():
    for k, goal in enumerate(PAPER_GRID_GOALS):
        assert unwrapped(GRID, agent=k).params.goal.tolist() == list(goal)
        assert GRIDWORLD.train_tasks[k].goal.tolist() == list(goal)
    assert unwrapped(GRID).params.goal.tolist() == [0, 0]  # agent 0 by default
    # the same pattern on a 7 x 7 grid
    seven = [(0, 0), (6, 0), (0, 6), (6, 6), (3, 0), (0, 3), (6, 3), (3, 6)]
    assert [tuple(unwrapped(GRID, agent=k, size=7).params.goal.tolist()) for k in range(8)] == seven
    heldout = {tuple(t.goal.tolist()) for t in GRIDWORLD.heldout_tasks}
    assert len(heldout) == 17 and heldout.isdisjoint(PAPER_GRID_GOALS)
    assert heldout | set(PAPER_GRID_GOALS) == {(x, y) for x in range(5) for y in range(5)}
    env = unwrapped(GRID, goal=(1, 3), size=6, horizon=9)
    assert (env.params.goal.tolist(), env.params.size, env.params.horizon) == ([1, 3], 6, 9)
    assert env.observation_space == gym.spaces.Discrete(36)


def test_arc_tasks_follow_the_paper():
    train_angles = [-0.5, -0.3, -0.1, 0.1, 0.3, 0.5]
    heldout_angles = [-0.4, 0.0, 0.4]  # midpoints of training goals (0,1), (2,3), (4,5)
    for tasks, angles in ((ARC_NAVIGATION.train_tasks, train_angles), (ARC_NAVIGATION.heldout_tasks, heldout_angles)):
        assert len(tasks) == len(angles)
        for task, angle in zip(tasks, angles, strict=True):
            np.testing.assert_allclose(task.goal.numpy(), [0.8 * math.cos(angle), 0.8 * math.sin(angle)], atol=1e-6)
    for k in range(6):
        assert torch.equal(unwrapped(ARC, agent=k).params.goal, ARC_NAVIGATION.train_tasks[k].goal)
    for task in ARC_NAVIGATION.heldout_tasks:  # the family makes the env of a held-out task
        assert torch.equal(ARC_NAVIGATION.make_env(task).unwrapped.params.goal, task.goal)
    assert unwrapped(ARC, goal=(0.25, -0.5)).params.goal.tolist() == [0.25, -0.5]


@pytest.mark.parametrize("family", [GRIDWORLD, ARC_NAVIGATION])
def test_task_kwargs_round_trip(family):
    for task in family.train_tasks + family.heldout_tasks:
        again = family.make_params(**family.task_kwargs(task))
        assert torch.equal(again.goal, task.goal) and again.horizon == task.horizon
        assert torch.equal(family.make_env(task).unwrapped.params.goal, task.goal)


def test_fedrl_envs_command_lists_every_family(capsys):
    from fedrl_algos.cli import main

    assert main(["envs"]) == 0
    blocks: dict[str, str] = {}
    for line in capsys.readouterr().out.splitlines():  # one block per family, headed by its id
        if not line.startswith(" "):
            current = line.split()[0]
            blocks[current] = ""
        else:
            blocks[current] += line + "\n"
    for env_id, n_train in ((GRID, 8), (ARC, 6)):
        assert f"agent={n_train - 1}:" in blocks[env_id] and f"agent={n_train}:" not in blocks[env_id]
    assert "heldout[2]:" in blocks[ARC] and "heldout[3]:" not in blocks[ARC]


# --------------------------------------------------------------------------------------------
# Dynamics against hand-computed expectations
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3, 5])
def test_gridworld_kernel_every_state_and_action(size):
    params = GRIDWORLD.make_params(goal=(size - 1, 0), size=size)
    n = size * size
    states = torch.arange(n).repeat_interleave(4)
    actions = torch.arange(4).repeat(n)
    batch = stack_params([params] * (4 * n))
    next_state, reward, terminated = GRIDWORLD.step(states, actions, batch)
    expected = [grid_next(int(s), int(a), size) for s, a in zip(states, actions, strict=True)]
    assert next_state.tolist() == expected
    assert reward.tolist() == [1.0 if int(s) == size - 1 else 0.0 for s in states]
    assert not terminated.any()


def test_gridworld_env_every_state_and_action():
    env = unwrapped(GRID, agent=3)  # goal (4, 4) = state 24
    for s in range(25):
        for a in range(4):
            assert env.set_state(s) == s
            obs, reward, terminated, truncated, info = env.step(a)
            assert obs == grid_next(s, a, 5), (s, a)
            assert reward == (1.0 if s == 24 else 0.0)
            assert (terminated, truncated, info) == (False, False, {})


def test_gridworld_action_meaning_by_name():
    env = unwrapped(GRID)
    center = 2 * 5 + 2
    env.set_state(center)
    assert env.step(0)[0] == 1 * 5 + 2  # up: y - 1
    env.set_state(center)
    assert env.step(1)[0] == 3 * 5 + 2  # down: y + 1
    env.set_state(center)
    assert env.step(2)[0] == 2 * 5 + 1  # left: x - 1
    env.set_state(center)
    assert env.step(3)[0] == 2 * 5 + 3  # right: x + 1


def test_arc_compass_moves():
    env = unwrapped(ARC)
    expected = {
        0: (0.15, 0.0),
        1: (0.15 / math.sqrt(2), 0.15 / math.sqrt(2)),
        2: (0.0, 0.15),
        3: (-0.15 / math.sqrt(2), 0.15 / math.sqrt(2)),
        4: (-0.15, 0.0),
        5: (-0.15 / math.sqrt(2), -0.15 / math.sqrt(2)),
        6: (0.0, -0.15),
        7: (0.15 / math.sqrt(2), -0.15 / math.sqrt(2)),
    }
    for a, (dx, dy) in expected.items():
        env.set_state([0.1, -0.2])
        obs = env.step(a)[0]
        assert obs.dtype == np.float32 and obs.shape == (2,)
        np.testing.assert_allclose(obs, [0.1 + dx, -0.2 + dy], atol=1e-6)
        assert math.hypot(obs[0] - 0.1, obs[1] + 0.2) == pytest.approx(0.15, abs=1e-6)


def test_arc_moves_clip_to_the_box():
    env = unwrapped(ARC)
    starts = [(0.95, 0.0), (0.95, 0.95), (-1.0, -1.0), (0.99, -0.5), (-0.9, 0.97), (0.0, -0.9), (1.0, 1.0)]
    for start in starts:
        for a in range(8):
            env.set_state(start)
            obs = env.step(a)[0]
            angle = 2 * math.pi * a / 8
            want = np.clip(np.array(start) + 0.15 * np.array([math.cos(angle), math.sin(angle)]), -1.0, 1.0)
            np.testing.assert_allclose(obs, want, atol=1e-6)
            assert np.all(np.abs(obs) <= 1.0)
    env.set_state((0.95, 0.95))
    assert env.step(1)[0].tolist() == [1.0, 1.0]  # exactly on the corner, not beyond it
    env.set_state((0.99, -0.5))
    obs = env.step(2)[0]  # straight up: x untouched
    assert obs[0] == np.float32(0.99) and obs[1] == pytest.approx(-0.35, abs=1e-6)


def test_arc_reward_radius():
    env = unwrapped(ARC, goal=(0.5, 0.5))
    for offset, rewarded in ((0.0, True), (0.19, True), (0.199, True), (0.201, False), (0.25, False), (0.5, False)):
        env.set_state([0.5 - offset, 0.5])  # distance `offset` along x
        assert env.step(4)[1] == (1.0 if rewarded else 0.0), offset
        env.set_state([0.5 + offset / math.sqrt(2), 0.5 - offset / math.sqrt(2)])  # and diagonally
        assert env.step(0)[1] == (1.0 if rewarded else 0.0), offset


# --------------------------------------------------------------------------------------------
# Reward timing and episode length
# --------------------------------------------------------------------------------------------
def test_gridworld_reward_is_of_the_state_the_action_is_taken_in():
    env = unwrapped(GRID, agent=0)  # goal (0, 0) = state 0
    env.set_state(0, t=0)
    obs, reward, *_ = env.step(3)  # leave the goal: rewarded, since the action is taken in the goal
    assert (obs, reward) == (1, 1.0)
    obs, reward, *_ = env.step(2)  # enter the goal: not rewarded yet
    assert (obs, reward) == (0, 0.0)
    obs, reward, *_ = env.step(0)  # act in the goal (bump the wall): rewarded, goal not absorbing
    assert (obs, reward) == (0, 1.0)


@pytest.mark.parametrize(("env_id", "kwargs", "start", "actions", "n_steps"), [
    (GRID, {"agent": 0}, 0, [0, 2], 16),  # bump into the corner walls, stay in the goal
    (GRID, {"agent": 3, "horizon": 6}, 24, [1, 3], 7),
    (ARC, {"agent": 2}, None, [0, 4], 21),  # right, left: never leaves the goal region
])
def test_staying_in_the_goal_earns_one_per_step_including_the_first(env_id, kwargs, start, actions, n_steps):
    env = unwrapped(env_id, **kwargs)
    env.reset(seed=0)
    env.set_state(env.params.goal.tolist() if start is None else start, t=0)
    rewards = []
    truncated = False
    while not truncated:
        _, reward, terminated, truncated, _ = env.step(actions[len(rewards) % 2])
        assert not terminated
        rewards.append(reward)
    assert rewards == [1.0] * n_steps  # H + 1 rewarded steps: h = 0..H


@pytest.mark.parametrize(("env_id", "kwargs"), [(GRID, {"agent": 5}), (ARC, {"agent": 1}), (ARC, {"goal": (-0.8, 0.8)})])
def test_rewards_along_a_trajectory_are_r_of_s_h(env_id, kwargs):
    env = unwrapped(env_id, **kwargs)
    goal = env.params.goal.numpy().astype(np.float64)
    n_rewarded = 0
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        truncated = False
        while not truncated:
            if env_id == GRID:
                in_goal, ambiguous = obs == goal[1] * 5 + goal[0], False
            else:
                distance = float(np.hypot(*(np.asarray(obs, np.float64) - goal)))
                in_goal, ambiguous = distance <= 0.2, abs(distance - 0.2) < 1e-5
            action = int(rng.integers(env.action_space.n)) if not in_goal else 0
            obs, reward, _, truncated, _ = env.step(action)
            if not ambiguous:
                assert reward == float(in_goal), seed
            n_rewarded += reward > 0
    assert n_rewarded > 0  # the check above met rewarded steps, not only zeros


@pytest.mark.parametrize(("env_id", "kwargs", "n_steps"), [
    (GRID, {}, 16),
    (GRID, {"horizon": 3}, 4),
    (GRID, {"size": 2, "horizon": 1}, 2),
    (ARC, {}, 21),
    (ARC, {"horizon": 4}, 5),
])
def test_episode_length_then_truncated_never_terminated(env_id, kwargs, n_steps):
    env = gym.make(env_id, **kwargs)
    for seed in range(3):
        env.reset(seed=seed)
        flags = [env.step(env.action_space.sample())[2:4] for _ in range(n_steps)]
        assert flags == [(False, False)] * (n_steps - 1) + [(False, True)]


# --------------------------------------------------------------------------------------------
# Start distribution
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("goal", [(0, 0), (4, 4), (2, 2), (4, 1)])
def test_gridworld_start_distribution_is_uniform_over_non_goal_cells(goal):
    goal_index = goal[1] * 5 + goal[0]
    venv = FamilyVectorEnv(GRIDWORLD, [GRIDWORLD.make_params(goal=goal)], n_envs=24_000, seed=1)
    obs, _ = venv.reset()
    counts = torch.bincount(obs, minlength=25)
    assert counts[goal_index] == 0  # never starts in the goal
    others = torch.cat([counts[:goal_index], counts[goal_index + 1 :]]).double()
    assert bool((others > 0).all())  # every other cell is a start
    chi2 = float(((others - 1000.0) ** 2 / 1000.0).sum())
    assert chi2 < CHI2_23


def test_gridworld_reset_kernel_maps_equal_noise_intervals_to_each_non_goal_cell():
    for goal_index in range(25):
        params = GRIDWORLD.make_params(goal=(goal_index % 5, goal_index // 5))
        batch = stack_params([params] * 24)
        midpoints = ((torch.arange(24, dtype=torch.float64) + 0.5) / 24).float().reshape(24, 1)
        starts = GRIDWORLD.reset(batch, midpoints).tolist()
        assert starts == [s for s in range(25) if s != goal_index]
        # the extremes of the noise range are still non-goal cells
        edges = GRIDWORLD.reset(stack_params([params] * 2), torch.tensor([[0.0], [1.0 - 2**-24]])).tolist()
        assert edges == [0 if goal_index != 0 else 1, 24 if goal_index != 24 else 23]


def test_arc_start_distribution_is_uniform_in_the_box():
    n = 40_000
    venv = FamilyVectorEnv(ARC_NAVIGATION, ARC_NAVIGATION.train_tasks[:1], n_envs=n, seed=2)
    obs, _ = venv.reset()
    assert obs.dtype == torch.float32 and obs.shape == (n, 2)
    assert bool((obs >= -1).all()) and bool((obs < 1).all())
    for coord in obs.double().T:
        cdf = (coord.sort().values + 1) / 2
        grid = torch.arange(1, n + 1, dtype=torch.float64) / n
        ks = max(float((grid - cdf).max()), float((cdf - (grid - 1 / n)).max()))
        assert ks * math.sqrt(n) < KS_CRIT
    quadrant = (obs[:, 0] > 0).long() * 2 + (obs[:, 1] > 0).long()
    counts = torch.bincount(quadrant, minlength=4).double()
    assert float(((counts - n / 4) ** 2 / (n / 4)).sum()) < CHI2_3
    corr = torch.corrcoef(obs.double().T)[0, 1]
    assert abs(float(corr)) < 5 / math.sqrt(n)


# --------------------------------------------------------------------------------------------
# Single env and native vector env agree; determinism
# --------------------------------------------------------------------------------------------
def test_single_and_vector_env_agree_on_every_gridworld_state_and_action():
    venv = gym.make_vec(GRID, num_envs=100, vectorization_mode="vector_entry_point", agent=6)
    env = unwrapped(GRID, agent=6)
    states = torch.arange(25).repeat_interleave(4)
    actions = torch.arange(4).repeat(25)
    venv.reset(seed=0)
    assert venv.set_state(states).tolist() == states.tolist()
    obs, reward, terminated, truncated, _ = venv.step(actions)
    for i in range(100):
        env.set_state(int(states[i]))
        single = env.step(int(actions[i]))
        assert single[:4] == (int(obs[i]), float(reward[i]), bool(terminated[i]), bool(truncated[i]))


@pytest.mark.parametrize(("env_id", "kwargs"), [(GRID, {"agent": 4}), (ARC, {"agent": 3}), (ARC, {"goal": (-0.9, -0.9)})])
def test_single_and_vector_env_agree_transition_by_transition(env_id, kwargs):
    n_envs, horizon = 16, 5
    venv = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="vector_entry_point", horizon=horizon, **kwargs)
    env = unwrapped(env_id, horizon=horizon, **kwargs)
    venv.reset(seed=3)
    venv.set_state(venv.state, t=torch.arange(n_envs) % (horizon + 1))  # staggered episodes
    gen = torch.Generator().manual_seed(0)
    n_checked = 0
    for _ in range(15):
        state, t = venv.state.clone(), venv._t.clone()
        actions = torch.randint(0, venv.single_action_space.n, (n_envs,), generator=gen)
        obs, reward, terminated, truncated, info = venv.step(actions)
        final = info["final_obs"] if "final_obs" in info else obs
        for i in range(n_envs):
            env.set_state(state[i].numpy(), t=int(t[i]))
            s_obs, s_reward, s_term, s_trunc, _ = env.step(int(actions[i]))
            assert np.array_equal(np.asarray(s_obs), np.asarray(final[i]))  # bitwise, same kernel
            assert (s_reward, s_term, s_trunc) == (float(reward[i]), bool(terminated[i]), bool(truncated[i]))
            n_checked += 1
    assert n_checked == 15 * n_envs


@pytest.mark.parametrize("env_id", [GRID, ARC])
def test_same_seed_same_episodes_single_env(env_id):
    a = rollout(unwrapped(env_id, agent=1), seed=11, n_steps=60)
    b = rollout(unwrapped(env_id, agent=1), seed=11, n_steps=60)
    c = rollout(unwrapped(env_id, agent=1), seed=12, n_steps=60)
    assert a == b
    assert a != c
    env = unwrapped(env_id, agent=1)  # re-seeding an env that has run restarts the same sequence
    rollout(env, seed=5, n_steps=10)
    assert rollout(env, seed=11, n_steps=60) == a


@pytest.mark.parametrize("family", [GRIDWORLD, ARC_NAVIGATION])
def test_same_seed_same_episodes_vector_env(family):
    def run(venv, seed):
        gen = torch.Generator().manual_seed(0)
        out = [venv.reset(seed=seed)[0].clone()]
        for _ in range(3 * 22):  # several autoresets
            actions = torch.randint(0, venv.single_action_space.n, (venv.num_envs,), generator=gen)
            obs, reward, _, truncated, _ = venv.step(actions)
            out += [obs.clone(), reward.clone(), truncated.clone()]
        return out

    first = run(FamilyVectorEnv(family, family.train_tasks, n_envs=3, seed=4), None)
    same = run(FamilyVectorEnv(family, family.train_tasks, n_envs=3), 4)
    other = run(FamilyVectorEnv(family, family.train_tasks, n_envs=3), 5)
    assert all(torch.equal(x, y) for x, y in zip(first, same, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(first, other, strict=True))


@pytest.mark.parametrize(("env_id", "family"), [(GRID, GRIDWORLD), (ARC, ARC_NAVIGATION)])
def test_single_env_equals_agent_zero_of_a_vector_env(env_id, family):
    seed, n_steps = 123, 70  # three episodes and more
    env = unwrapped(env_id, agent=2)
    task = family.train_tasks[2]
    alone = FamilyVectorEnv(family, [task], n_envs=1, seed=seed)
    crowd = FamilyVectorEnv(family, [task, *family.train_tasks[:2]], n_envs=1, seed=seed)  # agent 0 of three
    obs, _ = env.reset(seed=seed)
    v_obs, _ = alone.reset()
    c_obs, _ = crowd.reset()
    gen = torch.Generator().manual_seed(1)
    for _ in range(n_steps):
        assert np.array_equal(np.asarray(obs), v_obs[0].numpy())
        assert np.array_equal(np.asarray(obs), c_obs[0].numpy())
        a = int(torch.randint(0, env.action_space.n, (1,), generator=gen))
        obs, reward, _, truncated, _ = env.step(a)
        v_obs, v_reward, _, v_truncated, _ = alone.step(torch.tensor([a]))
        c_obs, _, _, _, _ = crowd.step(torch.tensor([a, 0, 0]))
        assert (reward, truncated) == (float(v_reward[0]), bool(v_truncated[0]))
        if truncated:
            obs, _ = env.reset()  # the vector env has already reset: its obs is the new start


def test_agent_streams_do_not_depend_on_the_rest_of_the_batch():
    tasks = GRIDWORLD.train_tasks
    small = FamilyVectorEnv(GRIDWORLD, tasks[:3], n_envs=4, seed=9)
    large = FamilyVectorEnv(GRIDWORLD, tasks[:8], n_envs=4, seed=9)
    s_obs, _ = small.reset()
    l_obs, _ = large.reset()
    for step in range(40):
        assert torch.equal(small.structured(s_obs), large.structured(l_obs)[:3]), step
        actions = torch.full((large.num_envs,), step % 4)
        s_obs, *_ = small.step(actions[: small.num_envs])
        l_obs, *_ = large.step(actions)


def test_other_agents_ending_episodes_do_not_advance_an_agents_stream():
    def agent_zero_obs(t_other: int) -> list[torch.Tensor]:
        venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=2, seed=21)
        venv.reset()
        venv.set_state(venv.state, t=torch.tensor([0, 0, t_other, t_other]))  # agent 1 ends early
        out = []
        for _ in range(40):
            obs, *_ = venv.step(torch.zeros(4, dtype=torch.int64))
            out.append(venv.structured(obs)[0].clone())
        return out

    in_step, staggered = agent_zero_obs(0), agent_zero_obs(7)
    assert all(torch.equal(a, b) for a, b in zip(in_step, staggered, strict=True))


def test_deepcopy_and_pickle_continue_identically():
    env = unwrapped(ARC, agent=4)
    env.reset(seed=8)
    env.step(1)
    twins = [copy.deepcopy(env), pickle.loads(pickle.dumps(env))]
    for a in (0, 3, 3, 6):
        obs = env.step(a)[0]
        for twin in twins:
            assert np.array_equal(twin.step(a)[0], obs)
    next_episode = env.reset()[0]
    for twin in twins:
        assert np.array_equal(twin.reset()[0], next_episode)


# --------------------------------------------------------------------------------------------
# The exact model
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(8))
def test_exact_model_agrees_with_stepping_the_env(k):
    task = GRIDWORLD.train_tasks[k]
    env = GRIDWORLD.make_env(task).unwrapped
    table = GRIDWORLD.next_state_table(task)
    P = GRIDWORLD.transition_tensor(task)
    r = GRIDWORLD.reward_vector(task)
    mu = GRIDWORLD.start_distribution(task)
    assert table.shape == (25, 4) and table.dtype == torch.int64
    assert P.shape == (25, 4, 25) and P.dtype == torch.float64
    assert r.shape == mu.shape == (25,)
    for s in range(25):
        for a in range(4):
            env.set_state(s)
            obs, reward, *_ = env.step(a)
            assert int(table[s, a]) == obs == grid_next(s, a, 5)
            assert P[s, a, obs] == 1.0 and float(P[s, a].sum()) == 1.0
            assert float(r[s]) == reward
    goal = PAPER_GRID_GOALS[k][1] * 5 + PAPER_GRID_GOALS[k][0]
    assert r.tolist() == [1.0 if s == goal else 0.0 for s in range(25)]
    assert mu.tolist() == pytest.approx([0.0 if s == goal else 1 / 24 for s in range(25)], abs=1e-15)
    assert float(mu.sum()) == pytest.approx(1.0, abs=1e-12)


def test_exact_model_of_stacked_tasks_is_per_task():
    tasks = GRIDWORLD.train_tasks
    stacked = stack_params(tasks)
    tables = GRIDWORLD.next_state_table(stacked)
    rewards = GRIDWORLD.reward_vector(stacked)
    starts = GRIDWORLD.start_distribution(stacked, dtype=torch.float32)
    assert tables.shape == (8, 25, 4) and starts.dtype == torch.float32
    for k, task in enumerate(tasks):
        assert torch.equal(tables[k], GRIDWORLD.next_state_table(task))
        assert torch.equal(rewards[k], GRIDWORLD.reward_vector(task))
        assert torch.equal(GRIDWORLD.transition_tensor(stacked)[k], GRIDWORLD.transition_tensor(task))


def test_exact_value_of_the_random_policy_matches_monte_carlo():
    """Undiscounted return of the uniform policy: dynamic programming on the model vs env rollouts."""
    tasks = GRIDWORLD.train_tasks
    stacked = stack_params(tasks)
    table, r, mu = GRIDWORLD.next_state_table(stacked), GRIDWORLD.reward_vector(stacked), GRIDWORLD.start_distribution(stacked)
    value = torch.zeros(8, 25, dtype=torch.float64)
    for _ in range(16):  # h = H .. 0
        value = r + torch.gather(value, 1, table.reshape(8, -1)).reshape(8, 25, 4).mean(-1)
    exact = (mu * value).sum(-1)

    n_envs = 4000
    venv = FamilyVectorEnv(GRIDWORLD, tasks, n_envs=n_envs, seed=0, autoreset=False)
    venv.reset()
    gen = torch.Generator().manual_seed(0)
    returns = torch.zeros(venv.num_envs, dtype=torch.float64)
    for _ in range(16):
        _, reward, _, truncated, _ = venv.step(torch.randint(0, 4, (venv.num_envs,), generator=gen))
        returns += reward
    assert bool(truncated.all())
    per_agent = venv.structured(returns)
    stderr = per_agent.std(1) / math.sqrt(n_envs)
    assert bool(((per_agent.mean(1) - exact).abs() < 5 * stderr + 1e-9).all()), (per_agent.mean(1), exact)
    assert bool((exact > 0.1).all()) and bool((exact < 2.0).all())  # a meaningful, non-degenerate value


# --------------------------------------------------------------------------------------------
# FamilyVectorEnv: autoreset, fixed-horizon mode, no aliasing
# --------------------------------------------------------------------------------------------
def test_vector_env_same_step_autoreset_and_final_obs():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=3, seed=6)
    obs, _ = venv.reset()
    actions = torch.tensor([0, 1, 2, 3, 0, 1])
    for _ in range(15):
        obs, _, terminated, truncated, info = venv.step(actions)
        assert "final_obs" not in info and not truncated.any() and not terminated.any()
    last_state = venv.state.clone()
    obs, reward, terminated, truncated, info = venv.step(actions)
    expected_final = [grid_next(int(s), int(a), 5) for s, a in zip(last_state, actions, strict=True)]
    assert info["final_obs"].tolist() == expected_final
    assert info["_final_obs"].tolist() == [True] * 6 and info["_final_info"].tolist() == [True] * 6
    assert info["final_info"] == {}
    assert truncated.all() and not terminated.any()
    goals = venv.params.goal_index
    assert reward.tolist() == [float(s == g) for s, g in zip(last_state.tolist(), goals.tolist(), strict=True)]
    assert bool((obs != goals).all())  # the returned obs is a fresh start
    assert venv._t.tolist() == [0] * 6
    for step in range(16):  # the next episode is again 16 steps long
        *_, truncated, info = venv.step(actions)
        assert bool(truncated.all()) == (step == 15) and (("final_obs" in info) == (step == 15))


def test_vector_env_autoreset_mask_with_staggered_episodes():
    venv = FamilyVectorEnv(ARC_NAVIGATION, ARC_NAVIGATION.train_tasks[:1], n_envs=3, seed=6)
    venv.reset()
    venv.set_state(torch.tensor([[0.0, 0.0], [0.5, 0.5], [-0.5, 0.25]]), t=torch.tensor([0, 19, 20]))
    obs, _, _, truncated, info = venv.step(torch.tensor([0, 0, 0]))
    assert truncated.tolist() == [False, False, True] and info["_final_obs"].tolist() == [False, False, True]
    np.testing.assert_allclose(info["final_obs"].numpy(), [[0.15, 0.0], [0.65, 0.5], [-0.35, 0.25]], atol=1e-6)
    assert torch.equal(obs[:2], info["final_obs"][:2])  # running episodes are not reset
    assert not torch.equal(obs[2], info["final_obs"][2])
    _, _, _, truncated, info = venv.step(torch.tensor([0, 0, 0]))
    assert truncated.tolist() == [False, True, False] and info["_final_obs"].tolist() == [False, True, False]


def test_vector_env_without_autoreset():
    venv = gym.make_vec(GRID, num_envs=4, vectorization_mode="vector_entry_point", agent=1, autoreset=False, seed=0)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    venv.reset()
    for _ in range(16):
        state = venv.state.clone()
        obs, _, _, truncated, info = venv.step(torch.ones(4, dtype=torch.int64))  # down
        assert "final_obs" not in info
    assert truncated.all()
    assert obs.tolist() == [grid_next(int(s), 1, 5) for s in state]  # not replaced by a reset
    obs2, _, _, truncated, _ = venv.step(torch.full((4,), 2))  # stepping on continues the same states
    assert obs2.tolist() == [grid_next(int(s), 2, 5) for s in obs] and truncated.all()
    venv.reset()
    assert venv._t.tolist() == [0] * 4


def test_vector_env_observations_do_not_alias_its_state():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:1], n_envs=5, seed=0)
    obs, _ = venv.reset()
    before = venv.state.clone()
    obs += 1  # a caller writing into the returned batch must not move the agents
    assert torch.equal(venv.state, before)
    obs, *_ = venv.step(torch.zeros(5, dtype=torch.int64))
    state = venv.state.clone()
    obs.zero_()
    assert torch.equal(venv.state, state)


def test_vector_env_accepts_one_unstacked_task_and_numpy_actions():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[3], n_envs=2, seed=0)
    assert venv.n_agents == 1 and venv.num_envs == 2
    stacked = FamilyVectorEnv(GRIDWORLD, stack_params(GRIDWORLD.train_tasks[:3]), n_envs=2)
    assert stacked.n_agents == 3
    venv.reset()
    venv.set_state([24, 23])
    obs, reward, *_ = venv.step(np.array([0, 3]))
    assert obs.tolist() == [19, 24] and reward.tolist() == [1.0, 0.0]


# --------------------------------------------------------------------------------------------
# RandomStreams
# --------------------------------------------------------------------------------------------
def _splitmix64_reference(x: int) -> int:
    """SplitMix64 finalizer of ``x + golden`` on Python ints modulo 2**64, as a signed int64."""
    m = 2**64
    z = (x + 0x9E3779B97F4A7C15) % m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
    z ^= z >> 31
    return z - m if z >= 2**63 else z


def test_mix64_is_splitmix64():
    rng = np.random.default_rng(0)
    xs = [0, 1, -1, 2**62, -(2**63), 2**63 - 1] + [int(v) for v in rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64)]
    assert mix64(torch.tensor(xs, dtype=torch.int64)).tolist() == [_splitmix64_reference(x) for x in xs]
    assert mix64(torch.tensor(0)).item() == 0xE220A8397B1DCDAF - 2**64  # SplitMix64's first output from state 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_lies_in_the_unit_interval_and_is_uniform(dtype):
    n = 200_000
    u = RandomStreams.from_seed(0, 2).uniform((n // 2,), dtype=dtype).reshape(-1).double()
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
    ks = float((torch.arange(1, n + 1, dtype=torch.float64) / n - u.sort().values).abs().max())
    assert ks * math.sqrt(n) < KS_CRIT + 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_uniform_never_rounds_up_to_one(dtype):
    u = words_to_uniform(torch.full((3, 4), -1, dtype=torch.int64), dtype)  # every bit set
    assert u.dtype == dtype and bool((u < 1).all()) and bool((u > 0.99).all())
    with pytest.raises(TypeError, match="dtype"):
        RandomStreams.from_seed(0, 1).uniform((2,), dtype=torch.int64)


def test_float32_shortcut_equals_the_full_finalizer():
    # uniform32_of_mix64 skips mix64's last xorshift, which never reaches a float32's 24 bits.
    extremes = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), _GOLDEN_FOR_TEST], dtype=torch.int64)
    words = torch.cat([extremes, torch.randint(-(2**63), 2**63 - 1, (500_000,), generator=torch.Generator().manual_seed(0))])
    assert torch.equal(uniform32_of_mix64(words), words_to_uniform(mix64(words), torch.float32))
    streams = RandomStreams.from_seed(5, 3)
    state = streams.state_dict()
    fast = streams.uniform((7,))
    streams.load_state_dict(state)
    assert torch.equal(fast, words_to_uniform(streams.bits((7,)), torch.float32))


def test_float64_path_refines_the_float32_path():
    streams = RandomStreams.from_seed(3, 4)
    state = streams.state_dict()
    u32 = streams.uniform((1000,))
    streams.load_state_dict(state)
    u64 = streams.uniform((1000,), dtype=torch.float64)
    assert u64.dtype == torch.float64 and float(u64.min()) >= 0 and float(u64.max()) < 1
    assert torch.equal(torch.floor(u64 * 2**24) / 2**24, u32.double())  # same words, 53 vs 24 bits
    assert bool((u64 * 2**24 != torch.floor(u64 * 2**24)).any())  # resolution finer than float32's


def test_stream_of_an_agent_does_not_depend_on_the_number_of_streams():
    few, many = RandomStreams.from_seed(7, 3), RandomStreams.from_seed(7, 11)
    for shape in ((5,), (2, 3)):
        assert torch.equal(few.uniform(shape), many.uniform(shape)[:3])
    assert torch.equal(derive_keys(7, 9), many.keys[9])
    rows = many.uniform((8,))
    assert len({tuple(row.tolist()) for row in rows}) == 11  # every stream is distinct
    assert not torch.equal(RandomStreams.from_seed(8, 3).uniform((5,)), few.uniform((5,)))


def test_draws_are_a_function_of_the_counter_only():
    a, b = RandomStreams.from_seed(1, 2), RandomStreams.from_seed(1, 2)
    whole = a.uniform((6,))
    parts = torch.cat([b.uniform((2,)), b.uniform((4,))], dim=1)
    assert torch.equal(whole, parts) and a.counters.tolist() == b.counters.tolist() == [6, 6]
    copy_of_row = a[1]
    assert torch.equal(copy_of_row.uniform((3,)), a.uniform((3,))[1])


def test_state_dict_round_trip():
    streams = RandomStreams.from_seed(5, 3)
    streams.uniform((4,))
    state = streams.state_dict()
    first = streams.uniform((10,))
    assert state["counters"].tolist() == [4, 4, 4]  # a copy, not a view of the live counters
    streams.load_state_dict(state)
    assert torch.equal(streams.uniform((10,)), first)
    fresh = RandomStreams.from_seed(999, 3)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.uniform((10,)), first)
    assert torch.equal(pickle.loads(pickle.dumps(fresh)).uniform((2,)), fresh.uniform((2,)))


def test_normal_draws_have_unit_moments():
    z = RandomStreams.from_seed(2, 4).normal((50_000,), dtype=torch.float64).reshape(-1)
    assert torch.isfinite(z).all()
    assert abs(float(z.mean())) < 5 / math.sqrt(z.numel())
    assert abs(float(z.std()) - 1.0) < 0.01


def test_seeds_of_any_64_bit_size_are_accepted():
    assert torch.equal(RandomStreams.from_seed(2**64 - 1, 2).keys, RandomStreams.from_seed(-1, 2).keys)
    env = unwrapped(GRID)
    obs_big, _ = env.reset(seed=2**63 + 5)
    assert 0 <= obs_big < 25
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:1], n_envs=1, seed=2**63 + 5)
    assert venv.reset()[0].tolist() == [obs_big]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_bitwise():
    cpu, gpu = RandomStreams.from_seed(4, 5), RandomStreams.from_seed(4, 5, device="cuda")
    assert torch.equal(cpu.uniform((100,)), gpu.uniform((100,)).cpu())
    assert torch.equal(cpu.uniform((100,), dtype=torch.float64), gpu.uniform((100,), dtype=torch.float64).cpu())
    for family in (GRIDWORLD, ARC_NAVIGATION):
        runs = []
        for device in ("cpu", "cuda"):
            venv = FamilyVectorEnv(family, family.train_tasks, n_envs=64, device=device, seed=1)
            gen = torch.Generator().manual_seed(0)
            out = [venv.reset()[0].cpu()]
            for _ in range(30):
                actions = torch.randint(0, venv.single_action_space.n, (venv.num_envs,), generator=gen)
                obs, reward, *_ = venv.step(actions.to(device))
                out += [obs.cpu(), reward.cpu()]
            runs.append(out)
        assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------
def test_gridworld_renders():
    env = unwrapped(GRID, agent=6, render_mode="rgb_array")  # goal (4, 2)
    env.reset(seed=0)
    env.set_state(1 * 5 + 3)  # agent at (3, 1)
    frame = env.render()
    assert frame.shape == (80, 80, 3) and frame.dtype == np.uint8
    assert frame[2 * 16 + 8, 4 * 16 + 8].tolist() == [60, 180, 75]  # goal cell centre
    assert frame[1 * 16 + 8, 3 * 16 + 8].tolist() == [30, 90, 200]  # agent cell centre
    assert frame[4 * 16 + 8, 0 * 16 + 8].tolist() == [245, 245, 245]  # an empty cell
    env.step(1)  # down: the agent's pixels move with it
    frame = env.render()
    assert frame[2 * 16 + 8, 3 * 16 + 8].tolist() == [30, 90, 200]
    assert frame[1 * 16 + 8, 3 * 16 + 8].tolist() == [245, 245, 245]
    text = unwrapped(GRID, agent=6, render_mode="ansi")
    text.reset(seed=0)
    text.set_state(1 * 5 + 3)
    assert text.render() == ".....\n...A.\n....G\n.....\n.....\n"


def test_arc_navigation_renders():
    env = unwrapped(ARC, goal=(-0.5, -0.5), render_mode="rgb_array")
    env.reset(seed=0)
    env.set_state([0.5, 0.75])
    frame = env.render()
    assert frame.shape == (128, 128, 3) and frame.dtype == np.uint8

    def pixel(x, y):  # row 0 is y = +1, column 0 is x = -1
        return frame[int((1 - y) / 2 * 128), int((x + 1) / 2 * 128)].tolist()

    assert pixel(0.5, 0.75) == [30, 90, 200]
    assert pixel(-0.5 + 0.1, -0.5 - 0.1) == [170, 225, 170]  # inside the goal region
    assert pixel(-0.5, 0.5) == pixel(0.9, -0.9) == [245, 245, 245]
    env.step(6)  # down by 0.15
    assert env.render()[int((1 - 0.6) / 2 * 128), int(1.5 / 2 * 128)].tolist() == [30, 90, 200]
    text = unwrapped(ARC, render_mode="ansi")
    text.reset(seed=0)
    text.set_state([0.5, -0.25], t=3)
    assert text.render() == "ArcNavigationEnv(state=[0.5, -0.25], t=3)"


def test_render_without_a_mode_returns_none_and_bad_modes_are_refused():
    env = unwrapped(GRID)
    env.reset(seed=0)
    assert env.render() is None
    with pytest.raises(ValueError, match="render_mode must be one of"):
        fedrl_envs.GridWorldEnv(render_mode="human")
    with pytest.raises(ValueError, match="render_mode"):
        gym.make_vec(GRID, num_envs=2, vectorization_mode="vector_entry_point", render_mode="rgb_array")


@pytest.mark.parametrize("env_cls", [fedrl_envs.GridWorldEnv, fedrl_envs.ArcNavigationEnv, fedrl_envs.CartPoleEnv, fedrl_envs.PendulumEnv])
def test_env_constructor_takes_the_familys_task_arguments_then_render_mode(env_cls):
    task = inspect.signature(env_cls.family.make_params).parameters
    env = inspect.signature(env_cls).parameters
    assert list(env) == [*task, "render_mode"]
    assert all(env[name] == task[name] for name in task)  # same kinds and defaults
    assert env["render_mode"].default is None
    mode = env_cls.metadata["render_modes"][0]
    by_position = env_cls(1, *(p.default for p in list(task.values())[1:]), mode)
    by_keyword = env_cls(agent=1, render_mode=mode)
    assert by_position.render_mode == by_keyword.render_mode == mode
    assert by_position.family.task_kwargs(by_position.params) == by_keyword.family.task_kwargs(by_keyword.params)
    with pytest.raises(TypeError, match=rf"{env_cls.__name__}: got an unexpected keyword argument 'colour'"):
        env_cls(colour=3)
    with pytest.raises(TypeError, match=rf"{env_cls.__name__}: too many positional arguments"):
        env_cls(*([None] * (len(task) + 2)))


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
BAD_TASK_KWARGS = [
    (GRID, {"goal": (5, 0)}, ValueError, r"goal x must be in \[0, 4\], got 5"),
    (GRID, {"goal": (0, -1)}, ValueError, r"goal y must be in \[0, 4\], got -1"),
    (GRID, {"goal": (2, 7), "size": 6}, ValueError, r"goal y must be in \[0, 5\]"),
    (GRID, {"goal": (1.5, 0)}, TypeError, "goal x must be an int"),
    (GRID, {"goal": (1, 2, 3)}, TypeError, "goal must be a pair"),
    (GRID, {"agent": 8}, ValueError, r"agent must be in \[0, 7\], got 8"),
    (GRID, {"agent": -1}, ValueError, r"agent must be in \[0, 7\], got -1"),
    (GRID, {"agent": True}, TypeError, "agent must be an int"),
    (GRID, {"agent": 1, "goal": (0, 0)}, ValueError, "either agent or goal"),
    (GRID, {"size": 1}, ValueError, r"size must be in \[2, 1024\], got 1"),
    (GRID, {"size": 10**6}, ValueError, r"size must be in \[2, 1024\], got 1000000"),
    (GRID, {"size": 0}, ValueError, "size must be"),
    (GRID, {"size": 5.0}, TypeError, "size must be an int"),
    (GRID, {"horizon": 0}, ValueError, r"horizon must be >= 1, got 0"),
    (GRID, {"horizon": -3}, ValueError, "horizon must be"),
    (ARC, {"goal": (1.5, 0.0)}, ValueError, r"goal must lie in the box \[-1, 1\]"),
    (ARC, {"goal": (0.0, -1.01)}, ValueError, "goal must lie in the box"),
    (ARC, {"goal": (float("nan"), 0.0)}, ValueError, "goal must lie in the box"),
    (ARC, {"goal": "ab"}, TypeError, "goal must be a pair"),
    (ARC, {"agent": 6}, ValueError, r"agent must be in \[0, 5\], got 6"),
    (ARC, {"agent": -1}, ValueError, r"agent must be in \[0, 5\], got -1"),
    (ARC, {"agent": 2.0}, TypeError, "agent must be an int"),
    (ARC, {"agent": 0, "goal": (0.0, 0.0)}, ValueError, "either agent or goal"),
    (ARC, {"horizon": 0}, ValueError, r"horizon must be >= 1"),
    (ARC, {"goal_radius": 0.0}, ValueError, "goal_radius must be a finite number > 0"),
    (ARC, {"step_size": -0.1}, ValueError, "step_size must be a finite number > 0"),
    (ARC, {"step_size": float("inf")}, ValueError, "step_size"),
    (ARC, {"goal_radius": "big"}, TypeError, "goal_radius must be a number"),
]


@pytest.mark.parametrize(("env_id", "kwargs", "error", "message"), BAD_TASK_KWARGS)
def test_bad_task_arguments_raise_naming_the_argument(env_id, kwargs, error, message):
    with pytest.raises(error, match=message):
        gym.make(env_id, **kwargs)
    with pytest.raises(error, match=message):
        gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", **kwargs)
    with pytest.raises(error, match=message):
        fedrl_envs.get_family(env_id).make_params(**kwargs)


@pytest.mark.parametrize(("env_id", "action", "error", "message"), [
    (GRID, 4, ValueError, r"action must be an int in \[0, 3\], got 4"),
    (GRID, -1, ValueError, r"action must be an int in \[0, 3\], got -1"),
    (GRID, np.int64(7), ValueError, r"\[0, 3\], got 7"),
    (GRID, 1.0, TypeError, "action must be an integer"),
    (GRID, True, TypeError, "action must be an integer"),
    (GRID, np.array([1]), ValueError, "action must have shape"),
    (GRID, "up", TypeError, "action must be a number"),
    (ARC, 8, ValueError, r"action must be an int in \[0, 7\], got 8"),
    (ARC, -8, ValueError, r"\[0, 7\], got -8"),
])
def test_invalid_action_in_single_env_step(env_id, action, error, message):
    env = unwrapped(env_id)
    env.reset(seed=0)
    state = env.state.clone()
    with pytest.raises(error, match=message):
        env.step(action)
    assert torch.equal(env.state, state) and env._t == 0
    env.step(np.int64(1))  # numpy integers and 0-d tensors are valid actions
    env.step(torch.tensor(2))


@pytest.mark.parametrize(("actions", "error", "message"), [
    (torch.tensor([0, 1, 4, 2]), ValueError, r"action must be an int in \[0, 3\], got 4"),
    (torch.tensor([0, -1, 1, 2]), ValueError, r"\[0, 3\], got -1"),
    (torch.tensor([0, 9, -2, 2]), ValueError, r"got 9 \(and 1 more invalid actions\)"),
    (torch.tensor([0.0, 1.0, 1.0, 2.0]), TypeError, "action must be an integer tensor"),
    (np.array([True, False, True, False]), TypeError, "action must be an integer tensor"),
    (torch.tensor([0, 1, 2]), ValueError, r"actions must have shape \(4,\)"),
    (torch.zeros(4, 1, dtype=torch.int64), ValueError, "actions must have shape"),
    (["a", "b", "c", "d"], TypeError, "actions must be a numeric"),
])
def test_invalid_actions_in_vector_env_leave_it_unchanged(actions, error, message):
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=2, seed=3)
    twin = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=2, seed=3)
    venv.reset()
    twin.reset()
    for _ in range(15):  # the next step ends every episode, so a leaked draw would show
        venv.step(torch.zeros(4, dtype=torch.int64))
        twin.step(torch.zeros(4, dtype=torch.int64))
    state, t, counters = venv.state.clone(), venv._t.clone(), venv.streams.counters.clone()
    with pytest.raises(error, match=message):
        venv.step(actions)
    assert torch.equal(venv.state, state) and torch.equal(venv._t, t) and torch.equal(venv.streams.counters, counters)
    good = torch.tensor([3, 1, 2, 0])
    for out, expected in zip(venv.step(good)[:4], twin.step(good)[:4], strict=True):
        assert torch.equal(out, expected)


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda: FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks, n_envs=0), ValueError, r"n_envs must be in \[1, 16777216\], got 0"),
    (lambda: FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks, n_envs=2**70), ValueError, r"n_envs must be in \[1, 16777216\]"),
    (lambda: FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks, n_envs=2.0), TypeError, "n_envs must be an int"),
    (lambda: FamilyVectorEnv(GRIDWORLD, [], n_envs=1), ValueError, "tasks must be a non-empty"),
    (lambda: FamilyVectorEnv(GRIDWORLD, [GRIDWORLD.make_params(size=4), GRIDWORLD.make_params()]), ValueError, "'size' must be equal"),
    (lambda: FamilyVectorEnv(GRIDWORLD, [GRIDWORLD.make_params(), ARC_NAVIGATION.make_params()]), TypeError, "same family"),
    (lambda: FamilyVectorEnv(GRIDWORLD, ARC_NAVIGATION.make_params()), TypeError, "tasks must be parameters of GridWorldParams"),
    (lambda: FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks, seed="a"), TypeError, "seed must be an int"),
    (lambda: FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks).reset(seed=[1, 2]), ValueError, "seed must be one int"),
    (lambda: FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks).step(torch.zeros(8, dtype=torch.int64)), RuntimeError, "reset"),
])
def test_bad_vector_env_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_closed_vector_env_refuses_to_step():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:1], n_envs=2, seed=0)
    venv.reset()
    venv.close()
    with pytest.raises(ValueError, match="closed"):
        venv.step(torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize(("env_id", "state", "error", "message"), [
    (GRID, 25, ValueError, r"state must be a cell index in \[0, 24\], got values in \[25, 25\]"),
    (GRID, -1, ValueError, r"state must be a cell index in \[0, 24\]"),
    (GRID, 2.5, TypeError, "state must hold integers"),
    (GRID, [1, 2], ValueError, "state must have shape"),
    (ARC, [1.2, 0.0], ValueError, r"state must be a position in the box"),
    (ARC, [0.0, float("nan")], ValueError, "state must be a position"),
    (ARC, [0.0], ValueError, r"state must have shape \(2,\)"),
])
def test_bad_set_state(env_id, state, error, message):
    env = unwrapped(env_id)
    with pytest.raises(error, match=message):
        env.set_state(state)
    with pytest.raises(ValueError, match="t must be >= 0"):
        env.set_state(env.observation_space.sample(), t=-1)


def test_bad_vector_set_state():
    venv = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:1], n_envs=3, seed=0)
    venv.reset()
    state = venv.state.clone()
    for bad, error, message in (
        ([0, 1], ValueError, r"state must have shape \(3,\)"),
        ([0, 1, 25], ValueError, "state must be a cell index"),
        ([0.0, 1.0, 2.0], TypeError, "state must hold integers"),
    ):
        with pytest.raises(error, match=message):
            venv.set_state(bad)
    for bad_t, error, message in ((-1, ValueError, "t must be >= 0"), ([0, 1], ValueError, "t must be an int or have shape"), (0.5, TypeError, "t must be an int")):
        with pytest.raises(error, match=message):
            venv.set_state([0, 1, 2], t=bad_t)
    assert torch.equal(venv.state, state)


def test_step_before_reset_is_refused():
    with pytest.raises(RuntimeError, match="reset"):
        unwrapped(GRID).step(0)


# --------------------------------------------------------------------------------------------
# Reuse with another library
# --------------------------------------------------------------------------------------------
def _exact_return(policy_probs: torch.Tensor, task: GridWorldParams) -> float:
    """Undiscounted expected return of a stationary policy ``[25, 4]`` by dynamic programming."""
    table, r, mu = GRIDWORLD.next_state_table(task), GRIDWORLD.reward_vector(task), GRIDWORLD.start_distribution(task)
    value = torch.zeros(25, dtype=torch.float64)
    for _ in range(task.horizon + 1):
        value = r + (policy_probs.double() * value[table]).sum(-1)
    return float(mu @ value)


def test_sb3_ppo_learns_a_gridworld_task():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.manual_seed(0)
    venv = make_vec_env(GRID, n_envs=8, seed=0, env_kwargs={"agent": 3})
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=128, n_epochs=4, learning_rate=3e-3, gamma=0.9,
                seed=0, device="cpu", policy_kwargs={"net_arch": [32]})
    model.learn(total_timesteps=4096)  # about 5 s on 2 cores
    task = GRIDWORLD.train_tasks[3]
    with torch.no_grad():
        obs = model.policy.obs_to_tensor(np.arange(25))[0]
        probs = model.policy.get_distribution(obs).distribution.probs
    learned = _exact_return(probs, task)
    uniform = _exact_return(torch.full((25, 4), 0.25), task)
    greedy = _exact_return(torch.nn.functional.one_hot(probs.argmax(-1), 4), task)
    # uniform: about 0.51; the optimum (shortest path, then stay): 11.83
    assert learned > uniform + 3.0, (learned, uniform)
    assert greedy > uniform + 6.0, (greedy, uniform)
