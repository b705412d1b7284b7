"""``fedrl reproduce`` tabular experiments, and the tabular fast paths of the core they run on."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch

from fedrl_algos.cli import main
from fedrl_algos.core import KernelSampler, policy_gradient, reward_to_go_weights, rollout
from fedrl_algos.core.estimators import autograd_hvp
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.core.federation import Federation
from fedrl_algos.per_fedavg_pg import ExactMetaGradient, FirstOrderMetaGradient
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import TabularPolicy
from fedrl_algos.policies.tabular import tabulate
from fedrl_algos.reproduce import EXPERIMENTS
from fedrl_algos.reproduce.tabular import ALPHAS, METHODS, PAPER, TabularConfig, train_tabular
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, index_params, repeat_params, stack_params

GAMMA = 0.9
RECORD_FIELDS = {"experiment", "method", "seed", "alpha", "round", "trajectories", "F", "f"}


def _policy(dtype=torch.float64) -> TabularPolicy:
    return TabularPolicy(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=dtype)


def _keys(runs: int, seed: int = 0) -> torch.Tensor:
    return derive_keys(torch.arange(runs).reshape(-1, 1) + seed, torch.arange(8).reshape(1, -1))


# --- the tabular fast path of the core --------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fast_rollout_is_bitwise_the_generic_rollout(dtype, monkeypatch):
    params = index_params(stack_params(GRIDWORLD.train_tasks), torch.arange(8).repeat(3))
    policy = _policy(dtype)
    theta = (torch.randn(3, 8, 100, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2).to(dtype)
    fast_streams, generic_streams = RandomStreams(_keys(3)), RandomStreams(_keys(3))
    assert policy.kernel_rollout_plan(GRIDWORLD, params) is not None
    fast = [rollout(GRIDWORLD, params, policy, theta, fast_streams, 7) for _ in range(2)]
    monkeypatch.setattr(TabularPolicy, "kernel_rollout_plan", lambda self, family, params: None)
    generic = [rollout(GRIDWORLD, params, policy, theta, generic_streams, 7) for _ in range(2)]
    for a, b in zip(fast, generic):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x, y)
    assert torch.equal(fast_streams.counters, generic_streams.counters)
    assert fast[0].rewards.sum() > 0  # some episode reached its goal


def test_tabulated_model_is_the_kernel():
    params = stack_params(GRIDWORLD.train_tasks)
    model = tabulate(GRIDWORLD, params, 25, 4)
    rows = torch.arange(8).repeat_interleave(100)
    states = torch.arange(25).repeat_interleave(4).repeat(8)
    actions = torch.arange(4).repeat(200)
    next_state, reward, terminated = GRIDWORLD.step(states, actions, index_params(params, rows))
    assert torch.equal(model.next_pos, next_state + rows * 25)
    assert torch.equal(model.reward, reward) and torch.equal(model.terminated, terminated)
    assert not model.any_terminal
    assert torch.equal(model.state_of, states) and torch.equal(model.action_of, actions)
    # the family's exact model (used by the evaluator) is the same table
    assert torch.equal(GRIDWORLD.next_state_table(params).reshape(-1), next_state)


def test_fast_path_needs_a_tabular_policy_and_discrete_cells():
    from fedrl_algos.policies import MlpPolicy
    from fedrl_envs import ARC_NAVIGATION

    params = stack_params(GRIDWORLD.train_tasks)
    mlp = MlpPolicy(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(8))
    assert mlp.kernel_rollout_plan(GRIDWORLD, params) is None
    arc = stack_params(ARC_NAVIGATION.train_tasks)
    assert mlp.kernel_rollout_plan(ARC_NAVIGATION, arc) is None
    small = TabularPolicy(gym.spaces.Discrete(9), gym.spaces.Discrete(4))  # does not match the 5 x 5 grid
    assert small.kernel_rollout_plan(GRIDWORLD, params) is None


def test_probability_table_cache_sees_in_place_changes():
    policy = _policy()
    theta = torch.zeros(2, 100, dtype=torch.float64)
    first = policy.probs_table(theta)
    assert policy.probs_table(theta) is first  # cached
    theta[0, :4] = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    second = policy.probs_table(theta)
    assert torch.equal(second, torch.softmax(theta.reshape(2, 25, 4), -1))
    assert not torch.equal(second, first)


def test_closed_forms_without_batch_dims_and_with_a_shared_direction():
    policy = _policy()
    params = stack_params(GRIDWORLD.train_tasks[2:3])
    theta = torch.randn(100, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    traj = rollout(GRIDWORLD, params, policy, theta.reshape(1, 100), RandomStreams(derive_keys(2, torch.arange(1))), 20)
    traj0 = type(traj)(*(x[0] for x in traj))  # θ [d], trajectories [m, T]
    auto = policy_gradient(policy, theta.reshape(1, 100), traj, GAMMA, closed_form=False)[0]
    assert torch.allclose(policy_gradient(policy, theta, traj0, GAMMA), auto, atol=1e-12)
    v = torch.randn(100, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    hv = policy.hvp(theta.reshape(1, 100), traj, v, reward_to_go_weights(traj, GAMMA))  # v shared, broadcast to θ
    assert torch.allclose(hv, autograd_hvp(policy, theta.reshape(1, 100), traj, v.reshape(1, 100), reward_to_go_weights(traj, GAMMA)), atol=1e-12)


@pytest.mark.parametrize("cls", [ExactMetaGradient, FirstOrderMetaGradient])
def test_tensor_alpha_rows_equal_scalar_alpha_runs(cls):
    """α as a per-run tensor [R, 1, 1] gives every run exactly what its scalar α gives it (α = 0 included)."""
    policy = _policy(torch.float32)
    params = stack_params(GRIDWORLD.train_tasks)
    alphas = [0.0, 0.5, 3.0]
    seeds = torch.tensor([7, 7, 2])  # two runs share a seed: common random numbers across α

    def make(alpha):
        return ExactMetaGradient(policy, GAMMA, alpha, 10, 10, 10) if cls is ExactMetaGradient else cls(policy, GAMMA, alpha, 10, 10)

    batched = Federation(GRIDWORLD, params, policy, seeds)
    theta = torch.zeros(3, 100)
    estimator = make(torch.tensor(alphas).reshape(3, 1, 1))
    for _ in range(2):
        theta, _ = per_fedavg_pg_round(batched, theta, estimator, 0.3, 3)
    for r, (alpha, seed) in enumerate(zip(alphas, seeds)):
        alone = Federation(GRIDWORLD, params, policy, seed.reshape(1))
        th = torch.zeros(1, 100)
        for _ in range(2):
            th, _ = per_fedavg_pg_round(alone, th, make(alpha), 0.3, 3)
        assert torch.equal(th[0], theta[r])
    with pytest.raises(ValueError, match="alpha"):
        make(torch.tensor([-1.0]))
    with pytest.raises(TypeError, match="alpha"):
        make(torch.tensor([1]))


def test_sampler_fast_path_shares_the_kernel_table_across_calls():
    policy = _policy()
    params = stack_params(GRIDWORLD.train_tasks)
    sampler = KernelSampler(GRIDWORLD, repeat_params(params, 1), policy, RandomStreams(derive_keys(0, torch.arange(8))))
    sampler(torch.zeros(8, 100, dtype=torch.float64), 2)
    plan = sampler._kernel_plan()
    assert plan is not None
    sampler(torch.zeros(8, 100, dtype=torch.float64), 2)
    assert sampler._kernel_plan() is plan  # tabulated once, kept on the sampler
    sampler.policy = _policy()
    assert sampler._kernel_plan() is not plan  # another policy object: planned anew


# --- the experiments ----------------------------------------------------------------------------------
def test_a_seed_gives_the_same_result_alone_or_batched():
    """Training is bitwise batch-independent; the exact evaluation agrees to float64 rounding."""
    cfg = TabularConfig().quick()
    alone = train_tabular([3], ALPHAS, cfg)
    batched = train_tabular([1, 2, 3], ALPHAS, cfg)
    for method in METHODS:
        assert torch.equal(alone[method].theta[..., 0, :], batched[method].theta[..., 2, :])
        assert torch.allclose(alone[method].F[..., 0], batched[method].F[..., 2], rtol=0, atol=1e-12)
        assert torch.allclose(alone[method].f[..., 0], batched[method].f[..., 2], rtol=0, atol=1e-12)
    # a single α (passed as a number) gives the α-sweep's row of that α (passed as a tensor row)
    single = train_tabular([3], [2.0], cfg)
    a = ALPHAS.index(2.0)
    for method in METHODS:
        assert torch.equal(single[method].theta[:, 0], alone[method].theta[:, a])
        assert torch.allclose(single[method].F[:, 0], alone[method].F[:, a], rtol=0, atol=1e-12)


def test_uniform_policy_value_is_the_papers_random_baseline():
    evaluator = TabularEvaluator("fedrl/GridWorld-v0", gamma=GAMMA)
    big_f, small_f = evaluator.meta_objective(torch.zeros(100, dtype=torch.float64), 2.0)
    assert abs(float(small_f) - PAPER["personalization"]["uniform"]) < 0.005  # 0.244: f(0), no adaptation
    assert float(big_f) > float(small_f)


def _load(path):
    payload = json.loads((path / "results.json").read_text())
    assert {"experiment", "settings", "wall_time_s", "cpu_time_s", "machine", "records"} <= set(payload)
    for record in payload["records"]:
        assert set(record) == RECORD_FIELDS
    return payload


def test_quick_personalization_through_the_cli(tmp_path, capsys):
    assert main(["reproduce", "personalization", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    out = tmp_path / "personalization"
    for name in ("results.json", "report.md", "fig1_left_trajectories.png", "fig6_rounds.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    payload = _load(out)
    cfg = TabularConfig().quick()
    records = payload["records"]
    assert payload["settings"]["seeds"] == 2 and payload["settings"]["quick"] is True
    assert len(records) == len(METHODS) * 2 * (cfg.rounds + 1)
    assert {r["method"] for r in records} == set(METHODS) and {r["seed"] for r in records} == {0, 1}
    for r in records:
        assert r["experiment"] == "personalization" and r["alpha"] == 2.0
        assert 0.0 < r["f"] < 1.0 and 0.0 < r["F"] < 1.0
        per_step = 20 if r["method"] == "first_order" else 30
        assert r["trajectories"] == r["round"] * cfg.tau * per_step
        if r["method"] == "exact":
            assert r["F"] >= r["f"]  # the adaptation step helps at α = 2
        if r["round"] == 0:  # every run starts from the uniform policy
            assert abs(r["f"] - 0.24387) < 1e-4
    report = (out / "report.md").read_text()
    for number in ("0.790", "0.730", "0.680", "0.240", "0.510", "0.710"):
        assert number in report
    # a smoke run's numbers beside the paper's say what they are (issue 36), in the report and the printed line
    label = f"QUICK SMOKE RUN: {cfg.rounds} rounds, 2 seeds, not comparable with the paper"
    assert label in report and "this run (quick smoke)" in report
    printed = capsys.readouterr().out
    assert f"personalization: {label}; " in printed


def test_quick_alpha_through_the_cli(tmp_path):
    assert main(["reproduce", "alpha", "--quick", "--seeds", "3", "--out", str(tmp_path), "--no-progress"]) == 0
    out = tmp_path / "alpha"
    for name in ("results.json", "report.md", "fig1_right_alpha.png", "alpha_rounds.png"):
        assert (out / name).is_file()
    payload = _load(out)
    records = payload["records"]
    assert {r["alpha"] for r in records} == set(ALPHAS) and {r["seed"] for r in records} == {0, 1, 2}
    assert len(records) == len(METHODS) * len(ALPHAS) * 3 * (TabularConfig().quick().rounds + 1)
    by_key = {(r["method"], r["alpha"], r["seed"], r["round"]): r for r in records}
    for r in records:
        if r["alpha"] == 0.0:
            assert r["F"] == r["f"]  # no adaptation at α = 0
        elif r["method"] == "exact":
            assert r["F"] >= r["f"]
        if r["method"] == "fedavg":  # trained once per seed: f does not depend on α
            assert r["f"] == by_key[("fedavg", 0.0, r["seed"], r["round"])]["f"]
    for method in METHODS:  # round 0 is the uniform policy: F grows with α, f does not depend on it
        start = [by_key[(method, alpha, 0, 0)] for alpha in ALPHAS]
        assert [r["F"] for r in start] == sorted({r["F"] for r in start})
        assert len({r["f"] for r in start}) == 1
    report = (out / "report.md").read_text()
    for number in ("0.490", "0.480", "0.920", "0.870", "0.780"):
        assert number in report


def test_cli_lists_every_experiment_and_validates_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    text = capsys.readouterr().out
    for name in ("personalization", "alpha", "all"):
        assert name in text
    assert {"personalization", "alpha"} <= set(EXPERIMENTS)
    with pytest.raises(SystemExit):
        main(["reproduce", "no-such-experiment"])
    with pytest.raises(SystemExit):
        main(["reproduce", "alpha", "--seeds", "0"])


# --- full configurations (slow) ---------------------------------------------------------------------
@pytest.mark.slow
def test_full_personalization_matches_the_paper():
    results = train_tabular(range(10), [2.0])
    final = {m: float(results[m].F[-1, 0].mean()) for m in METHODS}
    assert final["exact"] > final["first_order"] > final["fedavg"]
    for m in METHODS:
        assert abs(final[m] - PAPER["personalization"]["F"][m]) <= 0.05
    assert abs(float(results["exact"].f[-1, 0].mean()) - PAPER["personalization"]["f_exact"]) <= 0.05


@pytest.mark.slow
def test_full_alpha_sweep_matches_the_paper():
    results = train_tabular(range(10), ALPHAS)
    for alpha, paper in PAPER["alpha"].items():
        a = ALPHAS.index(alpha)
        for m in METHODS:
            assert abs(float(results[m].F[-1, a].mean()) - paper[m]) <= 0.05
    gaps = [float(results["exact"].F[-1, a].mean() - results["fedavg"].F[-1, a].mean()) for a in range(len(ALPHAS))]
    assert gaps == sorted(gaps)  # the benefit of personalization grows with α


def test_cli_lists_mfpo_experiments_and_takes_env(tmp_path, capsys):
    from fedrl_algos.reproduce import EXPERIMENTS

    assert {"mfpo", "byzantine"} <= set(EXPERIMENTS)
    # ``all`` is every experiment (README: "every experiment")
    assert all(experiment.include_in_all for experiment in EXPERIMENTS.values())
    assert main(["reproduce", "byzantine", "--quick", "--env", "cartpole", "--out", str(tmp_path), "--no-progress"]) == 0
    assert (tmp_path / "byzantine" / "results.json").exists()
    assert main(["reproduce", "alpha", "--quick", "--env", "cartpole", "--out", str(tmp_path), "--no-progress"]) == 2


def test_cli_budget_flags_set_config_fields_of_only_the_experiments_that_take_them(tmp_path, capsys):
    assert main(["reproduce", "mfpo", "--quick", "--budget", "2e5", "--sb3-budget", "1e4", "--no-sweeps",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    settings = json.loads((tmp_path / "mfpo" / "results.json").read_text())["settings"]
    # --quick shrinks the flagged config: its budgets are the smoke run's, the other fields are kept
    assert settings["sweeps"] is False and settings["env"] == "cartpole" and settings["budget"] == 0.0
    assert "agents_sweep" not in {r["part"] for r in json.loads((tmp_path / "mfpo" / "results.json").read_text())["records"]}
    assert main(["reproduce", "byzantine", "--quick", "--no-sweeps", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--no-sweeps applies to mfpo, not byzantine" in capsys.readouterr().err
    assert main(["reproduce", "alpha", "--quick", "--budget", "1e5", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--budget applies to byzantine, mfpo, not alpha" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reproduce", "mfpo", "--budget", "-3"])


def test_python_dash_m_cli_has_the_reproduce_command():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fedrl_algos.cli", "reproduce", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--budget" in done.stdout
