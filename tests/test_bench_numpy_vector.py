"""The NumPy vector baselines of ``fedrl bench envs`` have fedrl's dynamics (no timing asserted)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrl_algos.bench.envs import bench_envs
from fedrl_algos.bench.numpy_vector import NumpyArcNavigationVector, NumpyGridWorldVector, numpy_vector_env
from fedrl_algos.cli import main
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, FamilyVectorEnv

GRID, ARC = "fedrl/GridWorld-v0", "fedrl/ArcNavigation-v0"


def _pair(env_id, family, n_envs, seed=0):
    """fedrl's native vector env and the NumPy one over the family's training tasks (one agent each)."""
    tasks = family.train_tasks
    ref = FamilyVectorEnv(family, tasks, n_envs, seed=seed, array_type="numpy")
    ours = numpy_vector_env(env_id, tasks, n_envs)
    ref.reset()
    ours.reset(seed=seed)
    return ref, ours


def _assert_same_step(ref_out, our_out):
    (r_obs, r_rew, r_term, r_trunc, r_info), (o_obs, o_rew, o_term, o_trunc, o_info) = ref_out, our_out
    for ref_x, our_x in ((r_rew, o_rew), (r_term, o_term), (r_trunc, o_trunc)):
        assert ref_x.dtype == our_x.dtype
        np.testing.assert_array_equal(ref_x, our_x)
    assert r_obs.dtype == o_obs.dtype and r_obs.shape == o_obs.shape
    done = r_term | r_trunc
    # Rows that went on are equal; rows that ended are equal up to the start just drawn.
    np.testing.assert_array_equal(r_obs[~done], o_obs[~done])
    assert set(r_info) == set(o_info)
    if done.any():
        np.testing.assert_array_equal(r_info["_final_obs"], o_info["_final_obs"])
        np.testing.assert_array_equal(r_info["final_obs"][done], o_info["final_obs"][done])
        np.testing.assert_array_equal(r_info["final_obs"], o_info["final_obs"])
    return done


def test_factory_gives_fedrl_goals_and_layout():
    grid = numpy_vector_env(GRID, GRIDWORLD.train_tasks, 3)
    assert grid.num_envs == 8 * 3 and grid.goals.tolist() == [t.goal.tolist() for t in GRIDWORLD.train_tasks]
    ref = FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks, 3)
    np.testing.assert_array_equal(grid._goal, ref.params.goal_index.numpy())  # agent-major rows
    arc = numpy_vector_env(ARC, ARC_NAVIGATION.train_tasks, 2)
    np.testing.assert_array_equal(arc._goal, FamilyVectorEnv(ARC_NAVIGATION, ARC_NAVIGATION.train_tasks, 2).params.goal.numpy())
    assert grid.single_action_space == ref.single_action_space and grid.single_observation_space == ref.single_observation_space


def test_gridworld_every_cell_and_action_of_every_agent_steps_as_fedrl():
    ref, ours = _pair(GRID, GRIDWORLD, 25 * 4)
    cells = np.tile(np.arange(100) // 4, 8)
    actions = np.tile(np.arange(100) % 4, 8)
    np.testing.assert_array_equal(ref.set_state(cells), ours.set_state(cells))
    out = ours.step(actions)
    _assert_same_step(ref.step(actions), out)
    assert out[1].sum() == 8 * 4  # each agent's goal cell, under its 4 actions


def test_arc_navigation_steps_as_fedrl_bitwise_near_walls_and_goal_rims():
    n_envs = 400
    ref, ours = _pair(ARC, ARC_NAVIGATION, n_envs)
    n = ours.num_envs  # 6 agents
    rng = np.random.default_rng(1)
    goals = np.repeat(ours.goals, n_envs, axis=0)
    angle = rng.uniform(0, 2 * np.pi, n)
    rim = goals + 0.2 * (1 + rng.uniform(-1e-6, 1e-6, (n, 1))) * np.stack([np.cos(angle), np.sin(angle)], 1)
    anywhere = rng.uniform(-1, 1, (n, 2))
    near_wall = np.clip(rng.uniform(0.9, 1.0, (n, 2)) * rng.choice([-1, 1], (n, 2)), -1, 1)
    for positions in (rim, anywhere, near_wall):
        positions = np.clip(positions, -1, 1).astype(np.float32)
        for a in range(8):
            actions = np.full(n, a)
            np.testing.assert_array_equal(ref.set_state(positions), ours.set_state(positions))
            _assert_same_step(ref.step(actions), ours.step(actions))
    assert ours.step(np.zeros(n, dtype=np.int64))[1].dtype == np.float32


@pytest.mark.parametrize(("env_id", "family"), [(GRID, GRIDWORLD), (ARC, ARC_NAVIGATION)])
def test_random_rollouts_with_staggered_episodes_match_fedrl_through_autoresets(env_id, family):
    """Every step from the same state and actions is fedrl's; after an autoreset the NumPy env is moved to fedrl's start."""
    n_envs = 16
    ref, ours = _pair(env_id, family, n_envs)
    horizon, n = ours.horizon, ours.num_envs
    rng = np.random.default_rng(2)
    n_actions = int(ours.single_action_space.n)
    t = rng.integers(0, horizon + 1, n)  # staggered: a few rows end at each step
    state = ref.set_state(ref.reset()[0], t=t)
    ours.set_state(state, t=t)
    resets = 0
    for _ in range(3 * (horizon + 1)):
        actions = rng.integers(0, n_actions, n)
        ref_out, our_out = ref.step(actions), ours.step(actions)
        done = _assert_same_step(ref_out, our_out)
        assert 0 < done.sum() < done.size  # the partial-reset path, every step
        resets += int(done.sum())
        our_obs = our_out[0]
        assert ours.observation_space.contains(our_obs)
        if env_id == GRID:  # the fresh starts avoid each row's goal
            assert not (our_obs[done] == ours._goal[done]).any()
        t = np.where(done, 0, t + 1)
        np.testing.assert_array_equal(ours._t, t)
        ours.set_state(ref_out[0], t=t)
    assert resets == 3 * n  # each row ends once per horizon + 1 steps


def test_autoreset_draws_with_np_random_for_the_ended_rows_only():
    ours = NumpyGridWorldVector([(0, 0), (4, 4)], 5)
    ours.reset(seed=3)
    t = np.full(10, 3)
    t[[1, 7]] = ours.horizon
    ours.set_state(np.arange(10) + 1, t=t)
    twin = np.random.Generator(type(ours.np_random.bit_generator)())
    twin.bit_generator.state = ours.np_random.bit_generator.state
    obs, *_, info = ours.step(np.zeros(10, dtype=np.int64))
    expected = twin.integers(0, 24, size=2)
    expected += expected >= np.array([0, 24])
    np.testing.assert_array_equal(obs[[1, 7]], expected)
    assert ours.np_random.bit_generator.state == twin.bit_generator.state  # nothing else drawn
    assert info["_final_obs"].tolist() == [i in (1, 7) for i in range(10)]


def test_gridworld_start_distribution_is_fedrls_uniform_over_non_goal_cells():
    n_envs = 2400
    ref, ours = _pair(GRID, GRIDWORLD, n_envs)
    exact = GRIDWORLD.start_distribution(ref.agent_params).numpy()  # [agent, cell]
    for starts in (ours.reset(seed=5)[0], ref.reset(seed=5)[0]):
        counts = np.stack([np.bincount(row, minlength=25) for row in starts.reshape(8, n_envs)])
        assert ((counts == 0) == (exact == 0)).all()  # support: every cell but the goal
        expected = n_envs / 24
        assert np.abs(counts[exact > 0] - expected).max() < 5 * np.sqrt(expected)


def test_arc_navigation_start_distribution_is_fedrls_uniform_box():
    n_envs = 4000
    ref, ours = _pair(ARC, ARC_NAVIGATION, n_envs)
    for starts in (ours.reset(seed=5)[0], ref.reset(seed=5)[0]):
        assert starts.dtype == np.float32 and (starts >= -1).all() and (starts < 1).all()
        counts, _, _ = np.histogram2d(starts[:, 0], starts[:, 1], bins=4, range=[[-1, 1], [-1, 1]])
        expected = starts.shape[0] / 16
        assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)


@pytest.mark.parametrize("cls", [NumpyGridWorldVector, NumpyArcNavigationVector])
def test_same_seed_gives_the_same_trajectories(cls):
    runs = []
    for _ in range(2):
        env = cls([(0, 0), (0.5, 0.5)] if cls is NumpyArcNavigationVector else [(0, 0), (2, 2)], 8)
        obs = [env.reset(seed=11)[0]]
        rng = np.random.default_rng(0)
        for _ in range(40):
            obs.append(env.step(rng.integers(0, env.single_action_space.n, env.num_envs))[0])
        runs.append(np.stack(obs))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_observations_never_alias_the_state():
    env = NumpyArcNavigationVector([(0.0, 0.0)], 4)
    obs, _ = env.reset(seed=0)
    obs[:] = 5.0
    assert (np.abs(env.step(np.zeros(4, dtype=np.int64))[0]) <= 1).all()
    grid = NumpyGridWorldVector([(0, 0)], 4)
    obs, _ = grid.reset(seed=0)
    obs[:] = 1000
    assert (grid.step(np.zeros(4, dtype=np.int64))[0] < 25).all()


def test_bad_input_is_refused_with_the_argument_named():
    env = NumpyGridWorldVector([(0, 0)], 2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(2, dtype=np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="actions"):
        env.step(np.array([0, 4]))
    with pytest.raises(ValueError, match="actions"):
        env.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match="actions"):
        env.step(np.zeros(2))
    with pytest.raises(ValueError, match="goals"):
        NumpyGridWorldVector([(5, 0)])
    with pytest.raises(ValueError, match="goals"):
        NumpyArcNavigationVector([(0.0, 1.5)])
    with pytest.raises(ValueError, match="goal_radius"):
        NumpyArcNavigationVector([(0.0, 0.0)], goal_radius=0.0)
    with pytest.raises(ValueError, match="state"):
        env.set_state([0, 25])
    with pytest.raises(ValueError, match="env_id"):
        numpy_vector_env("CartPole-v1", GRIDWORLD.train_tasks, 1)


def test_bench_envs_quick_records_the_numpy_vector_baseline(tmp_path, capsys):
    records = bench_envs(sizes=(4,), n_agents=2, quick=True, show=False)
    assert [r.env_id for r in records] == [GRID, ARC]
    for r in records:
        assert r.numpy_vector_steps_per_s > 0 and r.numpy_vector_ratio > 0
        assert r.numpy_vector_ratio == pytest.approx(r.native_steps_per_s / r.numpy_vector_steps_per_s)
        assert r.ratio == pytest.approx(r.native_steps_per_s / r.sync_steps_per_s)
    out = tmp_path / "bench.json"
    assert main(["bench", "envs", "--quick", "--sizes", "4", "--agents", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert all(d["numpy_vector_ratio"] > 0 and d["numpy_vector_steps_per_s"] > 0 for d in data)
    printed = capsys.readouterr().out
    assert "NumPy vec" in printed and "vs Sync" in printed
