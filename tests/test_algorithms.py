"""SB3-style shells: determinism, batching, persistence, callbacks, validation, learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback

from fedrl_algos import FedAvgPG, IndependentPG, PerFedAvgPG
from fedrl_algos.core import PolicyGradient, policy_gradient, rollout
from fedrl_algos.core.aggregation import RejectedUpdateWarning
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.core.federation import Federation
from fedrl_algos.per_fedavg_pg import ExactMetaGradient, FirstOrderMetaGradient
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import MlpPolicy, TabularPolicy
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, RandomStreams, derive_keys, stack_params

GRID = "fedrl/GridWorld-v0"
ARC = "fedrl/ArcNavigation-v0"


#: the paper's estimators (eq. (2), (3), (7)) with the tabular column's β, which these tests compare against
PAPER = {**PerFedAvgPG.paper_settings, "step_size": 0.3}


def _grid_model(cls=PerFedAvgPG, **kwargs):
    defaults = dict(step_size=0.3, seed=0, device="cpu")
    if cls is not IndependentPG:
        defaults["alpha"] = 2.0
    defaults.update(kwargs)
    return cls("TabularPolicy", GRID, **defaults)


@pytest.mark.parametrize("cls", [PerFedAvgPG, FedAvgPG, IndependentPG])
def test_same_seed_same_theta(cls):
    a = _grid_model(cls).learn(total_rounds=3)
    b = _grid_model(cls).learn(total_rounds=3)
    assert torch.equal(a.theta, b.theta)
    c = _grid_model(cls, seed=1).learn(total_rounds=3)
    if cls is IndependentPG:
        assert torch.equal(a.agent_theta, b.agent_theta)
        assert not torch.equal(a.agent_theta, c.agent_theta)
    else:
        assert not torch.equal(a.theta, c.theta)


def test_first_order_is_cheaper_and_counts_timesteps():
    exact = _grid_model(variant="exact")
    first = _grid_model(variant="first_order")
    # 8 agents, τ = 5, 16 steps; the default batches m_in = m_h = m_out = 20
    assert exact.timesteps_per_round == 8 * 5 * 60 * 16
    assert first.timesteps_per_round == 8 * 5 * 40 * 16
    first.learn(total_timesteps=first.timesteps_per_round * 2)
    assert first.num_timesteps == first.timesteps_per_round * 2
    assert first.trajectories_per_agent == 2 * 5 * 40


def test_class_equals_functional_core_and_batched_runs_equal_looped():
    model = _grid_model(variant="exact", policy_kwargs=dict(dtype=torch.float64), **PAPER).learn(total_rounds=2)
    policy = TabularPolicy(GRIDWORLD.observation_space(GRIDWORLD.train_tasks[0]), GRIDWORLD.action_space(GRIDWORLD.train_tasks[0]), dtype=torch.float64)
    params = stack_params(GRIDWORLD.train_tasks)
    estimator = ExactMetaGradient(policy, 0.9, 2.0, 10, 10, 10)
    seeds = torch.tensor([0, 5, 9])
    batched = Federation(GRIDWORLD, params, policy, seeds)
    theta = torch.zeros(3, 100, dtype=torch.float64)
    for _ in range(2):
        theta, _ = per_fedavg_pg_round(batched, theta, estimator, 0.3, 5)
    assert torch.allclose(theta[0], model.theta, atol=1e-12, rtol=0)
    for r, seed in enumerate(seeds):
        alone = Federation(GRIDWORLD, params, policy, seed.reshape(1))
        th = torch.zeros(1, 100, dtype=torch.float64)
        for _ in range(2):
            th, _ = per_fedavg_pg_round(alone, th, estimator, 0.3, 5)
        assert torch.allclose(th[0], theta[r], atol=1e-12, rtol=0)


def test_fedavg_with_one_agent_is_plain_policy_gradient():
    task = GRIDWORLD.train_tasks[4]
    model = FedAvgPG("TabularPolicy", GRIDWORLD, step_size=0.5, local_steps=1, n_trajectories=7, seed=3, device="cpu",
                     policy_kwargs=dict(dtype=torch.float64), **FedAvgPG.paper_settings)
    model.set_env(_OneTask(task))
    model.learn(total_rounds=1)
    policy = model.policy
    streams = RandomStreams(derive_keys(torch.tensor([3]).reshape(-1, 1), torch.arange(1).reshape(1, -1)))
    theta0 = torch.zeros(1, 1, 100, dtype=torch.float64)
    traj = rollout(GRIDWORLD, stack_params([task]), policy, theta0, streams, 7)
    expected = theta0 + 0.5 * policy_gradient(policy, theta0, traj, 0.9)
    assert torch.allclose(model.theta, expected.reshape(-1), atol=1e-14)
    assert not torch.equal(model.theta, torch.zeros(100, dtype=torch.float64)) or traj.rewards.sum() == 0


def test_a_refused_set_env_leaves_the_model_bound_to_its_env():
    model = FedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu", eval_trajectories=0)
    env, federation, space = model.get_env(), model.federation, model.observation_space
    bigger = FedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", agent_kwargs=[{"size": 6}] * model.n_agents, device="cpu").get_env()
    with pytest.raises(ValueError, match="env must have the model's spaces Discrete\\(25\\)"):
        model.set_env(bigger)
    assert model.get_env() is env and model.federation is federation and model.observation_space == space
    model.learn(total_rounds=1)
    straight = FedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu", eval_trajectories=0).learn(total_rounds=1)
    assert torch.equal(model.theta, straight.theta)


class _OneTask:
    """Minimal env-like object: a family and one stacked task."""

    def __init__(self, task):
        self.family = GRIDWORLD
        self.agent_params = stack_params([task])


def test_partial_participation_samples_agents_without_replacement():
    model = _grid_model(agents_per_round=3)
    masks = [model.federation.participation(3) for _ in range(20)]
    for mask in masks:
        assert mask.shape == (1, 8) and float(mask.sum()) == 3.0
    assert len({tuple(m.reshape(-1).tolist()) for m in masks}) > 1
    model.learn(total_rounds=2)
    assert model.timesteps_per_round == 3 * 5 * 60 * 16


def test_save_load_round_trip(tmp_path):
    model = _grid_model().learn(total_rounds=2)
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = PerFedAvgPG.load(path, device="cpu")
    assert torch.equal(loaded.theta, model.theta)
    obs = np.arange(25)
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    # The random streams were saved too: training on from both gives the same parameters.
    model.learn(total_rounds=1, reset_num_timesteps=False)
    loaded.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(loaded.theta, model.theta)
    params = model.get_parameters()
    fresh = _grid_model(seed=99)
    fresh.set_parameters(params)
    assert torch.equal(fresh.theta, model.theta)


def test_independent_pg_save_load_keeps_agent_parameters(tmp_path):
    model = _grid_model(IndependentPG, n_trajectories=10).learn(total_rounds=2)
    model.save(tmp_path / "ind.zip")
    loaded = IndependentPG.load(tmp_path / "ind.zip", device="cpu")
    assert torch.equal(loaded.agent_theta, model.agent_theta)
    a = model.predict(np.arange(25), deterministic=True, agent=3)[0]
    assert np.array_equal(a, loaded.predict(np.arange(25), deterministic=True, agent=3)[0])


def test_callbacks_logger_and_progress_bar(tmp_path):
    from stable_baselines3.common.logger import configure

    calls = []

    class Count(BaseCallback):
        def _on_step(self) -> bool:
            calls.append(self.model.rounds_done)
            return self.model.rounds_done < 3  # stops training after round 3

    model = _grid_model(variant="first_order")
    model.set_logger(configure(str(tmp_path / "log"), ["csv"]))
    ckpt = CheckpointCallback(save_freq=2, save_path=str(tmp_path / "ckpt"), name_prefix="m")
    model.learn(total_rounds=10, callback=[Count(), ckpt], progress_bar=True)
    assert calls == [1, 2, 3] and model.rounds_done == 3
    assert (tmp_path / "ckpt").exists() and any((tmp_path / "ckpt").iterdir())
    lines = (tmp_path / "log" / "progress.csv").read_text().splitlines()
    header = lines[0].split(",")
    for key in ("eval/exact_return", "eval/exact_adapted_return", "eval/return", "eval/adapted_return", "train/round",
                "train/trajectories_per_agent"):
        assert key in header
    assert len(lines) == 4


def test_tensorboard_logging(tmp_path):
    pytest.importorskip("tensorboard")
    model = _grid_model(tensorboard_log=str(tmp_path), verbose=1)
    model.learn(total_rounds=1)
    assert any(p.name.startswith("PerFedAvgPG") for p in tmp_path.iterdir())


def test_eval_callback_on_sb3_env(tmp_path):
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.env_util import make_vec_env

    import fedrl_envs  # noqa: F401

    eval_env = make_vec_env(GRID, n_envs=1, env_kwargs=dict(agent=0))
    callback = EvalCallback(eval_env, eval_freq=1, n_eval_episodes=2, log_path=str(tmp_path), verbose=0)
    _grid_model(variant="first_order").learn(total_rounds=2, callback=callback)
    assert len(callback.evaluations_results) == 2
    assert all(0.0 <= r <= 16.0 for row in callback.evaluations_results for r in row)


def test_adapt_personalizes_to_a_task():
    model = _grid_model(policy_kwargs=dict(dtype=torch.float64)).learn(total_rounds=5)
    evaluator = TabularEvaluator(GRID)
    adapted = model.adapt(2, n_trajectories=2000, step_size=2.0, seed=0)
    assert isinstance(adapted, TabularPolicy) and not torch.equal(adapted.theta, model.theta)
    before = evaluator.returns(model.theta)[2]
    after = evaluator.returns(adapted.theta.detach())[2]
    assert after > before
    many = model.adapt([{"goal": (2, 2)}, GRIDWORLD.heldout_tasks[0]], n_trajectories=10)
    assert len(many) == 2
    zero = model.adapt(1, n_trajectories=0)
    assert torch.equal(zero.theta.detach(), model.theta)


def test_mlp_policy_on_arc_navigation_with_monte_carlo_evaluation():
    model = PerFedAvgPG("MlpPolicy", ARC, alpha=1.0, step_size=0.2, local_steps=1, m_in=4, m_h=4, m_out=4, seed=0, device="cpu",
                        eval_trajectories=8, eval_adapt_trajectories=8)
    assert model.policy.n_params == 360
    model.learn(total_rounds=1)
    metrics = model.evaluate_round()
    n = len(ARC_NAVIGATION.train_tasks)
    assert set(metrics) == {f"{agent}{prefix}{name}" for agent in ("", *(f"agent_{i}/" for i in range(n)))
                            for prefix in ("", "adapted_") for name in ("return", "discounted_return")}
    held = model.adapt(ARC_NAVIGATION.heldout_tasks[1], n_trajectories=8)
    action, _ = held.predict(np.zeros(2, dtype=np.float32))
    assert 0 <= int(action) < 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(step_size=-1.0), "step_size"),
        (dict(alpha=-0.5), "alpha"),
        (dict(m_in=0), "m_in"),
        (dict(m_h=-3), "m_h"),
        (dict(local_steps=0), "local_steps"),
        (dict(variant="second_order"), "variant"),
        (dict(agents_per_round=9), "agents_per_round"),
        (dict(gamma=1.5), "gamma"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _grid_model(**kwargs)


def test_bad_policy_env_and_totals():
    # an MlpPolicy one-hot encodes the gridworld's Discrete states (as SB3's does)
    assert PerFedAvgPG("MlpPolicy", GRID, alpha=1.0, step_size=0.1, device="cpu").policy.one_hot_observations
    with pytest.raises(ValueError, match="policy"):
        PerFedAvgPG("CnnPolicy", GRID, alpha=1.0, step_size=0.1)
    with pytest.raises(ValueError, match="agent_kwargs"):  # a Gymnasium id needs its agents
        PerFedAvgPG("MlpPolicy", "CartPole-v1", alpha=1.0, step_size=0.1)
    with pytest.raises(ValueError, match="policy TabularPolicy does not fit CartPole-v1"):
        PerFedAvgPG("TabularPolicy", "CartPole-v1", n_agents=2, alpha=1.0, step_size=0.1)
    model = _grid_model()
    with pytest.raises(ValueError, match="exactly one"):
        model.learn()
    with pytest.raises(ValueError, match="exactly one"):
        model.learn(total_timesteps=10, total_rounds=1)
    with pytest.raises(ValueError, match="task"):
        model.adapt(12, n_trajectories=5)


def test_mlp_policy_initialization_is_the_papers():
    policy = MlpPolicy(ARC_NAVIGATION.observation_space(ARC_NAVIGATION.train_tasks[0]), ARC_NAVIGATION.action_space(ARC_NAVIGATION.train_tasks[0]), dtype=torch.float64)
    theta = policy.theta.detach()
    w1, b1, w2, b2 = theta[:64], theta[64:96], theta[96:352], theta[352:]
    assert torch.equal(b1, torch.zeros(32, dtype=torch.float64)) and torch.equal(b2, torch.zeros(8, dtype=torch.float64))
    assert abs(float(w1.std()) - 0.5) < 0.12 and abs(float(w2.std()) - 0.1) < 0.02
    again = MlpPolicy(policy.observation_space, policy.action_space, dtype=torch.float64)
    assert torch.equal(again.theta, policy.theta)
    other = policy.initial_parameters(seed=1)
    assert not torch.equal(other, theta)


@pytest.mark.slow
def test_gridworld_learning_order_matches_the_paper():
    """Figure 1 (left): exact > first-order > FedAvg-PG in exact F after K=80 rounds (mean of seeds)."""
    evaluator = TabularEvaluator(GRID)
    space_o, space_a = GRIDWORLD.observation_space(GRIDWORLD.train_tasks[0]), GRIDWORLD.action_space(GRIDWORLD.train_tasks[0])
    policy = TabularPolicy(space_o, space_a, dtype=torch.float64)
    params = stack_params(GRIDWORLD.train_tasks)
    seeds = torch.arange(4)
    finals = {}
    for name, est in {
        "exact": ExactMetaGradient(policy, 0.9, 2.0, 10, 10, 10),
        "first_order": FirstOrderMetaGradient(policy, 0.9, 2.0, 10, 10),
        "fedavg": PolicyGradient(policy, 0.9, 30),
    }.items():
        fed = Federation(GRIDWORLD, params, policy, seeds)
        theta = torch.zeros(len(seeds), 100, dtype=torch.float64)
        for _ in range(80):
            theta, _ = per_fedavg_pg_round(fed, theta, est, 0.3, 5)
        finals[name] = float(evaluator.meta_objective(theta, 2.0)[0].mean())
    assert finals["exact"] > finals["first_order"] > finals["fedavg"] > 0.5


def test_more_bad_inputs_name_their_argument():
    with pytest.raises(ValueError, match="policy_kwargs"):
        PerFedAvgPG("MlpPolicy", ARC, policy_kwargs=dict(net_arc=(64,)), device="cpu")
    with pytest.raises(TypeError, match="policy"):
        PerFedAvgPG(3, GRID)
    with pytest.raises(TypeError, match="seed"):
        PerFedAvgPG("TabularPolicy", GRID, seed="x")
    with pytest.raises(ValueError, match="device"):
        PerFedAvgPG("TabularPolicy", GRID, device="gpu")
    with pytest.raises(TypeError, match="gamma"):  # a bool is not a discount (a wrong type, as everywhere)
        PerFedAvgPG("TabularPolicy", GRID, gamma=True)
    model = _grid_model()
    for bad in (25, -1, 1.5):
        with pytest.raises(ValueError, match="observation"):
            model.predict(np.array([bad]))


def test_stochastic_predictions_follow_the_model_seed():
    obs = np.arange(25).repeat(8)
    a = _grid_model(seed=4).predict(obs)[0]
    b = _grid_model(seed=4).predict(obs)[0]
    c = _grid_model(seed=5).predict(obs)[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_adapt_accepts_a_goal_tuple():
    model = _grid_model(policy_kwargs=dict(dtype=torch.float64))
    by_tuple = model.adapt((2, 2), n_trajectories=50, seed=1)
    by_dict = model.adapt({"goal": (2, 2)}, n_trajectories=50, seed=1)
    assert torch.equal(by_tuple.theta, by_dict.theta)


def test_partial_participation_averages_only_the_sampled_agents():
    policy = TabularPolicy(GRIDWORLD.observation_space(GRIDWORLD.train_tasks[0]), GRIDWORLD.action_space(GRIDWORLD.train_tasks[0]), dtype=torch.float64)
    params = stack_params(GRIDWORLD.train_tasks)
    estimator = FirstOrderMetaGradient(policy, 0.9, 2.0, 10, 10)
    fed = Federation(GRIDWORLD, params, policy, torch.tensor([2]))
    theta = torch.zeros(1, 100, dtype=torch.float64)
    new, mask = per_fedavg_pg_round(fed, theta, estimator, 0.3, 2, agents_per_round=3)
    # Replay the same round by hand: same streams, every agent's local update, mean over the mask.
    replay = Federation(GRIDWORLD, params, policy, torch.tensor([2]))
    again = replay.participation(3)
    assert torch.equal(again, mask) and float(mask.sum()) == 3.0
    from fedrl_algos.core import local_update

    local = local_update(estimator, replay.sampler, replay.broadcast(theta), 0.3, 2)[0]
    chosen = mask[0].bool()
    assert torch.allclose(new[0], local[chosen].mean(0), atol=1e-14)
    assert not torch.allclose(new[0], local.mean(0))


def test_neural_model_logs_monte_carlo_returns_by_default(tmp_path):
    from stable_baselines3.common.logger import configure

    model = PerFedAvgPG("MlpPolicy", ARC, variant="first_order", local_steps=1, m_in=4, m_out=4, seed=0, device="cpu")
    assert model.eval_trajectories == 32 and _grid_model().eval_trajectories == 32
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(total_rounds=2)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert "eval/return" in header and "eval/adapted_return" in header and "eval/agent_5/adapted_discounted_return" in header


def test_learn_stops_on_non_finite_parameters():
    """A round that makes the parameters NaN or infinite stops learn with an error naming the round."""
    # The server's own step overflows (the agents' updates are finite, so validation lets them through).
    model = _grid_model(FedAvgPG, local_steps=1, n_trajectories=4, server_optimizer="adam", server_step_size=float("inf"))
    with pytest.raises(FloatingPointError, match=r"FedAvgPG: round 1 produced \d+ non-finite parameters"):
        model.learn(total_rounds=3)
    assert model.rounds_done == 0  # the failed round is not counted
    # Non-finite local updates never reach the server: they are rejected and the round is skipped.
    model = _grid_model(FedAvgPG, step_size=float("inf"), local_steps=1, n_trajectories=4)
    before = model.theta
    with pytest.warns(RejectedUpdateWarning, match="round 1: rejected 8 update"):
        model.learn(total_rounds=1)
    assert torch.equal(model.theta, before) and model.rounds_done == 1
    independent = _grid_model(IndependentPG, step_size=float("inf"), n_trajectories=4)
    with pytest.raises(FloatingPointError, match="IndependentPG: round 1"):
        independent.learn(total_rounds=1)
