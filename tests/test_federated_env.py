"""Tests of fedrl_wrappers.FederatedVecEnv (public name wrappers.FederatedVecEnv) (issue 3): separation, agreement, determinism, modes, interop."""

from __future__ import annotations

import importlib
import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import fedrl_envs
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, RandomStreams, derive_keys
from fedrl_envs.family import alive_mask
from fedrl_wrappers import EnvRollout, FederatedVecEnv, GenericFederatedVecEnv, NativeFederatedVecEnv

GRID = "fedrl/GridWorld-v0"
ARC = "fedrl/ArcNavigation-v0"


def random_actions(venv: FederatedVecEnv, n_steps: int, seed: int = 123) -> torch.Tensor:
    """``[n_steps, num_envs]`` uniform discrete actions, from explicit streams."""
    n = int(venv.single_action_space.n)
    u = RandomStreams(derive_keys(seed, torch.arange(1)), venv.device).uniform((n_steps, venv.num_envs))[0]
    return torch.clamp((u * n).long(), max=n - 1)


def run(venv: FederatedVecEnv, actions: torch.Tensor, seed: int | None = None) -> dict[str, list]:
    obs, _ = venv.reset(seed=seed)
    out: dict[str, list] = {"obs": [obs], "reward": [], "terminated": [], "truncated": [], "final_obs": []}
    for a in actions:
        obs, reward, terminated, truncated, info = venv.step(a)
        out["obs"].append(obs)
        out["reward"].append(reward)
        out["terminated"].append(terminated)
        out["truncated"].append(truncated)
        out["final_obs"].append(info.get("final_obs"))
    return out


def assert_same_runs(a: dict[str, list], b: dict[str, list], rows_a=slice(None), rows_b=slice(None)) -> None:
    for key in ("obs", "reward", "terminated", "truncated"):
        for x, y in zip(a[key], b[key], strict=True):
            assert torch.equal(x[rows_a].cpu(), y[rows_b].cpu()), key


# --- construction, spaces, ordering ----------------------------------------------------------------
def test_native_defaults_are_the_paper_federation():
    venv = FederatedVecEnv(GRID, 3, seed=0)
    assert isinstance(venv, NativeFederatedVecEnv) and isinstance(venv, gym.vector.VectorEnv)
    assert (venv.n_agents, venv.n_envs, venv.num_envs) == (8, 3, 24)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert venv.single_observation_space == gym.spaces.Discrete(25)
    assert venv.single_action_space == gym.spaces.Discrete(4)
    assert venv.family is GRIDWORLD
    assert venv.agent_params.goal.tolist() == [list(g) for g in fedrl_envs.gridworld.gridworld_goals()]
    # agent-major rows: row i * n_envs + j belongs to agent i
    assert venv.params.goal[7].tolist() == venv.agent_params.goal[2].tolist()
    arc = FederatedVecEnv(ARC, 2, seed=0)
    assert arc.n_agents == 6 and arc.horizon == 20 and arc.max_episode_steps == 21


def test_agents_by_index_and_agent_kwargs():
    venv = FederatedVecEnv(GRID, 2, agents=[3, 3, 0], seed=0)
    assert venv.agent_params.goal.tolist() == [[4, 4], [4, 4], [0, 0]]
    held_out = ARC_NAVIGATION.heldout_tasks[1]
    arc = FederatedVecEnv(ARC, 2, agent_kwargs=[{"agent": 0}, {"goal": tuple(held_out.goal.tolist())}], seed=0)
    assert torch.equal(arc.agent_params.goal[1], held_out.goal)
    # agents plus per-agent kwargs: merged into each chosen task's arguments
    short = FederatedVecEnv(GRID, 2, agents=[1, 2], agent_kwargs=[{"horizon": 4}, {"horizon": 4}], seed=0)
    assert short.horizon == 4 and short.agent_params.goal.tolist() == [[4, 0], [0, 4]]


def test_structured_view_is_agent_major_and_no_copy():
    venv = FederatedVecEnv(GRID, 4, agents=[0, 1, 2], seed=0)
    obs, _ = venv.reset()
    view = venv.structured(obs)
    assert view.shape == (3, 4)
    assert view.data_ptr() == obs.data_ptr()
    assert torch.equal(view[1, 2], obs[1 * 4 + 2])
    assert venv.structured(np.arange(12)).shape == (3, 4)
    with pytest.raises(ValueError, match="batch"):
        venv.structured(obs[:5])


# --- agent separation --------------------------------------------------------------------------
def test_gridworld_agents_are_rewarded_by_their_own_goal_only():
    venv = FederatedVecEnv(GRID, 5, seed=1)
    goals = venv.agent_params.goal_index  # [8]
    for i in range(venv.n_agents):
        # every env of every agent stands in agent i's goal cell: only agent i is rewarded
        venv.reset()
        venv.set_state(torch.full((venv.num_envs,), int(goals[i])))
        _, reward, *_ = venv.step(torch.zeros(venv.num_envs, dtype=torch.long))
        expected = torch.zeros(venv.n_agents, venv.n_envs)
        expected[i] = 1.0
        assert torch.equal(venv.structured(reward), expected)
    # and along random trajectories reward == 1[state == own goal]
    obs, _ = venv.reset()
    for a in random_actions(venv, 40):
        nxt, reward, _, _, info = venv.step(a)
        assert torch.equal(venv.structured(reward), (venv.structured(obs) == goals[:, None]).float())
        obs = nxt


