"""Autoreset draws noise only for the rows that end, with the numbers the full-batch draw gives them."""

import copy

import pytest
import torch

from fedrl_envs.arc_navigation import ARC_NAVIGATION
from fedrl_envs.cartpole import CARTPOLE
from fedrl_envs.gridworld import GRIDWORLD
from fedrl_envs.pendulum import PENDULUM
from fedrl_envs.rng import RandomStreams
from fedrl_envs.vector import FamilyVectorEnv


def test_bits_at_equals_the_words_bits_would_draw():
    streams = RandomStreams.from_seed(7, 5)
    streams.counters = torch.tensor([0, 3, 11, 2**40, 5])
    full = copy.deepcopy(streams).bits((6, 3))  # [5, 6, 3]
    idx = torch.tensor([[1], [3], [4]])
    offsets = torch.tensor([[0, 1, 2], [9, 10, 11], [15, 16, 17]])
    got = streams.bits_at(idx, offsets)
    assert torch.equal(got, full.reshape(5, 18)[idx.squeeze(1).unsqueeze(1), offsets])
    assert torch.equal(streams.counters, torch.tensor([0, 3, 11, 2**40, 5]))  # nothing advanced
    streams.advance(18, where=torch.tensor([True, False, True, False, False]))
    assert streams.counters.tolist() == [18, 3, 29, 2**40, 5]


def _full_draw_step(env: FamilyVectorEnv, actions: torch.Tensor):
    """The previous autoreset: draw every row's reset state, keep it where an episode ended."""
    next_state, reward, terminated = env.family.step(env._state, actions, env.params)
    t = env._t + 1
    truncated = t >= env.horizon + 1
    done = terminated | truncated
    if bool(done.any()):
        fresh = env._draw_reset_states(agents=env.structured(done).any(1))
        mask = done.reshape(done.shape + (1,) * (next_state.dim() - 1))
        next_state = torch.where(mask, fresh, next_state)
        t = torch.where(done, 0, t)
    env._state, env._t = next_state, t
    return env._observe(next_state)


@pytest.mark.parametrize("family", [CARTPOLE, PENDULUM, GRIDWORLD, ARC_NAVIGATION], ids=lambda f: f.env_id)
def test_rows_only_reset_gives_the_full_draws_trajectories(family):
    tasks = family.train_tasks[:3]
    tasks = [family.make_params(**(family.task_kwargs(t) | {"horizon": 7})) for t in tasks]
    new, old = (FamilyVectorEnv(family, tasks, n_envs=5, seed=3) for _ in range(2))
    new.reset(seed=3)
    old.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        space = new.single_action_space
        if hasattr(space, "n"):
            actions = torch.randint(0, int(space.n), (new.num_envs,), generator=gen)
        else:
            actions = torch.rand((new.num_envs, *space.shape), generator=gen) * 4 - 2
        obs_new = new.step(actions)[0]
        obs_old = _full_draw_step(old, actions)
        assert torch.equal(obs_new, obs_old)
        assert torch.equal(new.state, old.state)
        assert torch.equal(new.streams.counters, old.streams.counters)


@pytest.mark.parametrize("family", [CARTPOLE, PENDULUM, ARC_NAVIGATION], ids=lambda f: f.env_id)
def test_states_keep_contiguous_components_and_observations_are_row_major_copies(family):
    env = FamilyVectorEnv(family, family.train_tasks[:2], n_envs=6, seed=1)
    obs, _ = env.reset()
    for _ in range(12):
        for component in env.state.unbind(-1):
            # the layout the kernels run vectorized on, for the families that compute on components
            assert component.is_contiguous() == family.state_as_components
        assert obs.is_contiguous() and obs.data_ptr() != env.state.data_ptr()
        obs = env.step(torch.zeros(env.num_envs, dtype=torch.int64) if hasattr(env.single_action_space, "n")
                       else torch.zeros(env.num_envs, *env.single_action_space.shape))[0]
    before = env.state.clone()
    obs.add_(1.0)  # writing into what the env returned never reaches its state
    assert torch.equal(env.state, before)
    user_state = before.contiguous()  # a row-major batch from the caller
    env.set_state(user_state)
    assert torch.equal(env.state, user_state) and env.state.unbind(-1)[0].is_contiguous() == family.state_as_components


def test_reset_word_bases_follow_new_keys():
    # The per-row reset words are cached per stream keys: a new seed or loaded streams rebuild them.
    def trajectory(env, seed=None, streams=None):
        env.reset(seed=seed)
        if streams is not None:
            env.streams.load_state_dict(streams)
        gen = torch.Generator().manual_seed(4)
        return torch.stack([env.step(torch.randint(0, 2, (env.num_envs,), generator=gen))[0] for _ in range(60)])

    env = FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:3], n_envs=4, seed=0)
    first = trajectory(env, seed=0)
    other = trajectory(env, seed=1)
    assert not torch.equal(first, other)
    assert torch.equal(other, trajectory(FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:3], n_envs=4, seed=1), seed=1))
    saved = FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:3], n_envs=4, seed=0)
    saved.reset(seed=0)
    again = trajectory(env, seed=1, streams=saved.streams.state_dict())  # seed 1's env, seed 0's streams
    fresh = trajectory(FamilyVectorEnv(CARTPOLE, CARTPOLE.train_tasks[:3], n_envs=4, seed=1), seed=1,
                       streams=saved.streams.state_dict())
    assert torch.equal(again, fresh)
