"""Declarative experiments: frozen configs, their quick variants, reentrant runs, and the CLI's flags."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
import torch

import fedrl_algos.cli.reproduce as reproduce_cli
from fedrl_algos.cli import main
from fedrl_algos.policies.kernel_choice import resolve_kernels
from fedrl_algos.reproduce import EXPERIMENTS, ExperimentOutput, config_settings, run_experiment
from fedrl_algos.reproduce.mfpo import MEASURED_RATES, MethodConfig

#: the flags that set a config field, with a value, by the field they set
FLAGS = {"env": ["--env", "cartpole"], "budget": ["--budget", "1e5"], "sb3_budget": ["--sb3-budget", "1e4"], "sweeps": ["--no-sweeps"]}


def _flag_name(field: str) -> str:
    return FLAGS[field][0]


# --- frozen configs and their quick variants -----------------------------------------------------
@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_config_is_frozen_and_quick_is_a_smaller_config_of_the_same_type(name):
    experiment = EXPERIMENTS[name]
    config = experiment.config_class()
    assert dataclasses.is_dataclass(config) and experiment.config() == config
    first = dataclasses.fields(config)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, first, getattr(config, first))
    quick = config.quick()
    assert type(quick) is type(config) and quick != config
    assert quick.quick() == quick  # idempotent: run_experiment may apply it to an already quick config
    assert experiment.config(quick=True) == quick
    json.dumps(config_settings(config))  # every field has a JSON form for results.json


def test_nested_method_config_is_frozen_too():
    config = EXPERIMENTS["mfpo"].config_class()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.methods.local_steps = 3
    assert isinstance(config.methods, MethodConfig)


def test_quick_keeps_the_fields_that_do_not_set_the_size():
    mfpo = EXPERIMENTS["mfpo"].config(quick=True, env="pendulum", sweeps=False, budget=2e5)
    assert mfpo.env == "pendulum" and mfpo.sweeps is False and mfpo.budget == 0.0
    alpha = EXPERIMENTS["alpha"].config(quick=True, alphas=(0.0, 1.0))
    assert alpha.alphas == (0.0, 1.0) and alpha.rounds == 4 and alpha.tau == 2


def test_config_rejects_unknown_fields_and_bad_values():
    with pytest.raises(ValueError, match="unknown option"):
        EXPERIMENTS["alpha"].config(env="cartpole")
    with pytest.raises(ValueError, match="env"):
        EXPERIMENTS["byzantine"].config(env="walker")  # not a row of Table I
    with pytest.raises(ValueError, match="byzantine_agents"):
        EXPERIMENTS["byzantine"].config(byzantine_agents=(0, 10))
    with pytest.raises(ValueError, match="methods"):
        EXPERIMENTS["personalization"].config(methods=("exact", "maml"))
    with pytest.raises(TypeError, match="AlphaConfig"):
        run_experiment(EXPERIMENTS["alpha"], "unused", seeds=1, config=EXPERIMENTS["personalization"].config_class())


# --- what the command line runs ---------------------------------------------------------------------
@pytest.fixture
def calls(monkeypatch):
    """Replace the CLI's run_experiment by a recorder of (name, config, quick)."""
    seen = []

    def record(experiment, out, seeds, quick, device, progress, config):
        seen.append((experiment.name, config, quick, seeds))
        return {"wall_time_s": 0.0, "records": []}

    monkeypatch.setattr(reproduce_cli, "run_experiment", record)
    return seen


