"""``critic_time_aware=True``: the critic's input gains the step's fraction of the horizon h/T.

The network equals an ordinary one fed ``[s, h/T]``; a frozen time-aware critic stays an unbiased
baseline against exact dynamic programming on the gridworld and lowers the variance below the plain
critic's there (the gridworld's value to go depends on the time left); every critic federation
takes the option, saves it, and files saved before it load without it; refusals name it.
"""

from __future__ import annotations

import pytest
import torch
from test_critic_baseline import AGENTS, GAMMA, _exact, _grid_batches, _per_batch, _theta, _vector_batch, z_scores

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG
from fedrl_algos.core.critic import MlpCritic, critic_step_weights
from fedrl_algos.core.gpomdp import gpomdp, score_gradient
from fedrl_algos.policies.critics import critic_for_space
from fedrl_envs import GRIDWORLD

GRID = "fedrl/GridWorld-v0"


def test_the_time_input_is_the_steps_fraction_of_the_horizon():
    critic = MlpCritic(3, [8, 5], time_horizon=7)
    plain = MlpCritic(4, [8, 5])
    assert critic.n_params == plain.n_params
    obs, targets, mask = _vector_batch(steps=7)
    phi = critic.initial_phi(0, torch.float64) + 0.1 * torch.randn(2, 3, critic.n_params, generator=torch.Generator().manual_seed(1),
                                                                    dtype=torch.float64)
    fraction = (torch.arange(7, dtype=torch.float64) / 7).reshape(7, 1).expand(*obs.shape[:-1], 1)
    assert torch.equal(critic.network(phi, obs, 4), plain.network(phi, torch.cat((obs, fraction), -1), 4))
    state = critic.fit(critic.initial_state(phi), obs, targets, mask, 4, 1e-2)
    assert torch.isfinite(state.phi).all() and not torch.equal(state.phi, phi)
    # a batch trimmed to its longest episode (5 of the horizon's 7 steps) gives each step the same input
    trimmed = critic.network(phi, obs[..., :5, :], 4)
    assert torch.equal(trimmed, critic.network(phi, obs, 4)[..., :5])
    with pytest.raises(ValueError, match="time_horizon"):
        MlpCritic(3, [8], time_horizon=0)


def _fitted(critic, tabular, theta):
    _, traj = _grid_batches(tabular, theta, 1, 200, seed=99)
    _, targets = critic_step_weights(torch.zeros_like(traj.rewards), traj.rewards, traj.mask, GAMMA, 1.0)
    state = critic.initial_state(critic.initial_phi(0, torch.float64).expand(len(AGENTS), -1).clone())
    return critic.fit(state, traj.obs, targets, traj.mask, 400, 0.02)


def _psi(critic, state, traj, n_batches):
    big = critic.initial_state(state.phi.repeat(n_batches, 1))._replace(mean=state.mean.repeat(n_batches),
                                                                         scale=state.scale.repeat(n_batches))
    return critic_step_weights(critic.values(big, traj.obs, traj.rewards.dim()), traj.rewards, traj.mask, GAMMA, 1.0)[0]


def test_a_frozen_time_aware_critic_is_unbiased_on_the_gridworld(tabular, evaluator):
    n_batches, m = 2000, 8
    theta = _theta(0)
    rows, traj = _grid_batches(tabular, theta, n_batches, m, seed=31)
    loo = _per_batch(gpomdp(tabular, rows, traj, GAMMA, "loo"), n_batches).var(0).sum(-1)
    for time_aware in (False, True):
        critic = MlpCritic(25, [16], discrete=True, time_horizon=GRIDWORLD.horizon(GRIDWORLD.train_tasks[0]) + 1 if time_aware else None)
        state = _fitted(critic, tabular, theta)
        samples = _per_batch(score_gradient(tabular, rows, traj, _psi(critic, state, traj, n_batches)), n_batches)
        z = z_scores(samples, _exact(evaluator, theta))
        assert z.abs().max() < 4.5, (time_aware, float(z.abs().max()))
        print(f"trace cov / loo at m={m}, time_aware={time_aware}: {(samples.var(0).sum(-1) / loo).tolist()}")