def test_arc_agents_are_rewarded_by_their_own_goal_only():
    venv = FederatedVecEnv(ARC, 64, seed=2)
    goals = venv.agent_params.goal.numpy().astype(np.float64)  # [6, 2]
    obs, _ = venv.reset()
    hits = np.zeros(venv.n_agents)
    for a in random_actions(venv, 60):
        nxt, reward, *_ = venv.step(a)
        pos = venv.structured(obs).numpy().astype(np.float64)  # [6, 64, 2]
        own = (np.linalg.norm(pos - goals[:, None, :], axis=-1) <= 0.2 + 1e-6).astype(np.float32)
        near_edge = np.abs(np.linalg.norm(pos - goals[:, None, :], axis=-1) - 0.2) < 1e-5
        got = venv.structured(reward).numpy()
        assert np.array_equal(got[~near_edge], own[~near_edge])
        hits += got.sum(1)
        obs = nxt
    # a position at agent 0's goal is rewarded for agent 0 but not for the far agent 5
    venv.reset()
    venv.set_state(venv.agent_params.goal[0].expand(venv.num_envs, 2))
    _, reward, *_ = venv.step(torch.zeros(venv.num_envs, dtype=torch.long))
    assert venv.structured(reward)[0].eq(1).all() and venv.structured(reward)[5].eq(0).all()


# --- agreement with the single gym.make env -------------------------------------------------------
@pytest.mark.parametrize("env_id", [GRID, ARC])
def test_native_batch_agrees_with_single_envs(env_id):
    venv = FederatedVecEnv(env_id, 3, seed=3, autoreset=False)
    start, _ = venv.reset()
    singles = []
    for row in range(venv.num_envs):
        env = gym.make(env_id, **venv.agent_kwargs[row // venv.n_envs])
        env.reset(seed=0)
        env.unwrapped.set_state(venv.state[row].clone())
        singles.append(env)
    actions = random_actions(venv, venv.max_episode_steps, seed=9)
    for a in actions:
        obs, reward, terminated, truncated, _ = venv.step(a)
        for row, env in enumerate(singles):
            o, r, te, tr, _ = env.step(int(a[row]))
            assert np.array_equal(np.asarray(o), obs[row].numpy()), row
            assert r == float(reward[row]) and te == bool(terminated[row]) and tr == bool(truncated[row])
    assert truncated.all()


def test_first_agent_reset_matches_single_env_seeded_alike():
    for env_id in (GRID, ARC):
        venv = FederatedVecEnv(env_id, 1, agents=[2], seed=11)
        obs, _ = venv.reset()
        env = gym.make(env_id, agent=2)
        single, _ = env.reset(seed=11)
        assert np.array_equal(np.asarray(single), obs[0].numpy())


# --- determinism and stream independence ----------------------------------------------------------
@pytest.mark.parametrize("env_id", [GRID, ARC])
def test_same_seed_same_trajectories_bitwise(env_id):
    a = FederatedVecEnv(env_id, 4, seed=5)
    b = FederatedVecEnv(env_id, 4, seed=5)
    actions = random_actions(a, 50)  # crosses autoresets
    ra, rb = run(a, actions), run(b, actions)
    assert_same_runs(ra, rb)
    c = run(FederatedVecEnv(env_id, 4, seed=6), actions)
    assert not all(torch.equal(x, y) for x, y in zip(ra["obs"], c["obs"], strict=True))
    # reset(seed=) re-seeds: the same as constructing with that seed
    assert_same_runs(run(a, actions, seed=6), c)


def test_agent_stream_does_not_depend_on_the_rest_of_the_batch():
    n, steps = 6, 40
    big = FederatedVecEnv(GRID, n, agents=[3, 5, 1], seed=7)
    small = FederatedVecEnv(GRID, n, agents=[3, 0], seed=7)
    actions_big = random_actions(big, steps)
    actions_small = torch.cat([actions_big[:, :n], actions_big[:, n : 2 * n]], dim=1)
    rb, rs = run(big, actions_big), run(small, actions_small)
    assert_same_runs(rb, rs, slice(0, n), slice(0, n))  # agent 3 at position 0 in both
    # stream_ids reproduce an agent that sits elsewhere in another batch
    alone = FederatedVecEnv(GRID, n, agents=[5], seed=7, stream_ids=[1])
    assert_same_runs(rb, run(alone, actions_big[:, n : 2 * n]), slice(n, 2 * n))
    assert_same_runs(rb, run(big.subset([1]), actions_big[:, n : 2 * n]), slice(n, 2 * n))
    # while another stream index gives another start
    other = run(FederatedVecEnv(GRID, n, agents=[5], seed=7), actions_big[:, n : 2 * n])
    assert not torch.equal(other["obs"][0], rb["obs"][0][n : 2 * n])


def test_generic_agent_stream_does_not_depend_on_the_rest_of_the_batch():
    kw = [{"g": 9.0}, {"g": 4.0}, {"g": 12.0}]
    big = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=kw, seed=3)
    small = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=kw[:1], seed=3)
    actions = torch.linspace(-2, 2, 6 * 5).reshape(5, 6, 1)
    rb, rs = run(big, actions), run(small, actions[:, :2])
    assert_same_runs(rb, rs, slice(0, 2))