def test_quick_runs_the_quick_variant_of_every_experiment_in_all(calls, tmp_path):
    assert main(["reproduce", "all", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    assert [c[0] for c in calls] == [n for n, e in EXPERIMENTS.items() if e.include_in_all]
    for name, config, quick, seeds in calls:
        assert quick is True and seeds == reproduce_cli.QUICK_SEEDS
        assert config.quick() == EXPERIMENTS[name].config_class().quick()


def test_flags_become_config_fields(calls, tmp_path):
    assert main(["reproduce", "mfpo", "--env", "pendulum", "--budget", "2e5", "--sb3-budget", "1e4", "--no-sweeps",
                 "--out", str(tmp_path)]) == 0
    assert calls[0][1] == dataclasses.replace(EXPERIMENTS["mfpo"].config_class(), env="pendulum", budget=2e5, sb3_budget=1e4,
                                              sweeps=False)
    assert calls[0][2] is False and calls[0][3] == reproduce_cli.DEFAULT_SEEDS


def test_an_inapplicable_flag_is_an_error_naming_the_experiments_that_take_it(calls, tmp_path, capsys):
    for field in FLAGS:
        takers = sorted(n for n, e in EXPERIMENTS.items() if field in e.config_fields())
        assert takers == (["mfpo"] if field in ("sb3_budget", "sweeps") else ["byzantine", "mfpo"])
        for name in EXPERIMENTS:
            if name in takers:
                continue
            assert main(["reproduce", name, *FLAGS[field], "--out", str(tmp_path)]) == 2
            assert capsys.readouterr().err == f"fedrl reproduce: {_flag_name(field)} applies to {', '.join(takers)}, not {name}\n"
    # ``all`` stops at its first experiment that does not take the flag, before running anything
    assert main(["reproduce", "all", "--env", "cartpole", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "fedrl reproduce: --env applies to byzantine, mfpo, not personalization\n"
    assert calls == []


def test_results_settings_hold_the_config_of_a_quick_run(tmp_path):
    assert main(["reproduce", "personalization", "--quick", "--seeds", "1", "--out", str(tmp_path), "--no-progress"]) == 0
    settings = json.loads((tmp_path / "personalization" / "results.json").read_text())["settings"]
    expected = config_settings(EXPERIMENTS["personalization"].config_class().quick())
    expected["kernels"] = resolve_kernels(expected["kernels"])  # the run records the kernels that ran
    assert {k: settings[k] for k in expected} == expected
    assert settings["quick"] is True and settings["seeds"] == 1 and settings["K"] == expected["rounds"]


# --- reentrancy --------------------------------------------------------------------------------------
def _run(name: str, config, seeds: int = 2) -> ExperimentOutput:
    return EXPERIMENTS[name].run(config, seeds=seeds, device="cpu", progress=False)


def test_runs_with_different_configs_interleave(monkeypatch):
    """Two configs of each experiment run at once (threads) give what each gives alone, and leave
    the experiment objects as they were."""
    # One intra-op thread for everybody, so that the runs' thread-count contexts change nothing
    # and a reduction cannot depend on which run restored the count first.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alpha, curvature = EXPERIMENTS["alpha"].config(quick=True), EXPERIMENTS["curvature"].config(quick=True)
        jobs = [
            ("alpha", alpha),
            ("alpha", dataclasses.replace(alpha, alphas=(0.0, 1.0), methods=("exact", "fedavg"), rounds=3)),
            ("curvature", curvature),
            ("curvature", dataclasses.replace(curvature, m_hs=(50,), rounds=2, eval_every=1)),
        ]
        state = {name: dict(vars(EXPERIMENTS[name])) for name, _ in jobs}
        alone = [_run(name, config).records for name, config in jobs]
        together: list = [None] * len(jobs)

        def work(i: int) -> None:
            together[i] = _run(*jobs[i]).records

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_num_threads(before)
    for (name, config), a, b in zip(jobs, alone, together):
        assert a == b, f"{name} {config}: the interleaved run differs from the run alone"
    assert alone[0] != alone[1] and alone[2] != alone[3]  # the configs did change the runs
    assert {r["alpha"] for r in alone[1]} == {0.0, 1.0} and {r["m_h"] for r in alone[3]} == {50, None}
    for name, _ in jobs:
        assert vars(EXPERIMENTS[name]) == state[name]
    # and sequentially: a run after another config's run is the same as before it
    assert _run(*jobs[0]).records == alone[0]


# --- defaults that fit the machine, expected wall times and progress ---------------------------------
def test_default_sb3_budget_is_the_reduced_run_and_paper_selects_the_papers_size(calls, tmp_path, capsys):
    from fedrl_algos.reproduce.mfpo import PAPER_BUDGET, SB3_REDUCED_BUDGETS

    assert main(["reproduce", "mfpo", "--env", "cartpole", "--out", str(tmp_path)]) == 0
    config = calls[-1][1]
    assert config.budget is None and config.resolved_budget == config.resolved_sweep_budget == PAPER_BUDGET == 1e6
    assert config.resolved_sb3_budget == SB3_REDUCED_BUDGETS["cartpole"] == 2e4
    assert main(["reproduce", "mfpo", "--env", "pendulum", "--out", str(tmp_path)]) == 0
    assert calls[-1][1].resolved_sb3_budget == 1e4
    assert main(["reproduce", "mfpo", "--sb3-budget", "paper", "--out", str(tmp_path)]) == 0
    assert calls[-1][1].sb3_budget == calls[-1][1].resolved_sb3_budget == 1e6
    assert main(["reproduce", "byzantine", "--budget", "PAPER", "--out", str(tmp_path)]) == 0
    assert calls[-1][1].budget == 1e6
    # the default reduced run never exceeds a smaller --budget
    assert main(["reproduce", "mfpo", "--budget", "5e3", "--out", str(tmp_path)]) == 0
    assert calls[-1][1].resolved_sb3_budget == 5e3
    with pytest.raises(SystemExit):
        main(["reproduce", "mfpo", "--sb3-budget", "papers"])
    assert "must be a number > 0, got 'papers'" in capsys.readouterr().err


def test_mujoco_and_atari_rows_default_to_the_reduced_budgets_and_paper_selects_1e6(calls, tmp_path):
    from fedrl_algos.reproduce.mfpo import ATARI_HORIZON, PAPER_BUDGET, REDUCED_BUDGETS, paper_methods

    assert set(REDUCED_BUDGETS) == {"halfcheetah", "hopper", "pong", "breakout"}
    for env, budget in REDUCED_BUDGETS.items():
        assert main(["reproduce", "mfpo", "--env", env, "--out", str(tmp_path)]) == 0
        config = calls[-1][1]
        assert config.resolved_budget == config.resolved_sweep_budget == budget < PAPER_BUDGET
        assert config.resolved_sb3_budget == min(1e4, budget)
        assert main(["reproduce", "mfpo", "--env", env, "--budget", "paper", "--out", str(tmp_path)]) == 0
        assert calls[-1][1].resolved_budget == PAPER_BUDGET == 1e6
        # the paper's methods for the row; Atari episodes are capped (the ALE ids register no limit)
        methods = paper_methods(env, calls[-1][1].methods)
        assert methods.local_steps == 20 and methods.net_arch == (256, 256) and methods.squash == "tanh"
        assert methods.horizon == (ATARI_HORIZON if env in ("pong", "breakout") else None)
    assert REDUCED_BUDGETS["hopper"] == 2e4 and REDUCED_BUDGETS["pong"] == REDUCED_BUDGETS["halfcheetah"] == 1e3
    # an explicit sweep budget is kept apart from the comparison's
    config = EXPERIMENTS["mfpo"].config(env="hopper", sweep_budget=2e3)
    assert config.resolved_sweep_budget == 2e3 and config.resolved_budget == REDUCED_BUDGETS["hopper"]


def test_the_expected_wall_time_is_printed_to_stderr_before_the_run(calls, tmp_path, capsys):
    assert main(["reproduce", "mfpo", "--env", "cartpole", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    estimate = EXPERIMENTS["mfpo"].estimate_wall_time(calls[-1][1], reproduce_cli.DEFAULT_SEEDS)
    assert f"fedrl reproduce mfpo: expected wall time {estimate.describe()} with 10 seeds" in err
    assert "measured on a 2-core machine" in err and "ETA" in err
    assert "expected wall time" not in out  # stdout keeps only the results lines
    # every phase of the default run, from measured rates: 20 min to 3 h on two cores, Fed-DQN at 2e4 about 13 min
    assert set(estimate.parts) == {"MFPO", "FedAvg-PG", "FedPG-BR", "Fed-DQN", "sweeps"}
    assert 20 * 60 < estimate.seconds < 3 * 3600 and 10 * 60 < estimate.parts["Fed-DQN"] < 16 * 60
    # the estimate scales with what it is estimated from: seeds and the SB3 budget
    double = EXPERIMENTS["mfpo"].estimate_wall_time(calls[-1][1], 20)
    assert double.seconds == pytest.approx(2 * estimate.seconds)
    paper = EXPERIMENTS["mfpo"].estimate_wall_time(EXPERIMENTS["mfpo"].config(sb3_budget=1e6), 10)
    assert paper.parts["Fed-DQN"] == pytest.approx(50 * estimate.parts["Fed-DQN"]) and paper.parts["Fed-DQN"] > 10 * 3600
    # a row without measured rates says so instead of guessing
    assert "unknown" in EXPERIMENTS["mfpo"].estimate_wall_time(EXPERIMENTS["mfpo"].config(env="breakout"), 3).describe()
    # measured rows: MFPO on Hopper and Pong at their reduced default budgets, never less than the
    # first round that a run always completes (Pong's 1e3 budget is one round of ~7e5 steps per agent)
    from fedrl_algos.reproduce.mfpo import FIRST_ROUND_STEPS, _least_steps

    assert _least_steps("hopper", "FedAvg-PG") == FIRST_ROUND_STEPS["hopper"]["FedAvg-PG"] and _least_steps("cartpole", "MFPO") == 0.0
    for env in ("hopper", "pong"):
        config = EXPERIMENTS["mfpo"].config(env=env, sweeps=False)
        est = EXPERIMENTS["mfpo"].estimate_wall_time(config, 3)
        steps = max(config.resolved_budget, _least_steps(env, "MFPO"))
        assert est.parts["MFPO"] == pytest.approx(3 * 10 * steps / 1e6 * MEASURED_RATES[env]["MFPO"])
        if env == "pong":
            assert est.parts["FedAvg-PG"] is None and "unknown" in est.describe()
    hopper = EXPERIMENTS["mfpo"].estimate_wall_time(EXPERIMENTS["mfpo"].config(env="hopper", sweeps=False), 10)
    # 2e4 steps per agent (one MFPO round runs 26,100), 10 seeds × 10 agents: ≈ 27 min for MFPO, every method measured
    assert 20 * 60 < hopper.parts["MFPO"] < 35 * 60 and set(hopper.parts) >= {"MFPO", "FedAvg-PG", "FedPG-BR"}
    for method in ("FedAvg-PG", "FedPG-BR"):  # whole rounds: FedAvg-PG's default run takes two
        expected = 10 * 10 * max(2e4, FIRST_ROUND_STEPS["hopper"][method]) / 1e6 * MEASURED_RATES["hopper"][method]
        assert hopper.parts[method] == pytest.approx(expected)
    paper = EXPERIMENTS["mfpo"].estimate_wall_time(EXPERIMENTS["mfpo"].config(env="hopper", budget=1e6, sweeps=False), 10)
    assert paper.parts["MFPO"] == pytest.approx(1e6 / max(2e4, FIRST_ROUND_STEPS["hopper"]["MFPO"]) * hopper.parts["MFPO"])
    # ``all`` runs every experiment and prints their total
    calls.clear()
    assert main(["reproduce", "all", "--out", str(tmp_path)]) == 0
    assert [c[0] for c in calls] == list(EXPERIMENTS)
    err = capsys.readouterr().err
    assert all(f"fedrl reproduce {name}: expected wall time ≈" in err for name in EXPERIMENTS)
    assert f"expected wall time of the {len(EXPERIMENTS)} experiments ≈" in err


def test_every_phase_of_a_quick_run_shows_a_progress_bar_on_stderr(monkeypatch, capsys):
    """The comparison's three methods and its SB3 baseline, each a bar with a total (hence an ETA)."""
    import fedrl_algos.reproduce.mfpo as mfpo

    seen = []

    def fake_sb3(method, env, seeds, budget, n_agents=10, device="cpu", bar=None):
        # the real one advances ``bar`` through a StepsProgressCallback (its own test below)
        seen.append(bar)
        bar.update(bar.total)
        return []

    monkeypatch.setattr(mfpo, "train_sb3_baseline", fake_sb3)
    config = EXPERIMENTS["mfpo"].config(quick=True, sweeps=False)
    EXPERIMENTS["mfpo"].run(config, seeds=1, device="cpu", progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    for phase in ("MFPO", "FedAvg-PG", "FedPG-BR"):
        assert f"{phase}:   0%|          | 0.00/2.00 [" in err  # 2 quick rounds: the bar has a total, so an ETA
    assert seen and seen[0] is not None and seen[0].total == 60  # Fed-DQN: 60 steps per agent × 1 seed
    assert "Fed-DQN:   0%|" in err and "/60.0 [" in err and "steps/agent" in err


def test_steps_progress_callback_counts_steps_per_agent_up_to_the_total():
    from types import SimpleNamespace

    from fedrl_algos.reproduce.sb3_baselines import StepsProgressCallback

    class Bar:  # what the callback uses of a tqdm bar
        total, n = 100, 0.0

        def update(self, k):
            self.n += k

    bar = Bar()
    callback = StepsProgressCallback(bar, n_agents=4)
    callback.model = SimpleNamespace(num_timesteps=0)
    callback._on_training_start()
    for steps in (40, 200, 480):  # rounds of 10, 40 and 70 steps per agent; the last overshoots
        callback.model.num_timesteps = steps
        assert callback._on_step() is True
    assert bar.n == 100
    with pytest.raises(ValueError, match="n_agents"):
        StepsProgressCallback(bar, n_agents=0)


def test_a_quick_reproduce_run_shows_progress_on_stderr_and_results_on_stdout(tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "fedrl_algos.cli", "reproduce", "alpha", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "alpha" in run.stderr and "%|" in run.stderr and "round" in run.stderr  # tqdm's bar with its rate
    assert "--quick smoke runs" in run.stderr
    assert run.stdout.startswith("alpha: ") and "%|" not in run.stdout


def test_the_methods_policy_initialization_reaches_the_policy():
    from fedrl_algos.policies import MlpPolicy
    from fedrl_algos.reproduce.mfpo import Population

    default = Population("pendulum", [0], 2, MethodConfig(squash="tanh")).policy
    assert default.init_std == [0.5, 0.5, 0.1] and default.log_std_init == 0.0
    pop = Population("pendulum", [0], 2, MethodConfig(squash="tanh", init_std=(0.5, 0.01), log_std_init=-0.5))
    assert pop.policy.init_std == [0.5, 0.5, 0.01] and pop.policy.log_std_init == -0.5
    same = MlpPolicy(pop.policy.observation_space, pop.policy.action_space, net_arch=(16, 16), squash="tanh", init_std=(0.5, 0.01),
                     log_std_init=-0.5)
    assert torch.equal(pop.policy.theta, same.theta) and float(pop.policy.theta[-1]) == -0.5
    orthogonal = Population("pendulum", [0], 2, MethodConfig(squash="tanh", init_gains=(1.0, 0.5))).policy
    assert orthogonal.init_gains == (1.0, 0.5)
