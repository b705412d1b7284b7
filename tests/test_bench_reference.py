"""``fedrl bench reference``: fedrl's side, the checks of the reference directories, the old-gym shim.

The reference implementations are not part of fedrl; the test that runs one needs its checkout in
``FEDRL_MFPO_DIR`` / ``FEDRL_FEDPGBR_DIR`` and is skipped otherwise.
"""

from __future__ import annotations

import os

import gymnasium
import numpy as np
import pytest

from fedrl_algos.bench import _reference_runner
from fedrl_algos.bench.reference import CONFIGS, bench_reference, fedrl_rate, reference_code_dir, reference_rate
from fedrl_algos.cli import main


def test_fedrl_side_counts_the_steps_inside_episodes_of_one_mfpo_round():
    first = fedrl_rate("mfpo-cartpole", rounds=1, seed=0)
    trajectories = 10 * 10 * 20  # agents x local steps x trajectories per step
    # Every CartPole episode lasts between a handful of steps and the 500-step horizon; the
    # horizon accounting of ``num_timesteps`` would give exactly 500 per trajectory.
    assert 8 * trajectories <= first["env_steps"] < 100 * trajectories
    assert first["rounds"] == 1
    assert first["steps_per_s"] == pytest.approx(first["env_steps"] / first["seconds"])
    assert first["rounds_per_s"] == pytest.approx(1 / first["seconds"])
    assert fedrl_rate("mfpo-cartpole", rounds=1, seed=0)["env_steps"] == first["env_steps"]  # same seed, same count


def test_fedrl_side_of_fedpg_br_includes_the_servers_steps():
    result = fedrl_rate("fedpg_br-cartpole", rounds=1, seed=0)
    # at least B_min = 14 episodes per agent, plus the server's inner loop
    assert result["env_steps"] >= 8 * 14 * 10


def _fake_checkout(root, config):
    cfg = CONFIGS[config]
    code = root / cfg.code_subdir
    for name in cfg.marker_files:
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text("")
    return code


@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_checkout_or_its_code_directory_is_accepted(tmp_path, config):
    code = _fake_checkout(tmp_path, config)
    assert reference_code_dir(config, tmp_path, "d") == code.resolve()
    assert reference_code_dir(config, code, "d") == code.resolve()


def test_missing_or_wrong_directories_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="mfpo_dir is required for mfpo-cartpole.*HansenHua/MFPO-INFOCOM24"):
        bench_reference(fedpgbr_dir=tmp_path, show=False)
    with pytest.raises(ValueError, match="fedpgbr_dir is required.*Byzantine-Federated-RL"):
        bench_reference(configs=["fedpg_br-cartpole"], show=False)
    with pytest.raises(ValueError, match="fedpgbr_dir must be .* is not a directory"):
        bench_reference(fedpgbr_dir=tmp_path / "absent", configs=["fedpg_br-cartpole"], show=False)
    # an MFPO checkout is not a FedPG-BR checkout
    _fake_checkout(tmp_path, "mfpo-cartpole")
    with pytest.raises(ValueError, match="fedpgbr_dir must be .* does not hold codes/run.py"):
        bench_reference(fedpgbr_dir=tmp_path, configs=["fedpg_br-cartpole"], show=False)


@pytest.mark.parametrize("kwargs, match", [({"configs": ["ppo-cartpole"]}, "configs"), ({"repeats": 0}, "repeats"), ({"rounds": 0}, "rounds")])
def test_bad_counts_and_configs_name_themselves(tmp_path, kwargs, match):
    _fake_checkout(tmp_path, "mfpo-cartpole")
    _fake_checkout(tmp_path, "fedpg_br-cartpole")
    with pytest.raises(ValueError, match=match):
        bench_reference(tmp_path, tmp_path, show=False, **kwargs)


def test_the_command_reports_a_missing_directory(capsys):
    assert main(["bench", "reference", "--configs", "fedpg_br-cartpole"]) == 2
    assert "--fedpgbr-dir is required for fedpg_br-cartpole" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "reference", "--help"])
    assert "--mfpo-dir" in capsys.readouterr().out


def test_old_gym_shim_matches_gymnasium_and_counts_steps():
    shim = _reference_runner._OldGymEnv(gymnasium.make("CartPole-v1"))
    plain = gymnasium.make("CartPole-v1")
    shim.seed(3)
    obs, _ = plain.reset(seed=3)
    np.testing.assert_array_equal(shim.reset(), obs)
    before = _reference_runner._STEPS[0]
    done, n = False, 0
    while not done:
        obs, reward, done, _ = shim.step(1)
        p_obs, p_reward, terminated, truncated, _ = plain.step(1)
        n += 1
        np.testing.assert_array_equal(obs, p_obs)
        assert reward == p_reward and done == (terminated or truncated)
    assert _reference_runner._STEPS[0] - before == n
    # the seed applies to one reset only, as gym's env.seed did
    assert not np.array_equal(shim.reset(), shim.reset())


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FEDRL_FEDPGBR_DIR"), reason="needs a checkout of flint-xf-fan/Byzantine-Federated-RL in FEDRL_FEDPGBR_DIR")
def test_the_fedpg_br_reference_runs_and_counts_its_steps():
    code = reference_code_dir("fedpg_br-cartpole", os.environ["FEDRL_FEDPGBR_DIR"], "FEDRL_FEDPGBR_DIR")
    result = reference_rate("fedpg_br-cartpole", code, rounds=1, timeout=300)
    assert result["rounds"] == 1 and result["env_steps"] >= 8 * 14 * 10


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FEDRL_MFPO_DIR"), reason="needs a checkout of HansenHua/MFPO-INFOCOM24 in FEDRL_MFPO_DIR")
def test_the_mfpo_reference_runs_and_counts_its_steps():
    code = reference_code_dir("mfpo-cartpole", os.environ["FEDRL_MFPO_DIR"], "FEDRL_MFPO_DIR")
    result = reference_rate("mfpo-cartpole", code, rounds=1, timeout=600)
    assert result["rounds"] == 1 and 8 * 2000 <= result["env_steps"] < 100 * 2000