# --- autoreset and the fixed-horizon mode --------------------------------------------------------
@pytest.mark.parametrize("env_id", [GRID, ARC])
def test_autoreset_final_obs_is_last_obs_of_the_episode(env_id):
    auto = FederatedVecEnv(env_id, 3, seed=8)
    fixed = FederatedVecEnv(env_id, 3, seed=8, autoreset=False)
    steps = auto.max_episode_steps
    actions = random_actions(auto, 2 * steps)
    ra, rf = run(auto, actions[:steps]), run(fixed, actions[:steps])
    for k in range(steps - 1):
        assert rf["final_obs"][k] is None and ra["final_obs"][k] is None
        assert torch.equal(ra["obs"][k + 1], rf["obs"][k + 1])
        assert not ra["truncated"][k].any()
    assert ra["truncated"][-1].all() and rf["truncated"][-1].all()
    assert torch.equal(ra["final_obs"][-1], rf["obs"][-1])  # the finished episode's last observation
    assert not torch.equal(ra["obs"][-1], rf["obs"][-1])  # already the next episode's first
    _, _, _, _, info = auto.step(actions[steps])
    assert "final_obs" not in info
    # the next episode again lasts exactly horizon + 1 steps
    for k in range(steps - 2):
        *_, truncated, info = auto.step(actions[steps + 1 + k])
        assert not truncated.any()
    *_, truncated, info = auto.step(actions[-1])
    assert truncated.all() and info["_final_obs"].all() and info["_final_info"].all()


def test_autoreset_starts_a_fresh_gridworld_episode():
    venv = FederatedVecEnv(GRID, 200, seed=4)
    venv.reset()
    goals = venv.agent_params.goal_index
    venv.set_state(goals.repeat_interleave(200), t=venv.horizon)  # everyone in its goal, last step
    obs, reward, _, truncated, info = venv.step(torch.zeros(venv.num_envs, dtype=torch.long))
    assert truncated.all() and reward.eq(1).all()
    assert (venv.structured(obs) != goals[:, None]).all()  # starts are never the goal cell
    assert len(torch.unique(obs)) > 10


def test_fixed_horizon_mode_steps_exactly_horizon_plus_one_times():
    venv = FederatedVecEnv(GRID, 4, seed=10, autoreset=False)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    actions = random_actions(venv, 16)
    venv.reset()
    for k, a in enumerate(actions):
        obs, reward, terminated, truncated, info = venv.step(a)
        assert info == {} and not terminated.any()
        assert bool(truncated.all()) == (k == 15) and bool(truncated.any()) == (k == 15)
    with pytest.raises(RuntimeError, match="reset"):
        venv.step(actions[0])
    venv.reset()
    venv.step(actions[0])


def test_rollout_collects_whole_trajectories():
    venv = FederatedVecEnv(GRID, 5, agents=[0, 3, 6], seed=12, autoreset=False)
    actions = random_actions(venv, 16, seed=4)
    calls = []

    def policy(obs):
        calls.append(obs.shape)
        return venv.structured(actions[len(calls) - 1])  # [agent, env] actions

    traj = venv.rollout(policy, seed=12)
    assert calls == [(3, 5)] * 16
    assert traj.observations.shape == traj.actions.shape == traj.rewards.shape == (3, 5, 16)
    assert traj.last_observations.shape == (3, 5)
    ref = run(FederatedVecEnv(GRID, 5, agents=[0, 3, 6], seed=12, autoreset=False), actions)
    for t in range(16):
        assert torch.equal(traj.observations[:, :, t], venv.structured(ref["obs"][t]))
        assert torch.equal(traj.rewards[:, :, t], venv.structured(ref["reward"][t]))
        assert torch.equal(traj.actions[:, :, t], venv.structured(actions[t]))
    assert torch.equal(traj.last_observations, venv.structured(ref["obs"][16]))
    assert traj.truncated[:, :, -1].all() and not traj.truncated[:, :, :-1].any() and traj.alive.all()
    # returns follow the goals: reward == 1[obs == own goal]
    goals = venv.agent_params.goal_index
    assert torch.equal(traj.rewards, (traj.observations == goals[:, None, None]).float())
    with pytest.raises(ValueError, match="n_steps"):
        venv.rollout(policy, n_steps=17)


def test_rollout_returns_an_env_rollout():
    venv = FederatedVecEnv(GRID, 2, agents=[0, 1], seed=3, autoreset=False)
    assert type(venv.rollout(lambda obs: torch.zeros(obs.shape, dtype=torch.long))) is EnvRollout
    for module in ("wrappers", "wrappers.federated", "fedrl_wrappers", "fedrl_wrappers.federated"):
        assert importlib.import_module(module).EnvRollout is EnvRollout
    with pytest.raises(AttributeError, match="NoSuchName"):
        import wrappers

        wrappers.NoSuchName  # noqa: B018


