"""``fedrl bench mujoco``: fedrl's MuJoCo federations' training throughput against SB3's PPO."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mujoco", reason="the MuJoCo extra: pip install 'fedrl[mujoco]'")

from fedrl_algos.bench.mujoco import METHODS, _model, bench_mujoco  # noqa: E402
from fedrl_algos.cli import main  # noqa: E402


def test_records_count_the_steps_inside_episodes_and_time_ppo_on_one_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3"))  # where SB3's default logger would make its folder
    records = bench_mujoco("Hopper-v5", methods=("FedAvg-PG", "FedPG-BR"), n_agents=2, trajectories=2, local_steps=1, ppo_timesteps=128,
                           show=False)
    assert [r.method for r in records] == ["FedAvg-PG", "FedPG-BR"]
    for r in records:
        # Hoppers fall long before the 1000-step limit: every trajectory counts only its own steps
        assert 0 < r.env_steps < 2 * 2 * 1000 * (1 if r.method == "FedAvg-PG" else 20)
        assert r.training_steps_per_s == pytest.approx(r.env_steps / r.seconds)
        assert r.ppo_timesteps == 128 and r.ratio == pytest.approx(r.training_steps_per_s / r.ppo_steps_per_s)
    assert not (tmp_path / "sb3").exists()  # nothing left in the temp directory


def test_the_federations_are_the_mujoco_rows_policy_on_heterogeneous_bodies():
    model = _model("MFPO", "Hopper-v5", 3, 2, 1, 0, "cpu")
    assert model.n_agents == 3 and model.policy.sizes[1:-1] == [256, 256] and model.policy.squash == "tanh"
    assert model.policy.init_gains is not None and model.policy.activation_name == "relu"
    scales = [kw["wrappers"][0].mass_scale for kw in model.agent_kwargs]
    assert scales == [0.75, 1.0, 1.25]


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match=r"methods must be among \['MFPO', 'FedAvg-PG', 'FedPG-BR'\], got 'PPO'"):
        bench_mujoco("Hopper-v5", methods=("PPO",), show=False)
    with pytest.raises(ValueError, match="trajectories must be"):
        bench_mujoco("Hopper-v5", trajectories=1, show=False)
    assert METHODS == ("MFPO", "FedAvg-PG", "FedPG-BR")


def test_the_command_writes_json(tmp_path, capsys):
    path = tmp_path / "mujoco.json"
    assert main(["bench", "mujoco", "--env", "Hopper-v5", "--methods", "FedAvg-PG", "--quick", "--threads", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "PPO steps/s" in out and "FedAvg-PG" in out
    (record,) = json.loads(path.read_text())
    assert record["method"] == "FedAvg-PG" and record["ratio"] > 0 and record["ppo_timesteps"] == 256


def test_the_command_refuses_a_single_trajectory(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "mujoco", "--trajectories", "1"])
    assert "--trajectories" in capsys.readouterr().err