def test_on_a_fixed_horizon_only_the_time_aware_critic_fits_the_value_to_go():
    """Reward 1 on each of T steps, the same observation throughout, γ = 1: the value to go is T − h,
    a function of time alone. V(s) can only fit its mean; V(s, h/T) fits it."""
    steps, m = 20, 4
    obs = torch.zeros(2, m, steps, 3, dtype=torch.float64)
    rewards, mask = torch.ones(2, m, steps, dtype=torch.float64), torch.ones(2, m, steps, dtype=torch.float64)
    _, targets = critic_step_weights(torch.zeros_like(rewards), rewards, mask, 1.0, 1.0)
    losses = {}
    for time_aware in (False, True):
        critic = MlpCritic(3, [16], time_horizon=steps if time_aware else None)
        state = critic.initial_state(critic.initial_phi(0, torch.float64).expand(2, -1).clone())
        state = critic.fit(state, obs, targets, mask, 500, 0.01)
        losses[time_aware] = critic.loss(state, obs, targets, mask)  # normalised units: 1 = the targets' variance
    assert (losses[False] > 0.99).all() and (losses[True] < 0.02).all(), losses


SETTINGS = {
    MFPO: {"local_steps": 2, "n_trajectories": 4, "baseline": "critic"},
    FedAvgPG: {"local_steps": 2, "n_trajectories": 4, "baseline": "critic"},
    IndependentPG: {"local_steps": 2, "n_trajectories": 4, "baseline": "critic"},
    FedPGBR: {"batch_range": (4, 6), "inner_batch_size": 2, "baseline": "critic"},
    PerFedAvgPG: {"local_steps": 2, "m_in": 4, "m_h": 4, "m_out": 4, "adaptation_baseline": "critic", "outer_baseline": "critic"},
}


@pytest.mark.parametrize("cls", list(SETTINGS))
def test_every_critic_federation_takes_saves_and_resumes_the_option(cls, tmp_path):
    kwargs = dict(SETTINGS[cls], critic_net_arch=[8], critic_time_aware=True, seed=0, device="cpu", eval_trajectories=0)
    straight = cls("TabularPolicy", GRID, **kwargs).learn(total_rounds=2)
    assert straight.critic_network.time_horizon == straight.federation.horizon + 1 and straight.critic_network.sizes[0] == 25 + 1
    half = cls("TabularPolicy", GRID, **kwargs).learn(total_rounds=1)
    half.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip", device="cpu")
    assert loaded.critic_time_aware and loaded.critic_network.time_aware
    loaded.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(loaded.policy.theta, straight.policy.theta)
    assert torch.equal(loaded.agent_critic_phi, straight.agent_critic_phi)


def test_a_flower_round_on_trimmed_batches_equals_the_in_process_round():
    """CartPole's batches are trimmed to their longest episode, which differs between a one-agent
    client and the federation: the time input must not depend on it. (Bitwise equality does not hold
    on trimmed batches for any critic, the reductions run over other shapes; float64 agrees to 1e-12.
    With T taken from the batch's length the two differed by 8e-3 in φ.)"""
    pytest.importorskip("flwr")
    import copy

    from fedrl_algos.flower import AgentWorker, protocol_for, round_by_halves

    def make():
        return FedAvgPG("MlpPolicy", "fedrl/CartPole-v0", seed=3, device="cpu", n_trajectories=3, local_steps=2, horizon=60,
                        baseline="critic", critic_time_aware=True, n_critic_epochs=2, policy_kwargs=dict(dtype=torch.float64),
                        eval_trajectories=0)

    reference = make().learn(total_rounds=2)
    model = make().learn(total_rounds=1)
    round_by_halves(protocol_for(model), [AgentWorker(copy.deepcopy(model), a) for a in range(model.n_agents)])
    torch.testing.assert_close(model.policy.theta, reference.policy.theta, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.agent_critic_phi, reference.agent_critic_phi, rtol=0, atol=1e-12)