def _cumsum_alive(terminated: torch.Tensor) -> torch.Tensor:
    """The mask EnvRollout.alive computed before it used alive_mask: no termination strictly before t."""
    done = terminated.to(torch.int32)
    return torch.cumsum(done, dim=-1) - done == 0


def test_env_rollout_alive_is_the_shared_episode_mask():
    T = 5
    cases = [
        [0, 0, 0, 0, 0],  # never terminates
        [1, 0, 0, 0, 0],  # terminates at the first step: only that step is alive
        [0, 0, 0, 0, 1],  # terminates at the last step: every step is alive
        [0, 1, 1, 1, 1],  # padded after an early termination (fixed-horizon mode)
        [0, 0, 1, 0, 1],  # terminated again later (autoreset mode): the mask stops at the first
        [1, 1, 1, 1, 1],
    ]
    terminated = torch.tensor(cases, dtype=torch.bool).reshape(2, 3, T)
    zeros = torch.zeros(2, 3, T)
    rollout = EnvRollout(zeros, zeros.long(), zeros, terminated, torch.zeros_like(terminated), zeros[:, :, 0])
    expected = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]],
        dtype=torch.bool,
    ).reshape(2, 3, T)
    assert torch.equal(rollout.alive, expected)
    assert torch.equal(alive_mask(terminated), _cumsum_alive(terminated))
    # every termination pattern of 6 steps, and a one-step horizon
    patterns = torch.tensor([[(k >> t) & 1 for t in range(6)] for k in range(64)], dtype=torch.bool)
    assert torch.equal(alive_mask(patterns), _cumsum_alive(patterns))
    assert torch.equal(alive_mask(patterns[:, :1]), torch.ones(64, 1, dtype=torch.bool))
    # a batch in which nothing terminates before its last step (the scan is skipped): every step alive
    last_only = torch.zeros(3, 4, 7, dtype=torch.bool)
    last_only[..., -1] = True
    for batch in (torch.zeros(3, 4, 7, dtype=torch.bool), last_only, last_only.float()):
        assert torch.equal(alive_mask(batch), torch.ones(3, 4, 7, dtype=torch.bool))
    # on a real rollout (time axis a non-contiguous view) as well
    traj = FederatedVecEnv("CartPole-v1", 3, agent_kwargs=[{}, {}], seed=0, autoreset=False).rollout(
        lambda obs: torch.ones(obs.shape[:2], dtype=torch.long), n_steps=40
    )
    assert traj.terminated.any() and torch.equal(traj.alive, _cumsum_alive(traj.terminated))


def test_generic_fixed_horizon_pads_after_termination():
    venv = FederatedVecEnv("CartPole-v1", 3, agent_kwargs=[{}, {}], seed=0, autoreset=False)
    assert venv.horizon == 499
    traj = venv.rollout(lambda obs: torch.ones(obs.shape[:2], dtype=torch.long), n_steps=40)
    alive = traj.alive
    lengths = alive.sum(-1)
    assert (lengths < 40).all()  # always pushing right topples the pole early
    assert torch.equal(traj.rewards.sum(-1), lengths.float())  # reward 1 per real step, 0 after
    first_done = traj.terminated.float().argmax(-1)
    assert torch.equal(first_done + 1, lengths)
    for i in range(2):
        for j in range(3):
            end = int(lengths[i, j])
            last = traj.observations[i, j, end - 1]
            assert traj.terminated[i, j, end - 1:].all()
            # the terminal observation breaks a CartPole limit and then stays frozen
            frozen = traj.observations[i, j, end:]
            assert (frozen == frozen[:1]).all() if end < 40 else True
            assert torch.equal(traj.last_observations[i, j], frozen[-1] if end < 40 else last)
            assert abs(float(frozen[0, 0])) > 2.4 or abs(float(frozen[0, 2])) > 12 * 2 * math.pi / 360


@pytest.mark.parametrize("array_type", ["torch", "numpy"])
def test_generic_fixed_horizon_stops_stepping_an_agent_whose_episodes_all_ended(monkeypatch, array_type):
    # Agent 0 pushes right every step (topples in ~10 steps), agent 1 alternates (up for 40 steps).
    def policy(obs):
        step = policy.calls
        policy.calls += 1
        return torch.stack([torch.ones(3, dtype=torch.long), torch.full((3,), step % 2)])

    def run(skip_idle: bool):
        venv = FederatedVecEnv("CartPole-v1", 3, agent_kwargs=[{}, {"sutton_barto_reward": True}], seed=0, autoreset=False,
                               array_type=array_type)
        if not skip_idle:
            monkeypatch.setattr(venv, "_idle_agents", lambda: [False] * venv.n_agents)
        steps = [0, 0]
        for i, agent_env in enumerate(venv.agent_envs):
            inner = agent_env.step

            def counted(actions, i=i, inner=inner):
                steps[i] += 1
                return inner(actions)

            agent_env.step = counted
        policy.calls = 0
        return venv.rollout(policy, n_steps=40), steps

    skipped, steps = run(True)
    stepped, all_steps = run(False)
    for name in ("observations", "actions", "rewards", "terminated", "truncated", "last_observations"):
        a, b = getattr(skipped, name), getattr(stepped, name)
        assert (np.array_equal(a, b) if array_type == "numpy" else torch.equal(a, b)), name
    lengths = np.asarray(skipped.alive.sum(-1))
    assert lengths[0].max() < 40 and lengths[1].max() == 40
    # the toppled agent's vector env is stepped until its last episode ends, never after
    assert steps == [int(lengths[0].max()), 40] and all_steps == [40, 40]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "fedrl/CartPole-v0"])
