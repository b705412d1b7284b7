"""``fedrl train`` and ``fedrl plot`` on an environment registered in a module of the test.

``fedrl_test_train_env`` is written into a temporary folder by the fixture below and imported by the
command line through ``--env-module``: a point on a line moves left or right by 0.1 and earns 1 per
step at or beyond its agent's own ``target`` (the agents differ by ``agent_kwargs``). Two algorithms
× two seeds train into run directories; the test checks their files, that rerunning resumes (rounds
already trained are not redone, and a run resumed from a checkpoint ends bitwise where the
uninterrupted one ended), that ``fedrl plot`` overlays both runs, and that bad input is refused
before anything is trained or written.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedrl_algos.cli import main

MODULE = "fedrl_test_train_env"
ENV_ID = "FedrlTestTrainReach-v0"
AGENTS = [{"target": 0.3}, {"target": 0.5}]
ENV_SOURCE = f'''
import gymnasium as gym
import numpy as np


class Reach(gym.Env):
    """A point on [-1, 1]; each step at or beyond ``target`` earns 1."""

    def __init__(self, target: float = 0.5) -> None:
        self.target = float(target)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.x = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-0.2, 0.2))
        return np.array([self.x], np.float32), {{}}

    def step(self, action):
        self.x = float(np.clip(self.x + (0.1 if int(action) == 1 else -0.1), -1.0, 1.0))
        return np.array([self.x], np.float32), float(self.x >= self.target), False, False, {{}}


if "{ENV_ID}" not in gym.registry:
    gym.register("{ENV_ID}", entry_point=Reach, max_episode_steps=10)
'''
#: tiny runs: 2 agents x 10 steps per episode, a few trajectories per round
ALGOS = {
    "mfpo": {"local_steps": 2, "n_trajectories": 4},
    "fedavg_pg": {"local_steps": 2, "n_trajectories": 4, "eval_adapt_trajectories": 4},
}


@pytest.fixture(scope="module")
def env_module(tmp_path_factory):
    """The user's module that registers the env, importable (on ``sys.path``) as ``fedrl train`` needs it."""
    folder = tmp_path_factory.mktemp("user_env")
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(ENV_SOURCE))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield MODULE
    sys.modules.pop(MODULE, None)


def _train_argv(algo: str, out: Path, rounds: int = 4, *extra: str) -> list[str]:
    return ["train", "--algo", algo, "--env", ENV_ID, "--env-module", MODULE, "--agent-kwargs", json.dumps(AGENTS),
            "--algo-kwargs", json.dumps(ALGOS[algo]), "--seeds", "2", "--rounds", str(rounds), "--checkpoint-every", "2",
            "--eval-trajectories", "4", "--device", "cpu", "--no-progress", "--out", str(out), *extra]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _rounds(path: Path) -> list[int]:
    return [int(float(r["train/round"])) for r in _rows(path)]


def _theta(path: Path, algo: str) -> torch.Tensor:
    from fedrl_algos import ALGORITHMS

    return ALGORITHMS[algo].load(path, device="cpu").policy.theta.detach().clone()


