"""MuJoCo and Atari ids through FederatedVecEnv's generic backend, with per-agent heterogeneity.

Agents that share a random stream (``stream_ids=[0, 0, 0]``) and the same actions show the effect
of their task alone: two identical agents stay identical, the one with other dynamics departs.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_wrappers import FederatedVecEnv
from fedrl_wrappers.heterogeneity import (
    AtariPreprocess,
    BodyMassScale,
    FrictionScale,
    MuJoCoDynamics,
    atari_agent_kwargs,
    factory_from_json,
    factory_to_json,
    mujoco_agent_kwargs,
)

mujoco = pytest.importorskip("mujoco", reason="the MuJoCo extra: pip install 'fedrl[mujoco]'")
ale_py = pytest.importorskip("ale_py", reason="the Atari extra: pip install 'fedrl[atari]'")

MUJOCO_IDS = ["HalfCheetah-v5", "Hopper-v5"]
ATARI_IDS = ["ALE/Pong-v5", "ALE/Breakout-v5"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _first_difference(venv, actions, steps):
    """Step ``venv`` with ``actions(t)``; the first step at which agent 2 departs from agent 0, and
    whether agents 0 and 1 stayed identical throughout."""
    obs, _ = venv.reset(seed=0)
    twins, first = bool(torch.equal(venv.structured(obs)[0], venv.structured(obs)[1])), None
    for t in range(steps):
        obs, *_ = venv.step(actions(t))
        s = venv.structured(obs)
        twins &= bool(torch.equal(s[0], s[1]))
        if first is None and not torch.equal(s[0], s[2]):
            first = t
    return first, twins


# --- MuJoCo ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", MUJOCO_IDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("knob", ["mass_scale", "friction_scale"])
def test_mujoco_heterogeneity_changes_the_dynamics(env_id, device, knob):
    kwargs = mujoco_agent_kwargs(**{knob: [1.0, 1.0, 1.5 if knob == "mass_scale" else 0.3]})
    venv = FederatedVecEnv(env_id, 2, agent_kwargs=kwargs, device=device, seed=0, stream_ids=[0, 0, 0])
    try:
        assert venv.backend == "generic" and venv.num_envs == 6
        g = torch.Generator().manual_seed(0)
        act_shape = venv.single_action_space.shape

        def actions(t):
            a = torch.rand(1, 2, *act_shape, generator=g) * 2 - 1
            return a.expand(3, -1, -1).reshape(6, *act_shape)  # the same actions for every agent

        first, twins = _first_difference(venv, actions, 12)
        assert twins, "agents with the same task and stream must stay identical"
        assert first is not None, f"{knob} had no effect"
        if knob == "mass_scale":
            assert first == 0  # a heavier body reacts less to the first torque
        obs, reward, term, trunc, _ = venv.step(actions(0))
        assert obs.device.type == device and obs.shape == (6, *venv.single_observation_space.shape)
        assert reward.dtype == torch.float32 and term.dtype == torch.bool
    finally:
        venv.close()


def test_body_mass_and_friction_scale_the_model():
    base = gym.make("Hopper-v5").unwrapped.model
    env = FrictionScale(BodyMassScale(gym.make("Hopper-v5"), 1.5), 0.5)
    model = env.unwrapped.model
    np.testing.assert_allclose(model.body_mass[1:], 1.5 * base.body_mass[1:])
    np.testing.assert_allclose(model.body_inertia[1:], 1.5 * base.body_inertia[1:])
    np.testing.assert_allclose(model.body_subtreemass[0], 1.5 * base.body_subtreemass[0])  # mj_setConst ran
    np.testing.assert_allclose(model.geom_friction[:, 0], 0.5 * base.geom_friction[:, 0])
    np.testing.assert_allclose(model.geom_friction[:, 1:], base.geom_friction[:, 1:])
    assert env.spec.additional_wrappers[-1].kwargs == {"scale": 0.5, "geoms": None}
    names = BodyMassScale(gym.make("Hopper-v5"), 2.0, bodies=["torso"]).unwrapped.model.body_mass
    np.testing.assert_allclose(names[1:], base.body_mass[1:] * np.array([2.0, 1.0, 1.0, 1.0]))


def test_heterogeneity_arguments_are_checked():
    with pytest.raises(ValueError, match="scale"):
        BodyMassScale(gym.make("Hopper-v5"), 0.0)
    with pytest.raises(ValueError, match="bodies"):
        BodyMassScale(gym.make("Hopper-v5"), 1.1, bodies=["wing"])
    with pytest.raises(ValueError, match="MuJoCo"):
        BodyMassScale(gym.make("CartPole-v1"), 1.1)
    with pytest.raises(ValueError, match="friction_scale"):
        MuJoCoDynamics(friction_scale=-1.0)
    with pytest.raises(ValueError, match="friction_scale must have one value per agent"):
        mujoco_agent_kwargs(mass_scale=[1.0, 2.0], friction_scale=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="frameskip=1"):
        AtariPreprocess()(gym.make("ALE/Pong-v5"))  # the v5 default frameskip=4
    with pytest.raises(ValueError, match="frame_stack"):
        AtariPreprocess(frame_stack=0)
    with pytest.raises(ValueError, match=r"noop_max must be >= 0, got -1"):
        AtariPreprocess(noop_max=-1)
    with pytest.raises(TypeError, match="screen_size must be an int"):
        AtariPreprocess(screen_size=84.0)
    assert type(AtariPreprocess(frame_stack=np.int64(2)).frame_stack) is int  # stays JSON-able
    with pytest.raises(ValueError, match=r"n_agents must be >= 1, got 0"):
        mujoco_agent_kwargs(n_agents=0)
    with pytest.raises(TypeError, match="n_agents must be an int"):
        atari_agent_kwargs(n_agents=True)
    with pytest.raises(ValueError, match="geoms names an unknown geom 'fin'"):
        FrictionScale(gym.make("Hopper-v5"), 1.1, geoms=["fin"])
    kwargs = mujoco_agent_kwargs(mass_scale=[0.8, 1.2], friction_scale=1.1, ctrl_cost_weight=0.2)
    assert kwargs == [
        {"ctrl_cost_weight": 0.2, "wrappers": [MuJoCoDynamics(0.8, 1.1)]},
        {"ctrl_cost_weight": 0.2, "wrappers": [MuJoCoDynamics(1.2, 1.1)]},
    ]
    for factory in (MuJoCoDynamics(1.2, 0.9), AtariPreprocess(frame_stack=2)):
        assert factory_from_json(factory_to_json(factory)) == factory
    with pytest.raises(TypeError):
        factory_to_json(lambda env: env)


# --- Atari -------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ATARI_IDS)
def test_atari_difficulty_changes_the_game(env_id):
    hard = 3 if env_id == "ALE/Pong-v5" else 1
    kwargs = atari_agent_kwargs(difficulty=[0, 0, hard], repeat_action_probability=0.0)
    venv = FederatedVecEnv(env_id, 1, agent_kwargs=kwargs, seed=0, stream_ids=[0, 0, 0])
    try:
        assert venv.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        first, twins = _first_difference(venv, lambda t: torch.full((3,), t % venv.single_action_space.n), 3)
        assert twins and first is not None
        obs, reward, *_ = venv.step(torch.ones(3, dtype=torch.int64))
        assert obs.dtype == torch.uint8 and obs.shape == (3, 4, 84, 84) and reward.shape == (3,)
    finally:
        venv.close()


def test_atari_sticky_actions_and_modes_reach_the_emulator():
    kwargs = atari_agent_kwargs(mode=[0, 4], repeat_action_probability=[0.0, 0.25])
    venv = FederatedVecEnv("ALE/Breakout-v5", 1, agent_kwargs=kwargs, seed=0)
    try:
        ales = [v.envs[0].unwrapped.ale for v in venv.agent_envs]
        assert [ale.getFloat("repeat_action_probability") for ale in ales] == [0.0, 0.25]
        assert kwargs[1]["mode"] == 4 and kwargs[1]["frameskip"] == 1
    finally:
        venv.close()


# --- the federated baselines on MuJoCo and Atari ----------------------------------------------
def test_fed_sac_on_heterogeneous_halfcheetah_saves_and_rebuilds(tmp_path):
    from stable_baselines3 import SAC

    from fedrl_algos import FedAvgSB3

    fed = FedAvgSB3(
        SAC, "HalfCheetah-v5", agent_kwargs=mujoco_agent_kwargs(mass_scale=[0.9, 1.1]), sync_every=20, seed=0,
        algorithm_kwargs={"learning_starts": 20, "batch_size": 8, "buffer_size": 100, "policy_kwargs": {"net_arch": [8]}},
        device="cpu",
    )
    fed.learn(80)
    assert fed.num_timesteps == 80
    fed.save(tmp_path / "cheetah.zip")
    loaded = FedAvgSB3.load(tmp_path / "cheetah.zip", device="cpu")
    assert loaded.get_env().agent_kwargs[1]["wrappers"] == [MuJoCoDynamics(1.1, 1.0)]
    masses = [v.envs[0].unwrapped.model.body_mass[1] for v in loaded.get_env().agent_envs]
    assert masses[1] / masses[0] == pytest.approx(1.1 / 0.9)
    fed.close()
    loaded.close()


def test_fed_dqn_cnn_on_pong_smoke():
    from stable_baselines3 import DQN

    from fedrl_algos import FedAvgSB3

    fed = FedAvgSB3(
        DQN, "ALE/Pong-v5", agent_kwargs=atari_agent_kwargs(difficulty=[0, 1]), policy="CnnPolicy", sync_every=16,
        seed=0, algorithm_kwargs={"learning_starts": 8, "batch_size": 4, "buffer_size": 64, "train_freq": 4},
        device="cpu",
    )
    fed.learn(64)
    assert fed.num_timesteps == 64
    q = [dict(a.policy.q_net.named_parameters()) for a in fed.agents]
    assert all(torch.equal(q[0][k], q[1][k]) for k in q[0])
    fed.close()