def test_rollout_stop_when_done_returns_the_prefix_up_to_the_last_termination(env_id):
    kwargs = {"agent_kwargs": [{}, {}]} if env_id == "CartPole-v1" else {}
    push_right = lambda obs: torch.ones(obs.shape[:2], dtype=torch.long)  # noqa: E731 (topples every pole)
    full = FederatedVecEnv(env_id, 3, seed=0, autoreset=False, **kwargs).rollout(push_right, n_steps=60)
    short = FederatedVecEnv(env_id, 3, seed=0, autoreset=False, **kwargs).rollout(push_right, n_steps=60, stop_when_done=True)
    steps = short.rewards.shape[2]
    assert steps == int(full.alive.sum(-1).max()) < 60  # up to the step on which the last pole fell
    for name in ("observations", "actions", "rewards", "terminated", "truncated"):
        assert torch.equal(getattr(short, name), getattr(full, name)[:, :, :steps]), name
    assert torch.equal(short.last_observations, full.last_observations)  # frozen since every env terminated
    # autoreset mode: nothing is padding, so the whole block is collected
    again = FederatedVecEnv(env_id, 3, seed=0, autoreset=True, **kwargs).rollout(push_right, n_steps=60, stop_when_done=True)
    assert again.rewards.shape[2] == 60
    with pytest.raises(TypeError, match="stop_when_done must be a bool"):
        FederatedVecEnv(env_id, 3, seed=0, autoreset=False, **kwargs).rollout(push_right, n_steps=60, stop_when_done=1)


def test_native_fixed_horizon_pads_after_termination():
    if "fedrl/CartPole-v0" not in fedrl_envs.FAMILIES:
        pytest.skip("no native family with early termination registered")
    venv = FederatedVecEnv("fedrl/CartPole-v0", 3, agents=[0, 1], seed=0, autoreset=False)
    traj = venv.rollout(lambda obs: torch.ones(obs.shape[:2], dtype=torch.long), n_steps=40)
    lengths = traj.alive.sum(-1)
    assert (lengths < 40).all()
    assert torch.equal(traj.rewards.sum(-1), lengths.float())  # reward 1 per real step, 0 after
    for i in range(2):
        for j in range(3):
            end = int(lengths[i, j])
            assert traj.terminated[i, j, end - 1 :].all() and not traj.terminated[i, j, : end - 1].any()
            frozen = traj.observations[i, j, end:]
            assert (frozen == frozen[:1]).all() and torch.equal(traj.last_observations[i, j], frozen[-1])


def test_generic_autoreset_final_obs():
    venv = FederatedVecEnv("CartPole-v1", 4, agent_kwargs=[{}, {}], seed=1)
    obs, _ = venv.reset()
    seen = 0
    for _ in range(60):
        obs, reward, terminated, truncated, info = venv.step(torch.ones(8, dtype=torch.long))
        assert obs.dtype == torch.float32 and reward.dtype == torch.float32 and terminated.dtype == torch.bool
        if "final_obs" in info:
            mask = info["_final_obs"]
            assert torch.equal(mask, terminated | truncated)
            final = info["final_obs"]
            assert torch.equal(final[~mask], obs[~mask])
            broke = (final[mask, 0].abs() > 2.4) | (final[mask, 2].abs() > 12 * 2 * math.pi / 360)
            assert broke.all()
            assert (obs[mask].abs() <= 0.05).all()  # fresh starts
            seen += int(mask.sum())
    assert seen >= 8


# --- CPU/CUDA agreement ------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_id", [GRID, ARC])
def test_cpu_and_cuda_agree_bitwise(env_id):
    cpu = FederatedVecEnv(env_id, 16, seed=13)
    gpu = FederatedVecEnv(env_id, 16, seed=13, device="cuda")
    actions = random_actions(cpu, 45)
    rc, rg = run(cpu, actions), run(gpu, actions.cuda())
    assert rg["obs"][0].device.type == "cuda"
    assert_same_runs(rc, rg)


def test_cuda_unavailable_is_a_value_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(ValueError, match="device"):
        FederatedVecEnv(GRID, 2, device="cuda")