def test_train_two_algorithms_resume_and_overlay(env_module, tmp_path, capsys, monkeypatch):
    runs = {algo: tmp_path / "runs" / algo for algo in ALGOS}
    for algo, out in runs.items():
        assert main(_train_argv(algo, out, 4, "--per-agent")) == 0
    text = capsys.readouterr().out
    assert "[2/2] seed 1: 4 rounds" in text and "final return (mean ± s.e.)" in text

    # --- the files of each run -------------------------------------------------------------------
    for algo, out in runs.items():
        config = json.loads((out / "config.json").read_text())
        assert config["settings"]["algo"] == algo and config["settings"]["env"] == ENV_ID and config["settings"]["seeds"] == [0, 1]
        assert config["settings"]["env_modules"] == [MODULE] and config["n_agents"] == 2
        assert {"fedrl", "torch", "stable_baselines3", "gymnasium"} <= set(config["versions"])
        for seed in (0, 1):
            seed_dir = out / f"seed_{seed}"
            assert sorted(p.name for p in (seed_dir / "checkpoints").glob("*.zip")) == [
                f"model_{2 * config['timesteps_per_round']}_steps.zip", f"model_{4 * config['timesteps_per_round']}_steps.zip"]
            assert (seed_dir / "model.zip").is_file()
            rows = _rows(seed_dir / "progress.csv")
            assert _rounds(seed_dir / "progress.csv") == [0, 1, 2, 3, 4]  # round 0: the untrained policy
            assert [int(r["time/total_timesteps"]) for r in rows] == [k * config["timesteps_per_round"] for k in range(5)]
            # the common evaluation's columns (and the adapted ones of FedAvg-PG), per agent too
            evals = ["eval/return", "eval/discounted_return", "eval/agent_1/return"]
            evals += [] if algo == "mfpo" else ["eval/adapted_return", "eval/agent_0/adapted_return"]
            for key in evals:
                assert all(r[key] != "" for r in rows), key
        assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        summary = _rows(out / "summary.csv")
        assert summary and summary[0]["agent"] == "mean" and summary[0]["seeds"] == "2" and summary[0]["rounds"] == "4"
        assert float(summary[0]["final_se"]) >= 0 and summary[0]["env_steps"] == str(4 * config["timesteps_per_round"])
        assert "final return (mean ± s.e.)" in (out / "summary.md").read_text()

    # --- rerunning resumes: a killed seed from its newest checkpoint, a finished seed not at all -----
    mfpo = runs["mfpo"]
    uninterrupted = _theta(mfpo / "seed_0" / "model.zip", "mfpo")
    finished_log = (mfpo / "seed_1" / "progress.csv").read_bytes()
    per_round = json.loads((mfpo / "config.json").read_text())["timesteps_per_round"]
    # seed 0 "killed" after its round-2 checkpoint, having logged rounds 3 and 4 already
    for name in ("model.zip", "state.json", f"checkpoints/model_{4 * per_round}_steps.zip", f"checkpoints/model_{4 * per_round}_steps.json"):
        (mfpo / "seed_0" / name).unlink()
    assert main(_train_argv("mfpo", mfpo, 4)) == 0
    text = capsys.readouterr().out
    assert f"seed 0: resuming from checkpoints/model_{2 * per_round}_steps.zip (round 2" in text
    assert "seed 1: done (4 rounds" in text
    assert _rounds(mfpo / "seed_0" / "progress.csv") == [0, 1, 2, 3, 4]  # rounds 3 and 4 logged once
    assert torch.equal(_theta(mfpo / "seed_0" / "model.zip", "mfpo"), uninterrupted)  # bitwise the uninterrupted run
    assert (mfpo / "seed_1" / "progress.csv").read_bytes() == finished_log  # nothing redone
    # a larger budget trains on from the final model
    assert main(_train_argv("mfpo", mfpo, 5)) == 0
    assert "seed 1: resuming from model.zip (round 4" in capsys.readouterr().out
    assert _rounds(mfpo / "seed_1" / "progress.csv") == [0, 1, 2, 3, 4, 5]

    # --- fedrl plot overlays the two runs -----------------------------------------------------------
    import fedrl_algos.reproduce.plots.curves as curves_module

    drawn = []
    original = curves_module.learning_curves_figure

    def spy(curves, *args, **kwargs):
        drawn.append(list(curves))
        return original(curves, *args, **kwargs)

    monkeypatch.setattr(curves_module, "learning_curves_figure", spy)
    figure = tmp_path / "comparison.png"
    assert main(["plot", str(runs["mfpo"]), str(runs["fedavg_pg"]), "--out", str(figure)]) == 0
    text = capsys.readouterr().out
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [c.label for c in drawn[0]]
    assert any(label.startswith("mfpo: eval/return") for label in labels)
    assert any(label.startswith("fedavg_pg: eval/return") and "γ-discounted" not in label for label in labels)
    assert len({c.color for c in drawn[0]}) == 2  # one colour per run, in one figure
    assert "| mfpo | mfpo | eval/return | mean |" in text and "| fedavg_pg | fedavg_pg |" in text
    assert main(["plot", str(runs["mfpo"]), "--x", "rounds"]) == 0  # one run: redrawn in place
    assert (runs["mfpo"] / "learning_curve.png").is_file()