def test_files_saved_before_the_option_load_without_it(tmp_path):
    model = MFPO("TabularPolicy", GRID, **SETTINGS[MFPO], seed=0, device="cpu")
    del model.__dict__["critic_time_aware"]  # what a file saved before the option holds
    model.save(tmp_path / "old.zip")
    loaded = MFPO.load(tmp_path / "old.zip", device="cpu")
    assert not loaded.critic_network.time_aware and loaded._critic_setting("critic_time_aware") is False


def test_refusals_name_the_option():
    with pytest.raises(TypeError, match="critic_time_aware must be a bool"):
        MFPO("TabularPolicy", GRID, **SETTINGS[MFPO], critic_time_aware="yes", device="cpu")
    with pytest.raises(TypeError, match="critic_time_aware must be a bool"):  # checked with or without the critic
        PerFedAvgPG("TabularPolicy", GRID, critic_time_aware=1, device="cpu")
    with pytest.raises(ValueError, match="critic_time_aware=True gives the critic a time input, which needs baseline='critic', got baseline='loo'"):
        MFPO("TabularPolicy", GRID, baseline="loo", critic_time_aware=True, device="cpu")
    with pytest.raises(ValueError, match="needs adaptation_baseline='critic' or outer_baseline='critic'"):
        PerFedAvgPG("TabularPolicy", GRID, critic_time_aware=True, device="cpu")
    from fedrl_algos.reproduce.mfpo import MethodConfig

    with pytest.raises(ValueError, match="mfpo_critic_time_aware=True needs mfpo_baseline='critic'"):
        MethodConfig(mfpo_critic_time_aware=True)
    import gymnasium as gym
    import numpy as np

    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    with pytest.raises(ValueError, match="critic_time_aware=True needs a flat"):
        critic_for_space(frames, time_horizon=10)


def test_fedrl_reproduce_mfpo_runs_the_time_aware_critic_and_records_it(tmp_path, capsys):
    import json

    from fedrl_algos.cli import main
    from fedrl_algos.reproduce.mfpo import MFPOConfig

    code = main(["reproduce", "mfpo", "--env", "pendulum", "--quick", "--seeds", "2", "--no-sweeps", "--baseline", "critic",
                 "--critic-time-aware", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    payload = json.loads((tmp_path / "mfpo" / "results.json").read_text())
    assert payload["settings"]["mfpo_methods"]["mfpo_critic_time_aware"] is True
    assert payload["settings"]["methods"]["mfpo_critic_time_aware"] is False  # FedAvg-PG and FedPG-BR: no critic
    assert "critic_time_aware=True" in (tmp_path / "mfpo" / "report.md").read_text()
    with pytest.raises(ValueError, match="critic_time_aware=True needs baseline='critic'"):
        MFPOConfig(critic_time_aware=True)
    assert main(["reproduce", "byzantine", "--quick", "--critic-time-aware", "--no-progress"]) == 2
    assert "--critic-time-aware" in capsys.readouterr().err


def test_set_env_refuses_other_episode_lengths_and_keeps_the_model():
    model = MFPO("TabularPolicy", GRID, **SETTINGS[MFPO], critic_time_aware=True, seed=0, device="cpu", eval_trajectories=0)
    model.learn(total_rounds=1)
    env, federation = model.get_env(), model.federation
    agents = [{"agent": a, "horizon": 20} for a in range(model.n_agents)]
    longer = MFPO("TabularPolicy", GRID, agent_kwargs=agents, device="cpu").get_env()
    with pytest.raises(ValueError, match=r"env must have episodes of the model's 16 steps \(critic_time_aware=True.*got 21"):
        model.set_env(longer)
    assert model.get_env() is env and model.federation is federation and model.critic_network.time_horizon == 16
    model.learn(total_rounds=1, reset_num_timesteps=False)  # still the model it was
    straight = MFPO("TabularPolicy", GRID, **SETTINGS[MFPO], critic_time_aware=True, seed=0, device="cpu", eval_trajectories=0)
    assert torch.equal(model.policy.theta, straight.learn(total_rounds=2).policy.theta)
    plain = MFPO("TabularPolicy", GRID, **SETTINGS[MFPO], seed=0, device="cpu", eval_trajectories=0)
    plain.set_env(longer)  # a critic without the time input reads states only
    assert plain.federation.horizon == 20
