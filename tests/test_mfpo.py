"""MFPO: equations on small cases, reductions to federated PG, determinism, persistence, smoke runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fedrl_envs
from fedrl_algos import MFPO, FedAvgPG
from fedrl_algos.core import KernelSampler
from fedrl_algos.core.gpomdp import gpomdp_weights, score_gradient
from fedrl_algos.mfpo import (
    ExponentialStepSize,
    LinearStepSize,
    MFPOState,
    MFPOUpdate,
    MomentumSchedule,
    momentum_direction,
    server_step,
)
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, stack_params

GRID = "fedrl/GridWorld-v0"
ARC = "fedrl/ArcNavigation-v0"
CARTPOLE = "fedrl/CartPole-v0"
PENDULUM = "fedrl/Pendulum-v0"


def _grid(**kwargs) -> MFPO:
    defaults = dict(step_size=0.5, momentum=0.5, local_steps=2, n_trajectories=6, gamma=0.9, seed=0, device="cpu", policy_kwargs=dict(dtype=torch.float64))
    defaults.update(kwargs)
    return MFPO("TabularPolicy", GRID, **defaults)


def _tabular() -> TabularPolicy:
    task = GRIDWORLD.train_tasks[0]
    return TabularPolicy(GRIDWORLD.observation_space(task), GRIDWORLD.action_space(task), dtype=torch.float64)


def _requires(env_id: str) -> None:
    if env_id not in fedrl_envs.FAMILIES:
        pytest.skip(f"{env_id} is not registered yet (the classic-control families are another engineer's work in progress)")


# --- equations ----------------------------------------------------------------------------------
def test_schedules_are_the_papers():
    alpha = ExponentialStepSize(maximum=None)
    assert math.isclose(alpha(1), 1e-4 / 0.99) and math.isclose(alpha(100), 1e-4 * 0.99**-100)
    assert ExponentialStepSize()(10_000) == 1e-3 and ExponentialStepSize()(100) < 1e-3
    assert ExponentialStepSize(maximum=None)(10**6) == math.inf or ExponentialStepSize(maximum=None)(10**6) > 1e300
    nu = MomentumSchedule()
    assert math.isclose(nu(5, 1e-3), 1 - 3e-3)  # the paper's experiments: ν = 1 − 3α
    assert math.isclose(MomentumSchedule(c=2.0, power=2)(5, 0.1), 1 - 2 * 0.01)  # Theorem 1's form
    assert nu(5, 1.0) == 0.0  # clipped to [0, 1]


def test_linear_step_size_decays_over_its_steps_then_holds():
    alpha = LinearStepSize(1e-3, 840)
    assert alpha(1) == 1e-3 and math.isclose(alpha(421), 5e-4) and alpha(841) == 0.0 and alpha(10**6) == 0.0
    assert all(alpha(t) >= alpha(t + 1) for t in range(1, 900))
    assert math.isclose(LinearStepSize(1e-3, 10, final=0.1)(100), 1e-4)
    for bad, name, error in ((dict(initial=-1.0, steps=5), "initial", ValueError), (dict(initial=1e-3, steps=0), "steps", ValueError),
                             (dict(initial=1e-3, steps=2.5), "steps", TypeError), (dict(initial=1e-3, steps=5, final=1.5), "final", ValueError),
                             (dict(initial=True, steps=5), "initial", TypeError)):
        with pytest.raises(error, match=name):
            LinearStepSize(**bad)


def test_a_linear_step_size_drives_the_steps_and_is_saved_with_the_model(tmp_path):
    schedule = LinearStepSize(0.5, 3)
    model = _grid(step_size=schedule).learn(total_rounds=3)  # 6 local steps: the last three are of size 0
    frozen = model.theta.clone()
    model.learn(total_rounds=1, reset_num_timesteps=False)
    torch.testing.assert_close(model.theta, frozen, rtol=0, atol=1e-12)  # α_t = 0 after the decay: nothing moves (but rounding)
    assert not torch.equal(frozen, _grid().theta)  # ... but the first steps did
    model.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.step_size == schedule


def test_momentum_direction_is_eq_3():
    g, g_prev, u_prev = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0]), torch.tensor([3.0, 0.0])
    assert torch.allclose(momentum_direction(g, g_prev, u_prev, 0.8), 0.8 * (u_prev - g_prev) + g)
    assert torch.equal(momentum_direction(g, g_prev, u_prev, 0.0), g)
    # All weights 1 at the same parameters (g_prev = g): ũ = ν ũ_prev + (1 − ν) g.
    assert torch.allclose(momentum_direction(g, g, u_prev, 0.8), 0.8 * u_prev + 0.2 * g)


def test_server_step_is_eq_6_to_8_by_hand():
    theta = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # one run, two agents
    u = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    new_theta, u_bar = server_step(theta, u, 0.5)
    assert torch.allclose(u_bar, torch.tensor([[0.5, 0.5]]))  # eq. 6
    assert torch.allclose(new_theta, torch.tensor([[2.25, 3.25]]))  # eq. 7: [2, 3] + 0.5·[0.5, 0.5]
    weighted, _ = server_step(theta, u, 0.5, weights=torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(weighted, torch.tensor([[1.5, 2.0]]))


def _update(policy, **kwargs) -> MFPOUpdate:
    defaults = dict(
        gamma=0.9, local_steps=2, n_trajectories=5, initial_trajectories=7, step_size=lambda t: 0.3,
        momentum=lambda t, a: 0.6, estimator="gpomdp", baseline="loo",
    )
    defaults.update(kwargs)
    return MFPOUpdate(policy, **defaults)


def _sampler(policy, seed: int = 4) -> KernelSampler:
    return KernelSampler(GRIDWORLD, stack_params(GRIDWORLD.train_tasks[:3]), policy, RandomStreams(derive_keys(seed, torch.arange(3))))


def test_local_and_global_steps_by_hand():
    """Steps 1–2 of Algorithm 1 (K = 2) recomputed from the same trajectories."""
    policy = _tabular()
    update = _update(policy)
    twin = _sampler(policy)
    state = MFPOState.initial(torch.zeros(1, 100, dtype=torch.float64) + 0.1, 3)
    state = MFPOState(*(x.squeeze(0) if isinstance(x, torch.Tensor) else x for x in state))  # batch [n]
    theta1 = state.theta.clone()
    s1, info1 = update.local_step(_sampler_ := _sampler(policy), state)
    # t = 1: the direction is the plain estimate from D̃ = 7 trajectories; a local step follows.
    traj = twin(theta1, 7)
    u1 = score_gradient(policy, theta1, traj, gpomdp_weights(traj, 0.9, "loo"))
    assert torch.allclose(s1.direction, u1) and torch.allclose(s1.theta, theta1 + 0.3 * u1)
    assert torch.equal(s1.theta_prev, theta1) and s1.step == 1 and info1["trajectories"] == 7
    # t = 2 = K: eq. 3 with the importance-weighted correction, then the server step (eq. 6–8).
    s2, info2 = update.local_step(_sampler_, s1)
    traj = twin(s1.theta, 5)
    psi = gpomdp_weights(traj, 0.9, "loo")
    w = torch.exp(((policy.log_prob(theta1, traj.obs, traj.actions) - policy.log_prob(s1.theta, traj.obs, traj.actions)) * traj.mask).sum(-1))
    g = score_gradient(policy, s1.theta, traj, psi)
    g_prev = score_gradient(policy, theta1, traj, psi, traj_weights=w)
    u2 = 0.6 * (u1 - g_prev) + g
    theta_bar = s1.theta.mean(0) + 0.3 * u2.mean(0)
    assert torch.allclose(s2.theta, theta_bar.expand(3, -1), atol=1e-12)
    assert torch.allclose(s2.direction, u2.mean(0).expand(3, -1), atol=1e-12)
    assert torch.equal(s2.theta_prev, s1.theta) and s2.step == 2
    assert info2["weight_mean"] is not None and info2["nu"] == 0.6


def test_all_weights_one_the_correction_cancels():
    """With α = 0 the parameters never move, every importance weight is 1, and eq. 3 reduces to
    ``ũ_t = ν ũ_{t−1} + (1 − ν) ĝ_t`` on each step's fresh batch."""
    policy = _tabular()
    update = _update(policy, step_size=lambda t: 0.0, local_steps=4)
    sampler, twin = _sampler(policy), _sampler(policy)
    state = MFPOState.initial(torch.full((100,), 0.2, dtype=torch.float64).unsqueeze(0), 3)
    theta = state.theta[0]
    expected = None
    for t in range(1, 5):
        state, info = update.local_step(sampler, MFPOState(*(x[0] if isinstance(x, torch.Tensor) else x for x in state)) if t == 1 else state)
        traj = twin(theta, 7 if t == 1 else 5)
        g = score_gradient(policy, theta, traj, gpomdp_weights(traj, 0.9, "loo"))
        expected = g if t == 1 else 0.6 * expected + 0.4 * g
        if t > 1:
            assert info["weight_mean"] == 1.0 and info["weight_max"] == 1.0
        if t < 4:
            assert torch.allclose(state.direction, expected, atol=1e-12)
    assert torch.allclose(state.direction, expected.mean(0).expand(3, -1), atol=1e-12)  # averaged at t = K