def test_config_file_with_flags_overriding_it(env_module, tmp_path, capsys):
    pytest.importorskip("yaml")  # YAML config files need PyYAML (not a dependency of fedrl; TOML and JSON need nothing)
    (tmp_path / "agents.yaml").write_text("- {target: 0.3}\n- {target: 0.5}\n")
    (tmp_path / "run.yaml").write_text(textwrap.dedent(f"""\
        algo: independent_pg
        env: {ENV_ID}
        env-module: {MODULE}
        agent_kwargs: agents.yaml      # relative to this file
        algo_kwargs: {{n_trajectories: 4}}
        seeds: 2
        budget: 2e2                     # environment steps summed over agents
        eval_trajectories: 4
        checkpoint_every: 0
        device: cpu
        progress: false
        out: {tmp_path / 'yaml_run'}
        """))
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--seed", "7"]) == 0
    out = tmp_path / "yaml_run"
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["seeds"] == [7, 8] and config["settings"]["agent_kwargs"] == AGENTS
    per_round = config["timesteps_per_round"]  # 2 agents x 4 trajectories x 10 steps
    assert per_round == 80 and config["target_rounds"] == 3  # 200 steps: rounded up to whole rounds
    assert _rounds(out / "seed_8" / "progress.csv") == [0, 1, 2, 3]
    assert not (out / "seed_7" / "checkpoints").exists() and (out / "seed_7" / "model.zip").is_file()
    capsys.readouterr()


def test_train_runs_from_python_and_fedavg_sb3(env_module, tmp_path):
    from fedrl_algos.zoo import plot_runs, train_runs

    result = train_runs({"algo": "fedavg_sb3", "env": ENV_ID, "env_module": MODULE, "n_agents": 2,
                         "algo_kwargs": {"algorithm_class": "PPO", "algorithm_kwargs": {"n_steps": 16, "batch_size": 16, "n_epochs": 1}},
                         "rounds": 2, "eval_trajectories": 2, "device": "cpu", "progress": False, "out": str(tmp_path / "sb3")},
                        print_fn=None)
    assert [o.how for o in result.seeds] == ["trained"] and result.seeds[0].rounds_done == 2
    rows = _rows(tmp_path / "sb3" / "seed_0" / "progress.csv")
    assert [r["train/round"] for r in rows] == ["0", "1", "2"] and all(r["eval/agent_1/return"] != "" for r in rows)
    plotted = plot_runs([tmp_path / "sb3"], per_agent=True)
    assert plotted.figure == tmp_path / "sb3" / "learning_curve.png"
    assert [r["agent"] for r in plotted.rows] == ["mean", "0", "1"]


@pytest.mark.parametrize(
    "change, flag, message",
    [
        ({"--algo": "nope"}, "--algo", "invalid choice"),
        ({"--env": "NoSuchEnv-v0", "--env-module": None}, "--env", "--env-module"),
        ({"--env": "no_such_module:X-v0", "--env-module": None}, "--env", "no_such_module"),
        ({"--env-module": "no_such_module"}, "--env-module", "cannot be imported"),
        ({"--agent-kwargs": "missing.json"}, "--agent-kwargs", "does not exist"),
        ({"--agent-kwargs": '{"target": 0.3}'}, "--agent-kwargs", "one dict of gym.make arguments per agent"),
        ({"--agent-kwargs": "[1, 2]"}, "--agent-kwargs", "entry 0 must be a dict"),
        ({"--agent-kwargs": None}, "--agent-kwargs", "--n-agents"),
        ({"--rounds": None, "--budget": "10"}, "--budget", "less than one round"),
        ({"--rounds": None, "--budget": "1.5"}, "--budget", "whole number"),
        ({"--rounds": None}, "--budget", "exactly one of"),
        ({"--algo-kwargs": '{"lr": 0.1}'}, "--algo-kwargs", "takes no argument 'lr'"),
        ({"--algo-kwargs": '{"seed": 3}'}, "--algo-kwargs", "--seed"),
        ({"--algo-kwargs": '{"local_steps": 0}'}, "--algo-kwargs", "local_steps"),
        ({"--policy": "Foo"}, "--policy", "MlpPolicy"),
        ({"--seed-list": "1,2", "--seeds": "2"}, "--seed-list", "without --seeds"),
        ({"--seed-list": "1,1"}, "--seed-list", "must differ"),
        ({"--algo": "fedavg_sb3"}, "--algo-kwargs", "algorithm_class"),
        ({"--config": "missing.yaml"}, "--config", "does not exist"),
    ],
    ids=lambda v: "" if isinstance(v, dict) else v,
)
def test_bad_input_is_refused_before_any_work(env_module, tmp_path, capsys, monkeypatch, change, flag, message):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    options = {"--algo": "mfpo", "--env": ENV_ID, "--env-module": MODULE, "--agent-kwargs": json.dumps(AGENTS),
               "--algo-kwargs": json.dumps(ALGOS["mfpo"]), "--rounds": "2", "--device": "cpu", "--out": str(out), **change}
    argv = ["train", "--no-progress"] + [x for k, v in options.items() if v is not None for x in (k, v)]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "fedrl train: error: " in err and flag in err and message in err, err
    assert not out.exists()  # nothing written, nothing trained