# --- generic backend ------------------------------------------------------------------------------
def test_generic_pendulum_per_agent_gravity_changes_the_dynamics():
    gs = [2.0, 10.0, 20.0]
    venv = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=[{"g": g} for g in gs], seed=0, stream_ids=[0, 0, 0])
    assert isinstance(venv, GenericFederatedVecEnv) and venv.family is None
    assert (venv.n_agents, venv.num_envs) == (3, 6) and venv.single_action_space.shape == (1,)
    assert [v.get_attr("g")[0] for v in venv.agent_envs] == gs
    obs, _ = venv.reset()
    assert torch.equal(venv.structured(obs)[0], venv.structured(obs)[2])  # same streams: same starts
    u = np.full((6, 1), 0.5, dtype=np.float32)
    for _ in range(5):
        nxt, *_ = venv.step(u)
        th = torch.atan2(obs[:, 1], obs[:, 0]).double()
        thdot = obs[:, 2].double()
        g = torch.tensor(gs, dtype=torch.float64).repeat_interleave(2)
        new_thdot = torch.clamp(thdot + (3 * g / 2 * torch.sin(th) + 3.0 * 0.5) * 0.05, -8, 8)
        new_th = th + new_thdot * 0.05
        expected = torch.stack([torch.cos(new_th), torch.sin(new_th), new_thdot], -1)
        assert torch.allclose(nxt.double(), expected, atol=1e-5)
        obs = nxt
    per_agent = venv.structured(obs)
    assert not torch.allclose(per_agent[0], per_agent[1]) and not torch.allclose(per_agent[1], per_agent[2])


def test_generic_actions_as_numpy_or_torch():
    a = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=[{"g": 5.0}], seed=4)
    b = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=[{"g": 5.0}], seed=4)
    a.reset(), b.reset()
    for k in range(3):
        act = np.array([[0.3 * k], [-1.0]], dtype=np.float32)
        oa, ra, *_ = a.step(act)
        ob, rb, *_ = b.step(torch.from_numpy(act))
        assert torch.equal(oa, ob) and torch.equal(ra, rb)


# --- Stable-Baselines3 view ---------------------------------------------------------------------
def test_sb3_view_steps_the_agents_mdp():
    from stable_baselines3.common.vec_env import VecEnv

    fed = FederatedVecEnv(GRID, 4, agents=[1, 6, 2], seed=21)
    view = fed.to_sb3(agent=1, monitor=False)
    assert isinstance(view, VecEnv) and view.num_envs == 4
    assert view.observation_space == gym.spaces.Discrete(25) and view.action_space == gym.spaces.Discrete(4)
    actions = random_actions(fed, 20)
    ref = run(fed, actions)
    view.seed(21)
    obs = view.reset()
    assert isinstance(obs, np.ndarray) and np.array_equal(obs, ref["obs"][0][4:8].numpy())
    for k in range(20):
        obs, rewards, dones, infos = view.step(actions[k, 4:8].numpy())
        assert isinstance(rewards, np.ndarray) and rewards.dtype == np.float32 and dones.dtype == bool
        assert np.array_equal(obs, ref["obs"][k + 1][4:8].numpy())
        assert np.array_equal(rewards, ref["reward"][k][4:8].numpy())
        assert dones.all() == (k == 15) and dones.any() == (k == 15)
        if k == 15:
            for j, info in enumerate(infos):
                assert info["TimeLimit.truncated"] is True
                assert info["terminal_observation"] == ref["final_obs"][k][4 + j].item()
        else:
            assert all("terminal_observation" not in i and i["TimeLimit.truncated"] is False for i in infos)
    # the view is a copy: the federation itself did not move
    assert fed.to_sb3(agent=None, monitor=False).num_envs == 12


def test_sb3_view_helpers():
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import VecMonitor

    fed = FederatedVecEnv(GRID, 3, agents=[0, 1], seed=0)
    assert isinstance(fed.to_sb3(agent=0), VecMonitor)
    view = fed.to_sb3(agent=1, monitor=False)
    assert view.env_is_wrapped(Monitor) == [False] * 3
    assert view.get_attr("n_agents") == [1, 1, 1] and view.get_attr("horizon", indices=[0]) == [15]
    assert view.env_method("structured", torch.arange(3), indices=[2])[0].shape == (1, 3)
    view.set_attr("custom", 5)
    assert view.get_attr("custom") == [5] * 3
    with pytest.raises(ValueError, match="indices"):
        view.set_attr("custom", 6, indices=[0])
    assert view.seed(3) == [3, 4, 5]
    view.reset()
    view.close()
    with pytest.raises(ValueError, match="agent must be in"):
        fed.to_sb3(agent=2)
    with pytest.raises(TypeError, match="agent"):
        fed.to_sb3(agent="0")
    with pytest.raises(ValueError, match=r"agents\[0\] must be in \[0, 1\], got 3 \(this federation's agent list has 2\)"):
        fed.subset([3])
    generic = FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {"max_episode_steps": 50}], seed=0)
    gview = generic.to_sb3(agent=1, monitor=False)
    assert gview.get_attr("spec")[0].max_episode_steps == 50
    assert gview.env_is_wrapped(gym.wrappers.TimeLimit) == [True, True]
    gview.reset()
    obs, rewards, dones, infos = gview.step(np.array([0, 1]))
    assert obs.shape == (2, 4) and rewards.tolist() == [1.0, 1.0]


