"""``fedrl bench training``: whole rounds timed with the steps inside episodes counted, next to the bare env."""

import pytest
import torch

from fedrl_algos import MFPO, FedPGBR, PerFedAvgPG
from fedrl_algos.bench.training import CountingSampler, _count_steps, _model_env_steps, bench_training


def test_fedpg_br_round_is_timed_against_the_bare_env():
    (record,) = bench_training(configs=("fedpg_br-cartpole",), rounds=1, repeats=1, min_time=0.01, show=False)
    # The agents sample B_max = 18 trajectories each per call: the bare env runs that batch.
    assert record.n_agents == 10 and record.envs_per_agent == 18 and record.rounds == 1
    assert record.budget_steps == 10 * 18 * 500  # num_timesteps: B_max trajectories x (H + 1) per agent
    # CartPole episodes of a fresh policy end long before the horizon: far fewer steps ran.
    assert 0 < record.env_steps < record.budget_steps / 5
    # The samplers' count holds all B_max agent trajectories and the server's; the model's own,
    # the B_t used ones and the server's.
    assert 0 < record.algorithm_env_steps <= record.env_steps
    assert record.training_steps_per_s == pytest.approx(record.env_steps / record.seconds)
    assert record.fraction == pytest.approx(record.training_steps_per_s / record.bare_env_steps_per_s)


def _learn_counted(model, rounds=2):
    counter = _count_steps(model)[0]
    before = _model_env_steps(model)
    model.learn(total_rounds=rounds)
    # The model's count is a float32 mean over agents times n: round it.
    return counter.steps, round(_model_env_steps(model) - before)


def test_counted_steps_are_the_models_own_count_for_mfpo():
    model = MFPO("MlpPolicy", "fedrl/CartPole-v0", n_trajectories=3, local_steps=2, seed=1, device="cpu")
    counted, own = _learn_counted(model)
    assert counted == own > 0
    assert counted < model.num_timesteps  # num_timesteps charges 500 steps to every trajectory


def test_counted_steps_include_fedpg_brs_server_sampling():
    # B_min = B_max: the agents use every trajectory they sample, so both counts must agree,
    # the server's inner-loop trajectories included.
    model = FedPGBR("MlpPolicy", "fedrl/CartPole-v0", batch_range=(3, 3), inner_batch_size=2, seed=2, device="cpu")
    counted, own = _learn_counted(model, rounds=3)
    assert model.server_env_steps > 0
    assert counted == own
    agents_only = model.env_steps_per_agent * model.n_agents
    assert counted > agents_only


def test_fixed_horizon_episodes_count_their_whole_budget():
    # Arc navigation never terminates early: every trajectory runs H + 1 steps.
    model = PerFedAvgPG("MlpPolicy", "fedrl/ArcNavigation-v0", seed=0, device="cpu", local_steps=1)
    counter = _count_steps(model)[0]
    model.learn(total_rounds=1)
    assert counter.steps == model.num_timesteps


def test_counting_changes_nothing_the_model_computes():
    plain = FedPGBR("MlpPolicy", "fedrl/CartPole-v0", batch_range=(2, 4), seed=3, device="cpu").learn(total_rounds=2)
    counted = FedPGBR("MlpPolicy", "fedrl/CartPole-v0", batch_range=(2, 4), seed=3, device="cpu")
    _count_steps(counted)
    counted.learn(total_rounds=2)
    assert torch.equal(plain.policy.theta, counted.policy.theta)


def test_counting_sampler_sums_the_masks_and_shares_its_count():
    model = MFPO("MlpPolicy", "fedrl/CartPole-v0", n_trajectories=2, local_steps=1, seed=4, device="cpu")
    inner = model.federation.sampler
    sampler = CountingSampler(inner)
    theta = model.policy.theta.detach().expand(1, model.n_agents, -1)
    traj = sampler(theta, 5)
    assert sampler.steps == int(traj.mask.sum()) > 0
    other = sampler.with_policy(inner.policy)
    traj2 = other(theta, 1)
    assert sampler.steps == other.steps == int(traj.mask.sum() + traj2.mask.sum())
    assert sampler.streams is inner.streams  # other attributes are the wrapped sampler's


@pytest.mark.parametrize("kwargs, match", [({"configs": ("ppo-cartpole",)}, "configs"), ({"rounds": 0}, "rounds"), ({"repeats": 0}, "repeats")])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench_training(show=False, **kwargs)


def test_the_compiled_arc_configuration_trains_the_same_federation_with_the_compiled_kernels(monkeypatch):
    pytest.importorskip("numba")
    arc, compiled = bench_training(configs=("per_fedavg_pg-arc", "per_fedavg_pg-arc-numba"), rounds=1, repeats=1,
                                   min_time=0.01, show=False)
    assert compiled.config == "per_fedavg_pg-arc-numba"
    # the same federation and budget: only the kernels differ
    assert (compiled.n_agents, compiled.envs_per_agent, compiled.env_steps) == (arc.n_agents, arc.envs_per_agent, arc.env_steps)
    import fedrl_envs.fused

    monkeypatch.setattr(fedrl_envs.fused, "numba_available", lambda: False)
    assert bench_training(configs=("per_fedavg_pg-arc-numba",), rounds=1, repeats=1, min_time=0.01, show=False) == []


def test_federations_of_n_drawn_agents_are_timed_eager_or_captured():
    from fedrl_algos.bench.training import agent_kwargs_for

    agents = agent_kwargs_for("fedrl/CartPole-v0", 5, seed=1)
    assert len(agents) == 5 and all(0.3 <= a["length"] <= 0.9 and 0.5 <= a["masscart"] <= 1.5 for a in agents)
    assert agents == agent_kwargs_for("fedrl/CartPole-v0", 5, seed=1) != agent_kwargs_for("fedrl/CartPole-v0", 5, seed=2)
    goals = [a["goal"] for a in agent_kwargs_for("fedrl/ArcNavigation-v0", 4)]
    assert all(abs((x * x + y * y) ** 0.5 - 0.8) < 1e-6 and x >= 0 for x, y in goals)
    with pytest.raises(ValueError, match="agents are drawn for"):
        agent_kwargs_for("fedrl/GridWorld-v0", 2)
    eager, captured = (bench_training(configs=("per_fedavg_pg-arc",), rounds=1, repeats=1, min_time=0.01, show=False, n_agents=3,
                                      capture=capture)[0] for capture in (False, True))
    assert eager.n_agents == captured.n_agents == 3
    assert not eager.captured and captured.captured and captured.env_steps == eager.env_steps