@pytest.mark.parametrize("local_steps", [1, 3])
def test_without_momentum_mfpo_is_federated_pg(local_steps):
    """ν = 0: MFPO with K local steps is FedAvg-PG with τ = K (the server step is the last local
    step, averaged); with K = 1 it is one-step federated PG. Same seed, same streams, same numbers."""
    kwargs = dict(seed=3, device="cpu", gamma=0.9, policy_kwargs=dict(dtype=torch.float64))
    mfpo = MFPO("TabularPolicy", GRID, step_size=0.4, momentum=0.0, local_steps=local_steps, n_trajectories=8,
                initial_trajectories=8, baseline=None, **kwargs).learn(total_rounds=3)
    fedavg = FedAvgPG("TabularPolicy", GRID, step_size=0.4, local_steps=local_steps, n_trajectories=8, baseline=None,
                      **kwargs).learn(total_rounds=3)
    assert torch.allclose(mfpo.theta, fedavg.theta, atol=1e-12)
    assert mfpo.trajectories_per_agent == fedavg.trajectories_per_agent == 3 * local_steps * 8
    # Momentum changes the result.
    other = MFPO("TabularPolicy", GRID, step_size=0.4, momentum=0.5, local_steps=local_steps, n_trajectories=8,
                 initial_trajectories=8, baseline=None, **kwargs).learn(total_rounds=3)
    assert not torch.allclose(other.theta, fedavg.theta)