def test_sb3_adapter_checks_the_vector_env_contract_not_the_class():
    from fedrl_wrappers.sb3 import SB3VecEnv

    family_venv = fedrl_envs.FamilyVectorEnv(GRIDWORLD, GRIDWORLD.train_tasks[:2], n_envs=2, seed=0)
    view = SB3VecEnv(family_venv)
    assert view.num_envs == 4 and view.reset().shape == (4,)
    with pytest.raises(TypeError, match="venv must be"):
        SB3VecEnv(gym.make(GRID))
    with pytest.raises(ValueError, match="autoreset=True"):
        SB3VecEnv(FederatedVecEnv(GRID, 2, seed=0, autoreset=False))


def test_sb3_ppo_smoke(one_torch_thread):
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", FederatedVecEnv(ARC, 4, seed=0).to_sb3(agent=2), n_steps=32, batch_size=64, n_epochs=1, seed=0)
    model.learn(256)
    action, _ = model.predict(np.zeros((3, 2), dtype=np.float32))
    assert action.shape == (3,) and ((0 <= action) & (action < 8)).all()


@pytest.fixture
def one_torch_thread():
    """Tiny networks run fastest single-threaded (and do not stall when the cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sb3_ppo_learns_one_agents_gridworld(one_torch_thread):
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy

    fed = FederatedVecEnv(GRID, 8, seed=0)
    env = fed.to_sb3(agent=3)  # goal (4, 4)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=128, learning_rate=3e-3, gamma=0.9, ent_coef=0.0, seed=0)
    random_return, _ = evaluate_policy(model, env, n_eval_episodes=24, deterministic=False)
    model.learn(15_000)
    mean_return, _ = evaluate_policy(model, env, n_eval_episodes=48, deterministic=True)
    # optimal: 16 - mean Manhattan distance to (4, 4) over non-goal starts = 16 - 100/24 ≈ 11.8
    assert mean_return >= 10.0 > random_return + 5


# --- Gymnasium interop ------------------------------------------------------------------------
def test_whole_federation_through_gymnasiums_numpy_conversion():
    pytest.importorskip("array_api_compat")
    from gymnasium.wrappers.vector import ArrayConversion, RecordEpisodeStatistics

    fed = FederatedVecEnv(GRID, 3, agents=[0, 3], seed=14)
    wrapped = RecordEpisodeStatistics(ArrayConversion(fed, env_xp=torch, target_xp=np))
    actions = random_actions(fed, 16)
    ref = run(FederatedVecEnv(GRID, 3, agents=[0, 3], seed=14), actions)
    obs, _ = wrapped.reset()
    assert isinstance(obs, np.ndarray) and np.array_equal(obs, ref["obs"][0].numpy())
    total = np.zeros(6)
    for k in range(16):
        obs, reward, terminated, truncated, info = wrapped.step(actions[k].numpy())
        assert isinstance(reward, np.ndarray) and np.array_equal(obs, ref["obs"][k + 1].numpy())
        total += reward
    assert truncated.all() and isinstance(info["final_obs"], np.ndarray)
    assert np.array_equal(info["final_obs"], ref["final_obs"][15].numpy())
    assert np.allclose(info["episode"]["r"], total) and (info["episode"]["l"] == 16).all()


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"agents": []}, ValueError, "agents"),
        ({"agents": [0, 8]}, ValueError, "agents"),
        ({"agents": [-1]}, ValueError, "agents"),
        ({"agents": 3}, TypeError, "agents"),
        ({"agents": [True]}, TypeError, "agents"),
        ({"agents": [0.5]}, TypeError, "agents"),
        ({"n_envs": 0}, ValueError, "n_envs"),
        ({"n_envs": 2.0}, TypeError, "n_envs"),
        ({"agents": [0, 1], "agent_kwargs": [{}]}, ValueError, "agent_kwargs"),
        ({"agent_kwargs": []}, ValueError, "agent_kwargs"),
        ({"agent_kwargs": {"goal": (1, 1)}}, TypeError, "agent_kwargs"),
        ({"agent_kwargs": [{"goal": (9, 9)}]}, ValueError, "agent_kwargs"),
        ({"agent_kwargs": [{"colour": 3}]}, TypeError, "agent_kwargs"),
        ({"seed": "zero"}, TypeError, "seed"),
        ({"device": "not-a-device"}, ValueError, "device"),
        ({"autoreset": "yes"}, TypeError, "autoreset"),
        ({"stream_ids": [0]}, ValueError, "stream_ids"),
        ({"stream_ids": [0, 1, 2, 3, 4, 5, 6, -7]}, ValueError, r"stream_ids\[7\] must be >= 0, got -7"),
        ({"stream_ids": [0.0] * 8}, TypeError, r"stream_ids\[0\] must be an int"),
        ({"vectorization_mode": "sync"}, ValueError, "vectorization_mode is for the generic backend"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, name):
    args = {"env_id": GRID, "n_envs": 2, **kwargs}
    with pytest.raises(error, match=name):
        FederatedVecEnv(args.pop("env_id"), args.pop("n_envs"), **args)


def test_bad_env_ids_and_generic_arguments():
    with pytest.raises(TypeError, match="env_id"):
        FederatedVecEnv(3, 2)
    with pytest.raises(ValueError, match="env_id"):
        FederatedVecEnv("NoSuchEnv-v9", 2)
    with pytest.raises(ValueError, match="agents"):
        FederatedVecEnv("CartPole-v1", 2, agents=[0])
    with pytest.raises(ValueError, match="n_envs"):
        FederatedVecEnv("CartPole-v1", 0)
    with pytest.raises(TypeError, match=r"agent_kwargs\[1\]"):
        FederatedVecEnv("Pendulum-v1", 1, agent_kwargs=[{}, {"gravity": 3.0}])


@pytest.mark.parametrize("env_id", [GRID, ARC])
@pytest.mark.parametrize(
    ("make_actions", "error", "match"),
    [
        (lambda n: torch.zeros(n - 1, dtype=torch.long), ValueError, "shape"),
        (lambda n: torch.zeros(n, 1, dtype=torch.long), ValueError, "shape"),
        (lambda n: torch.zeros(n), TypeError, "integer"),
        (lambda n: np.zeros(n, dtype=bool), TypeError, "integer"),
        (lambda n: np.full(n, 99), ValueError, "action"),
        (lambda n: torch.full((n,), -1), ValueError, "action"),
        (lambda n: ["up"] * n, TypeError, "actions"),
    ],
)
def test_rejected_native_step_leaves_the_env_unchanged(env_id, make_actions, error, match):
    venv = FederatedVecEnv(env_id, 3, seed=15)
    twin = FederatedVecEnv(env_id, 3, seed=15)
    actions = random_actions(venv, 20)
    venv.reset(), twin.reset()
    for a in actions[:5]:
        venv.step(a), twin.step(a)
    state, t, counters = venv.state.clone(), venv._t.clone(), venv.streams.counters.clone()
    with pytest.raises(error, match=match):
        venv.step(make_actions(venv.num_envs))
    assert torch.equal(venv.state, state) and torch.equal(venv._t, t) and torch.equal(venv.streams.counters, counters)
    for a in actions[5:]:  # and it goes on exactly like its twin, through the autoreset
        ov, rv, *_ = venv.step(a)
        ot, rt, *_ = twin.step(a)
        assert torch.equal(ov, ot) and torch.equal(rv, rt)


def test_rejected_generic_step_leaves_the_env_unchanged():
    venv = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=[{"g": 3.0}, {"g": 9.0}], seed=2)
    twin = FederatedVecEnv("Pendulum-v1", 2, agent_kwargs=[{"g": 3.0}, {"g": 9.0}], seed=2)
    venv.reset(), twin.reset()
    good = np.zeros((4, 1), dtype=np.float32)
    bad = [
        (np.zeros((4,), dtype=np.float32), ValueError, "shape"),
        (np.zeros((3, 1), dtype=np.float32), ValueError, "shape"),
        (np.full((4, 1), np.nan, dtype=np.float32), ValueError, "finite"),
        (np.array([[0.0], [np.inf], [0.0], [0.0]], dtype=np.float32), ValueError, "finite"),
        (np.zeros((4, 1), dtype=bool), TypeError, "actions"),
        (np.array([["a"]] * 4), TypeError, "actions"),
    ]
    for actions, error, match in bad:
        with pytest.raises(error, match=match):
            venv.step(actions)
    for _ in range(3):
        ov, rv, *_ = venv.step(good)
        ot, rt, *_ = twin.step(good)
        assert torch.equal(ov, ot) and torch.equal(rv, rt)
    # out-of-bounds torques are the environment's business: Pendulum clips them to [-2, 2]
    ov, rv, *_ = venv.step(np.full((4, 1), 5.0, dtype=np.float32))
    ot, rt, *_ = twin.step(np.full((4, 1), 2.0, dtype=np.float32))
    assert torch.equal(ov, ot)
    cart = FederatedVecEnv("CartPole-v1", 2, seed=0)
    cart.reset()
    with pytest.raises(TypeError, match="integers"):
        cart.step(np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="lie in"):
        cart.step(np.array([0, 2]))


@pytest.mark.parametrize("env_id", [GRID, "CartPole-v1"])
def test_stepping_a_closed_env_is_a_value_error(env_id):
    venv = FederatedVecEnv(env_id, 2, seed=0)
    venv.reset()
    venv.close()
    with pytest.raises(ValueError, match="closed"):
        venv.step(np.zeros(venv.num_envs, dtype=np.int64))


@pytest.mark.parametrize("env_id", [GRID, "CartPole-v1"])
def test_step_before_reset_is_refused(env_id):
    venv = FederatedVecEnv(env_id, 2, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        venv.step(np.zeros(venv.num_envs, dtype=np.int64))


# --- the benchmark command ----------------------------------------------------------------------
def test_bench_envs_quick_smoke(tmp_path, capsys):
    from fedrl_algos.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "envs", "--quick", "--sizes", "4", "--agents", "2", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [(r["env_id"], r["n_agents"], r["n_envs"]) for r in records] == [(GRID, 2, 4), (ARC, 2, 4)]
    for r in records:
        assert r["native_steps_per_s"] > 0 and r["sync_steps_per_s"] > 0 and r["rollout_steps_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["native_steps_per_s"] / r["sync_steps_per_s"])
        assert r["env_mb"] > 0
    assert "GridWorld" in capsys.readouterr().out
