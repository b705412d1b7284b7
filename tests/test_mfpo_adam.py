"""MFPO with Adam steps (``optimizer="adam"``): the steps by hand, the server's rules, persistence,
Flower-free checks of rejected moments, bad input, and the Pendulum result of docs/algorithms/mfpo.md."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedrl_algos import MFPO
from fedrl_algos.core import KernelSampler
from fedrl_algos.core.aggregation import RejectedUpdateWarning
from fedrl_algos.core.gpomdp import gpomdp_weights, score_gradient
from fedrl_algos.core.optim import AdamState, adam_ascent
from fedrl_algos.mfpo import MFPOState, MFPOUpdate, adam_server_step, ascend, server_step
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, stack_params

GRID = "fedrl/GridWorld-v0"


def _tabular() -> TabularPolicy:
    task = GRIDWORLD.train_tasks[0]
    return TabularPolicy(GRIDWORLD.observation_space(task), GRIDWORLD.action_space(task), dtype=torch.float64)


def _sampler(policy, seed: int = 4) -> KernelSampler:
    return KernelSampler(GRIDWORLD, stack_params(GRIDWORLD.train_tasks[:3]), policy, RandomStreams(derive_keys(seed, torch.arange(3))))


def _update(policy, **kwargs) -> MFPOUpdate:
    defaults = dict(gamma=0.9, local_steps=2, n_trajectories=5, initial_trajectories=7, step_size=lambda t: 0.05,
                    momentum=lambda t, a: 0.6, optimizer="adam")
    defaults.update(kwargs)
    return MFPOUpdate(policy, **defaults)


def test_ascend_is_the_papers_step_or_adam():
    theta, u = torch.tensor([[1.0, -2.0]]), torch.tensor([[0.5, 4.0]])
    plain, none = ascend(theta, u, 0.1, None)
    assert torch.equal(plain, theta + 0.1 * u) and none is None
    moved, state = ascend(theta, u, 0.1, AdamState.zeros_like(theta))
    # Adam's first step moves every coordinate by the step size along the sign of the direction
    assert torch.allclose(moved, theta + 0.1 * torch.sign(u), atol=1e-6) and torch.equal(state.step, torch.ones(1))


def test_adam_server_step_averages_moments_then_steps():
    theta = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # one run, two agents
    u = torch.tensor([[[1.0, 0.0], [0.0, 3.0]]])
    moments = AdamState(torch.full((1, 2), 3.0), torch.tensor([[[0.2, 0.0], [0.0, 0.4]]]), torch.tensor([[[0.1, 0.3], [0.3, 0.1]]]))
    new, u_bar, server = adam_server_step(theta, u, moments, 0.01)
    expected, expected_state = adam_ascent(torch.tensor([[2.0, 3.0]]), torch.tensor([[0.5, 1.5]]),
                                           AdamState(torch.full((1,), 3.0), torch.tensor([[0.1, 0.2]]), torch.tensor([[0.2, 0.2]])), 0.01)
    assert torch.equal(u_bar, torch.tensor([[0.5, 1.5]])) and torch.allclose(new, expected)
    assert all(torch.allclose(a, b) for a, b in zip(server, expected_state))
    # a rejected agent's moments are never read
    broken = AdamState(moments.step, moments.first.clone(), moments.second.clone())
    broken.second[0, 1] = float("nan")
    only_first, _, server_first = adam_server_step(theta, u, broken, 0.01, valid=torch.tensor([[True, False]]))
    alone, _ = adam_ascent(theta[:, 0], u[:, 0], AdamState(torch.full((1,), 3.0), moments.first[:, 0], moments.second[:, 0]), 0.01)
    assert torch.allclose(only_first, alone) and torch.isfinite(server_first.second).all()
    # the plain server step is unchanged by the refactoring into one average
    assert torch.allclose(server_step(theta, u, 0.5)[0], torch.tensor([[2.25, 3.75]]))


def test_local_and_global_adam_steps_by_hand():
    """Steps 1–2 (K = 2) recomputed from the same trajectories: Adam along ũ locally, the server's
    Adam step from the averaged moments along ū."""
    policy = _tabular()
    update = _update(policy)
    twin = _sampler(policy)
    state = MFPOState.initial(torch.full((1, 100), 0.1, dtype=torch.float64), 3, "adam")
    state = MFPOState(*(x.squeeze(0) for x in state[:3]), state.step, AdamState(*(x.squeeze(0) for x in state.moments)))
    theta1 = state.theta.clone()
    sampler = _sampler(policy)
    s1, _ = update.local_step(sampler, state)
    traj = twin(theta1, 7)
    u1 = score_gradient(policy, theta1, traj, gpomdp_weights(traj, 0.9, "loo"))
    theta2, local = adam_ascent(theta1, u1, AdamState.zeros_like(theta1), 0.05)
    assert torch.allclose(s1.theta, theta2) and torch.equal(s1.theta_prev, theta1)
    assert all(torch.allclose(a, b) for a, b in zip(s1.moments, local))
    s2, _ = update.local_step(sampler, s1)
    traj = twin(theta2, 5)
    psi = gpomdp_weights(traj, 0.9, "loo")
    w = torch.exp(((policy.log_prob(theta1, traj.obs, traj.actions) - policy.log_prob(theta2, traj.obs, traj.actions)) * traj.mask).sum(-1))
    u2 = 0.6 * (u1 - score_gradient(policy, theta1, traj, psi, traj_weights=w)) + score_gradient(policy, theta2, traj, psi)
    averaged = AdamState(local.step[0], local.first.mean(0), local.second.mean(0))
    theta_bar, server = adam_ascent(theta2.mean(0), u2.mean(0), averaged, 0.05)
    assert torch.allclose(s2.theta, theta_bar.expand(3, -1), atol=1e-12)
    assert torch.allclose(s2.direction, u2.mean(0).expand(3, -1), atol=1e-12)
    assert torch.allclose(s2.moments.first, server.first.expand(3, -1)) and torch.equal(s2.moments.step, torch.full((3,), 2.0))


def _grid(**kwargs) -> MFPO:
    defaults = dict(step_size=0.05, momentum=0.5, local_steps=2, n_trajectories=6, gamma=0.9, seed=0, device="cpu",
                    optimizer="adam", policy_kwargs=dict(dtype=torch.float64))
    defaults.update(kwargs)
    return MFPO("TabularPolicy", GRID, **defaults)


def test_class_runs_adam_and_differs_from_sgd():
    adam = _grid().learn(total_rounds=2)
    sgd = _grid(optimizer="sgd").learn(total_rounds=2)
    assert adam.agent_adam_first.shape == (adam.n_agents, adam.policy.n_params)
    assert torch.equal(adam.agent_adam_step, torch.full((adam.n_agents,), 4.0, dtype=torch.float64))
    assert not torch.equal(adam.theta, sgd.theta)
    assert "agent_adam_first" not in sgd.__dict__  # the paper's MFPO keeps no Adam state


def test_adam_learns_on_gridworld():
    model = _grid(step_size=0.2, n_trajectories=20, local_steps=5)
    before = model.evaluate_round()["exact_return"]
    model.learn(total_rounds=6)
    assert model.evaluate_round()["exact_return"] > before + 0.15


def test_save_load_continues_identically_with_adam(tmp_path):
    model = _grid().learn(total_rounds=2)
    model.save(tmp_path / "mfpo.zip")
    loaded = MFPO.load(tmp_path / "mfpo.zip", device="cpu")
    assert loaded.optimizer == "adam"
    for name in ("agent_adam_step", "agent_adam_first", "agent_adam_second"):
        assert torch.equal(getattr(loaded, name), getattr(model, name)), name
    model.learn(total_rounds=2, reset_num_timesteps=False)
    loaded.learn(total_rounds=2, reset_num_timesteps=False)
    assert torch.equal(loaded.theta, model.theta)


def test_rejected_moments_leave_the_server_state_untouched():
    policy = _tabular()
    update = _update(policy)
    start = MFPOState.initial(torch.full((1, 100), 0.1, dtype=torch.float64), 3, "adam")
    theta = start.theta + 0.01
    direction = torch.ones_like(theta)
    bad = AdamState(torch.ones(1, 3, dtype=torch.float64), torch.zeros_like(theta), torch.zeros_like(theta))
    bad.second[0, 1, 7] = -1.0  # no root: the agent is rejected
    with pytest.warns(RejectedUpdateWarning, match="Adam second moment"):
        new = update.global_phase(theta, direction, 2, start, moments=bad)
    kept = AdamState(bad.step, bad.first[:, [0, 2]], bad.second[:, [0, 2]])
    expected, _, _ = adam_server_step(theta[:, [0, 2]], direction[:, [0, 2]], kept, 0.05)
    assert torch.allclose(new.theta[0, 0], expected[0])
    everyone = AdamState(bad.step, bad.first, torch.full_like(bad.second, float("nan")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RejectedUpdateWarning)
        skipped = update.global_phase(theta, direction, 2, start, moments=everyone)
    assert torch.equal(skipped.theta, start.theta) and torch.equal(skipped.moments.second, start.moments.second)
    with pytest.raises(ValueError, match="moments"):
        update.global_phase(theta, direction, 2, start)


@pytest.mark.parametrize("kwargs, match", [(dict(optimizer="rmsprop"), "optimizer"), (dict(optimizer=None), "optimizer")])
def test_bad_optimizer_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _grid(**kwargs)
    with pytest.raises(ValueError, match=match):
        MFPOState.initial(torch.zeros(1, 4), 2, kwargs["optimizer"])


@pytest.mark.slow
def test_pendulum_reaches_minus_200_with_adam_steps():
    """docs/algorithms/mfpo.md: ten heterogeneous Pendulum agents, the paper's K = 10, D = 20 and
    tanh-Gaussian ReLU 16-16 policy, Adam steps of 3e-3 and ν = 0.5: mean ≥ −200 at 1e6 steps (~40 s)."""
    from fedrl_algos.core.schedules import as_momentum, as_step_size
    from fedrl_algos.reproduce.mfpo import MethodConfig, Population, train_mfpo

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = MethodConfig(activation="relu", squash="tanh", normalize_advantage=True, init_std=(0.5, 0.01),
                           mfpo_optimizer="adam", step_size=as_step_size(3e-3), momentum=as_momentum(0.5))
        curve = train_mfpo(Population("pendulum", [0, 1, 2], 10, cfg), 1e6)
    finally:
        torch.set_num_threads(before)
    start, final = curve[0]["return"], curve[-1]["return"]
    assert float(final.mean()) >= -200.0  # measured: -156.7, -195.6, -222.9 (mean -191.7)
    assert bool((final - start > 900).all())  # every seed from about -1250


def test_adam_methods_take_the_rows_measured_settings():
    from fedrl_algos.reproduce.mfpo import ADAM_DEFAULT, MethodConfig, MFPOConfig, adam_methods

    pendulum = adam_methods("pendulum", MethodConfig())
    assert pendulum.mfpo_optimizer == "adam" and pendulum.step_size(1) == pendulum.step_size(500) == 3e-3
    assert pendulum.momentum(5, 3e-3) == 0.5 and pendulum.squash == "tanh" and pendulum.init_std == (0.5, 0.01)
    cartpole = adam_methods("cartpole", MethodConfig(local_steps=3))
    assert cartpole.local_steps == 3 and cartpole.step_size(7) == ADAM_DEFAULT["step_size"]
    with pytest.raises(ValueError, match="mfpo_optimizer"):
        MFPOConfig(mfpo_optimizer="adagrad")
    with pytest.raises(ValueError, match="env"):
        adam_methods("mountaincar", MethodConfig())


def test_cli_runs_mfpo_with_adam_steps_and_records_them(tmp_path):
    import json

    from fedrl_algos.cli import main

    code = main(["reproduce", "mfpo", "--env", "pendulum", "--quick", "--seeds", "1", "--no-sweeps", "--mfpo-optimizer", "adam",
                 "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    payload = json.loads((tmp_path / "mfpo" / "results.json").read_text())
    assert payload["settings"]["mfpo_methods"]["mfpo_optimizer"] == "adam"
    assert payload["settings"]["methods"]["mfpo_optimizer"] == "sgd"  # FedAvg-PG and FedPG-BR keep their settings
    assert {r["method"] for r in payload["records"]} >= {"MFPO", "FedAvg-PG", "FedPG-BR"}
    assert "Adam steps" in (tmp_path / "mfpo" / "report.md").read_text()