def test_importance_weight_options_reach_the_update():
    a = _grid(max_importance_weight=1.0).learn(total_rounds=2)  # every weight truncated at 1
    b = _grid(max_importance_weight=None).learn(total_rounds=2)  # exact weights
    c = _grid(max_importance_weight=None, self_normalize_weights=True).learn(total_rounds=2)
    assert not torch.equal(a.theta, b.theta) and not torch.equal(b.theta, c.theta)
    assert a._last_info["weight_max"] <= 1.0


# --- the SB3 shell ------------------------------------------------------------------------------
def test_same_seed_same_theta_and_batched_state():
    a = _grid().learn(total_rounds=3)
    b = _grid().learn(total_rounds=3)
    assert torch.equal(a.theta, b.theta) and torch.equal(a.agent_direction, b.agent_direction)
    assert not torch.equal(a.theta, _grid(seed=1).learn(total_rounds=3).theta)
    assert a.local_step == 6 and a.rounds_done == 3
    # After a global phase every agent holds the averaged direction.
    assert torch.allclose(a.agent_direction, a.agent_direction[0].expand_as(a.agent_direction))


def test_save_load_continues_identically(tmp_path):
    model = _grid().learn(total_rounds=2)
    model.save(tmp_path / "mfpo.zip")
    loaded = MFPO.load(tmp_path / "mfpo.zip", device="cpu")
    assert torch.equal(loaded.theta, model.theta) and torch.equal(loaded.agent_direction, model.agent_direction)
    assert torch.equal(loaded.agent_theta_prev, model.agent_theta_prev) and loaded.local_step == model.local_step
    model.learn(total_rounds=2, reset_num_timesteps=False)
    loaded.learn(total_rounds=2, reset_num_timesteps=False)
    assert torch.equal(loaded.theta, model.theta)
    obs = np.arange(25)
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


