"""One evaluation protocol for every policy-gradient federation (fedrl_algos.common.evaluation):
the same ``evaluate_round`` keys and logged names, the per-agent values consistent with the means,
and evaluation that never changes a training run."""

from __future__ import annotations

import pytest
import torch
from stable_baselines3.common.logger import configure

from fedrl_algos import ALGORITHMS
from fedrl_algos.common.evaluation import DEFAULT_EVAL_TRAJECTORIES

PG_FEDERATIONS = ["per_fedavg_pg", "fedavg_pg", "independent_pg", "mfpo", "fedpg_br"]
ADAPTING = {"per_fedavg_pg", "fedavg_pg"}
#: one small round of each algorithm (the keys do not depend on the sizes)
SMALL = {
    "per_fedavg_pg": dict(local_steps=1, m_in=2, m_h=2, m_out=2),
    "fedavg_pg": dict(local_steps=1, n_trajectories=2),
    "independent_pg": dict(n_trajectories=2),
    "mfpo": dict(local_steps=1, n_trajectories=2),
    "fedpg_br": dict(batch_range=(2, 3), inner_batch_size=1),
}
CARTPOLE_AGENTS = [{"length": 0.4}, {"length": 0.6}, {"length": 0.8}]


def _model(name: str, env: str = "fedrl/CartPole-v0", **kwargs):
    policy = "TabularPolicy" if "GridWorld" in env else "MlpPolicy"
    agents = CARTPOLE_AGENTS if "CartPole" in env else None
    return ALGORITHMS[name](policy, env, agent_kwargs=agents, seed=0, device="cpu", **SMALL[name], **kwargs)


def _expected_keys(name: str, n_agents: int, tabular: bool) -> set[str]:
    prefixes = ("", "adapted_") if name in ADAPTING else ("",)
    keys = {f"{agent}{prefix}{metric}" for agent in ("", *(f"agent_{i}/" for i in range(n_agents)))
            for prefix in prefixes for metric in ("return", "discounted_return")}
    if tabular:
        keys |= {"exact_return"} | ({"exact_adapted_return"} if name in ADAPTING else set())
    return keys


@pytest.mark.parametrize("name", PG_FEDERATIONS)
def test_every_federation_reports_the_same_keys(name):
    model = _model(name, eval_trajectories=4, eval_adapt_trajectories=4) if name in ADAPTING else _model(name, eval_trajectories=4)
    model.learn(total_rounds=1)
    metrics = model.evaluate_round()
    assert set(metrics) == _expected_keys(name, 3, tabular=False)
    # the means are the means of the per-agent values, and discounting lowers CartPole's +1 rewards
    for prefix in ("", "adapted_") if name in ADAPTING else ("",):
        for metric in ("return", "discounted_return"):
            per_agent = [metrics[f"agent_{i}/{prefix}{metric}"] for i in range(3)]
            assert metrics[f"{prefix}{metric}"] == pytest.approx(sum(per_agent) / 3, rel=1e-6)
        assert metrics[f"{prefix}discounted_return"] < metrics[f"{prefix}return"]


@pytest.mark.parametrize("name", PG_FEDERATIONS)
def test_tabular_federations_add_their_exact_values(name):
    kwargs = dict(eval_trajectories=2, eval_adapt_trajectories=2) if name in ADAPTING else dict(eval_trajectories=2)
    model = _model(name, "fedrl/GridWorld-v0", **kwargs)
    n = model.n_agents
    assert set(model.evaluate_round()) == _expected_keys(name, n, tabular=True)


def test_evaluation_is_on_by_default_for_every_federation():
    for name in PG_FEDERATIONS:
        assert _model(name).eval_trajectories == DEFAULT_EVAL_TRAJECTORIES == 32
        assert _model(name, "fedrl/GridWorld-v0").eval_trajectories == 32


def test_zero_trajectories_turn_the_monte_carlo_part_off():
    assert _model("mfpo", eval_trajectories=0).evaluate_round() == {}
    assert set(_model("per_fedavg_pg", "fedrl/GridWorld-v0", eval_trajectories=0).evaluate_round()) == {"exact_return", "exact_adapted_return"}


def test_the_monte_carlo_return_estimates_the_exact_one():
    model = _model("independent_pg", "fedrl/GridWorld-v0", eval_trajectories=4000, policy_kwargs=dict(dtype=torch.float64))
    metrics = model.evaluate_round()
    # 4000 rollouts per agent of a return bounded by 1/(1 − 0.9) = 10: standard error < 0.1 per agent
    assert metrics["discounted_return"] == pytest.approx(metrics["exact_return"], abs=0.1)


def test_independent_learners_are_evaluated_with_their_own_parameters():
    model = _model("independent_pg", eval_trajectories=16)
    model.agent_theta[1] += 5.0 * torch.randn_like(model.agent_theta[1], generator=torch.Generator().manual_seed(0))
    metrics = model.evaluate_round()
    shared = _model("independent_pg", eval_trajectories=16).evaluate_round()
    assert metrics["agent_0/return"] == shared["agent_0/return"] and metrics["agent_2/return"] == shared["agent_2/return"]
    assert metrics["agent_1/return"] != shared["agent_1/return"]


@pytest.mark.parametrize("name", ["mfpo", "per_fedavg_pg"])
def test_logged_names_are_the_keys_and_per_agent_ones_stay_out_of_stdout(name, tmp_path, capsys):
    model = _model(name, eval_trajectories=4)
    model.set_logger(configure(str(tmp_path), ["csv", "stdout"]))
    model.learn(total_rounds=1)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert {f"eval/{k}" for k in _expected_keys(name, 3, tabular=False)} <= set(header)
    shown = capsys.readouterr().out
    assert "discounted_return" in shown and "agent_0" not in shown


def test_evaluating_never_changes_the_training_run(tmp_path):
    logged = _model("per_fedavg_pg", eval_trajectories=4, eval_adapt_trajectories=4)
    logged.set_logger(configure(str(tmp_path), ["csv"]))
    silent = _model("per_fedavg_pg", eval_trajectories=4, eval_adapt_trajectories=4)
    logged.learn(total_rounds=2)
    silent.learn(total_rounds=2)
    assert torch.equal(logged.theta, silent.theta)