def test_a_run_directory_of_other_settings_is_refused(env_module, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train_argv("mfpo", out, 1)) == 0
    argv = _train_argv("mfpo", out, 1)
    argv[argv.index("--algo-kwargs") + 1] = json.dumps({"local_steps": 3, "n_trajectories": 4})
    with pytest.raises(SystemExit):
        main(argv)
    assert "holds a run of other settings (algo_kwargs" in capsys.readouterr().err
    shutil.rmtree(out / "seed_0")
    (out / "config.json").unlink()
    (out / "stray.txt").write_text("not a run")
    with pytest.raises(SystemExit):
        main(_train_argv("mfpo", out, 1))
    assert "not a fedrl train run directory" in capsys.readouterr().err


def test_plot_refuses_what_it_cannot_draw(env_module, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["plot", str(tmp_path)])
    assert "not a fedrl train run directory" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(_train_argv("mfpo", out, 1)) == 0
    with pytest.raises(SystemExit):
        main(["plot", str(out), "--key", "eval/nope"])
    assert "the eval/ columns logged: ['eval/agent_0/discounted_return'," in capsys.readouterr().err


def test_a_toml_config_file_resolves_to_the_same_settings(env_module, tmp_path):
    from fedrl_algos.zoo import load_config_file, merge_settings, resolve_config

    (tmp_path / "run.toml").write_text(textwrap.dedent(f"""\
        [train]
        algo = "mfpo"
        env = "{MODULE}:{ENV_ID}"
        agent-kwargs = '[{{"target": 0.3}}, {{"target": 0.5}}]'
        seed_list = [3, 5]
        budget = 2e5
        out = "runs/mfpo"
        [train.algo_kwargs]
        local_steps = 2
        """))
    config = resolve_config(merge_settings(load_config_file(tmp_path / "run.toml"), {"device": "cpu", "rounds": 3}))
    assert config.env == ENV_ID and config.env_modules == (MODULE,)  # "module:EnvId": the module is imported on resume too
    assert config.agent_kwargs == AGENTS and config.seeds == (3, 5) and config.algo_kwargs == {"local_steps": 2}
    assert config.rounds == 3 and config.budget is None  # --rounds on the command line replaces the file's budget
    (tmp_path / "bad.toml").write_text('algo = "mfpo"\nlearning_rate = 1\n')
    with pytest.raises(ValueError, match=r"--config: .*unknown setting\(s\) \['learning_rate'\]"):
        load_config_file(tmp_path / "bad.toml")


def test_runs_logged_with_the_older_evaluation_names_plot_marked_discounted(env_module, tmp_path, capsys):
    """A run directory whose progress.csv has the evaluation names from before the common protocol
    (``eval/pre_adaptation_return``): its column stands in for ``eval/return``, marked γ-discounted."""
    out = tmp_path / "old"
    assert main(_train_argv("mfpo", out, 1)) == 0
    for progress in out.glob("seed_*/progress.csv"):
        header, *rest = progress.read_text().splitlines()
        columns = header.split(",")
        columns[columns.index("eval/return")] = "eval/pre_adaptation_return"
        progress.write_text("\n".join([",".join(columns), *rest]) + "\n")
    capsys.readouterr()
    assert main(["plot", str(out), "--out", str(tmp_path / "old.png")]) == 0
    text = capsys.readouterr().out
    assert "eval/pre_adaptation_return" in text and "γ-discounted" in text