def test_logger_records_mfpo_metrics(tmp_path):
    from stable_baselines3.common.logger import configure

    model = _grid(eval_trajectories=4)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(total_rounds=2, progress_bar=True)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in ("eval/exact_return", "eval/return", "train/return", "train/step_size", "train/momentum",
                "train/importance_weight_mean", "train/env_steps_per_agent", "train/round"):
        assert key in header, key


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(local_steps=0), "local_steps"),
        (dict(n_trajectories=0), "n_trajectories"),
        (dict(momentum=1.5), "momentum"),
        (dict(momentum="high"), "momentum"),
        (dict(step_size=-1.0), "step_size"),
        (dict(estimator="ppo"), "estimator"),
        (dict(baseline="median"), "baseline"),
        (dict(max_importance_weight=0.5), "max_importance_weight"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _grid(**kwargs)


# --- smoke runs on every kind of family -----------------------------------------------------------
def test_learns_on_gridworld():
    model = _grid(step_size=3.0, n_trajectories=20, local_steps=5, momentum=0.5)
    before = model.evaluate_round()["exact_return"]  # the exact discounted return, averaged over the 8 goals
    model.learn(total_rounds=6)
    assert model.evaluate_round()["exact_return"] > before + 0.15


def test_smoke_arc_navigation_mlp():
    model = MFPO("MlpPolicy", ARC, step_size=0.05, local_steps=2, n_trajectories=4, seed=0, device="cpu", eval_trajectories=4)
    model.learn(total_rounds=2)
    assert model.rounds_done == 2 and "return" in model.evaluate_round()
    assert torch.isfinite(model.theta).all()


@pytest.mark.parametrize("env_id", [CARTPOLE, PENDULUM])
def test_smoke_classic_control(env_id):
    _requires(env_id)
    model = MFPO("MlpPolicy", env_id, local_steps=2, n_trajectories=3, seed=0, device="cpu", eval_trajectories=2,
                 policy_kwargs=dict(net_arch=(16, 16), activation="relu"))
    model.learn(total_rounds=2)
    assert model.n_agents == 10 and torch.isfinite(model.theta).all()
    assert 0 < model.env_steps_per_agent <= model.trajectories_per_agent * (model.steps_per_trajectory)
    action, _ = model.predict(np.zeros(model.observation_space.shape, dtype=np.float32), deterministic=True)
    assert model.action_space.contains(action) or env_id == PENDULUM


@pytest.mark.slow
def test_cartpole_learning_run():
    """A short real run: the heterogeneous CartPole federation improves well beyond a random policy."""
    _requires(CARTPOLE)
    model = MFPO("MlpPolicy", CARTPOLE, seed=0, device="cpu", eval_trajectories=10,
                 policy_kwargs=dict(net_arch=(16, 16), activation="tanh"))
    model.learn(total_rounds=15)
    assert model.evaluate_round()["return"] > 100


def test_batched_runs_equal_class_runs_alone():
    """Two seeds as one batched program ``[R, n, d]`` give each seed's class result."""
    from fedrl_algos.core.federation import Federation

    models = [_grid(seed=s).learn(total_rounds=2) for s in (0, 1)]
    federation = Federation(GRIDWORLD, models[0].federation.agent_params, models[0].policy, torch.tensor([0, 1]), 0.9)
    federation.sampler.stop_when_done = True
    state = MFPOState.initial(torch.zeros(2, 100, dtype=torch.float64), 8)
    for _ in range(2):
        state, _ = models[0].update.round(federation.sampler, state)
    for s in (0, 1):
        assert torch.allclose(state.theta[s, 0], models[s].theta, atol=1e-12)


def test_quick_reproduce_mfpo_writes_records_and_report(tmp_path):
    _requires(CARTPOLE)
    from fedrl_algos.reproduce.common import run_experiment
    from fedrl_algos.reproduce.mfpo import MFPOComparison

    experiment = MFPOComparison()
    payload = run_experiment(experiment, tmp_path, seeds=2, quick=True, device="cpu", progress=False)
    records = payload["records"]
    assert {"method", "env", "seed", "step", "round", "return"} <= set(records[0])
    comparison = {r["method"] for r in records if r["part"] == "comparison"}
    assert {"MFPO", "FedAvg-PG", "FedPG-BR"} <= comparison
    assert {r["n_agents"] for r in records if r["part"] == "agents_sweep"} == {1, 5, 10, 20, 50}
    assert {r["local_steps"] for r in records if r["part"] == "local_steps_sweep"} == {1, 5, 10, 20, 50}
    report = (tmp_path / "mfpo" / "report.md").read_text()
    assert "Fed-SAC" in report and "Fed-DQN" in report and "MFPO" in report
    assert (tmp_path / "mfpo" / "mfpo_cartpole_comparison.png").exists()
    with pytest.raises(ValueError, match="env"):
        experiment.config(env="walker")  # not a row of Table I
    with pytest.raises(ValueError, match="option"):
        experiment.config(horizon=3)
