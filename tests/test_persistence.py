"""Model files hold data only, load without running code, and are written atomically.

* every algorithm's file round-trips (parameters, state tensors, random streams, attributes) and
  its ``data`` member holds no pickled object;
* a pickle payload that would create a file if it ran — in ``data`` (SB3's cloudpickle entries)
  or in a tensor member — is refused with a ``ValueError`` naming the file, and the file it would
  create does not appear;
* truncated and corrupt files, and files of another algorithm class, give a ``ValueError`` naming
  the file and the problem;
* a save that fails, or a process killed in the middle of one, leaves the previous file intact.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from stable_baselines3 import DQN, PPO
from torch import nn

from fedrl_algos import MFPO, FedAvgPG, FedAvgSB3, FedPGBR, IndependentPG, PerFedAvgPG
from fedrl_algos.common.model_file import DATA_TENSORS, MARKER, atomic_write, class_path, read_model_file
from fedrl_algos.policies import FastMlpPolicy, MlpPolicy

GRID = "fedrl/GridWorld-v0"
ROOT = Path(__file__).resolve().parent.parent


def _models():
    return {
        "per_fedavg_pg": PerFedAvgPG("TabularPolicy", GRID, m_in=2, m_h=2, m_out=2, local_steps=1, seed=3, device="cpu"),
        "fedavg_pg": FedAvgPG("TabularPolicy", GRID, n_trajectories=4, local_steps=1, seed=3, device="cpu"),
        "independent_pg": IndependentPG("TabularPolicy", GRID, n_trajectories=4, local_steps=1, seed=3, device="cpu"),
        "mfpo": MFPO("TabularPolicy", GRID, step_size=0.5, local_steps=2, n_trajectories=4, seed=3, device="cpu"),
        "fedpg_br": FedPGBR("TabularPolicy", GRID, step_size=0.5, batch_range=(4, 6), inner_batch_size=2, attack="sign_flip",
                            byzantine_agents=[0], server_optimizer="adam", normalize_observations=False, seed=3, device="cpu"),
    }


class _CreatesFile:
    """Unpickling this creates ``path`` (what a malicious payload would do, harmlessly)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _rewrite(src: Path, dst: Path, change) -> None:
    """Copy a model zip, passing each member's bytes through ``change(name, blob)`` (``None`` drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            blob = change(name, zin.read(name))
            if blob is not None:
                zout.writestr(name, blob)


@pytest.mark.parametrize("name", ["per_fedavg_pg", "fedavg_pg", "independent_pg", "mfpo", "fedpg_br"])
def test_files_hold_data_only_and_round_trip(tmp_path, name):
    model = _models()[name].learn(total_rounds=2)
    model.save(tmp_path / "m")  # no suffix: ".zip" appended, as SB3
    path = tmp_path / "m.zip"
    assert sorted(os.listdir(tmp_path)) == ["m.zip"]  # no temporary file left behind
    with zipfile.ZipFile(path) as archive:
        assert ":serialized:" not in archive.read("data").decode()
        assert json.loads(archive.read(MARKER))["class"].endswith(":" + type(model).__name__)
        assert DATA_TENSORS in archive.namelist()
    loaded = type(model).load(path, device="cpu")
    assert torch.equal(loaded.policy.theta, model.policy.theta)
    assert type(loaded.policy) is type(model.policy) and loaded.policy_kwargs == model.policy_kwargs
    assert loaded.observation_space == model.observation_space and loaded.action_space == model.action_space
    assert loaded.family is model.family and loaded.env_id == model.env_id
    assert torch.equal(loaded.agent_params.goal, model.agent_params.goal) and loaded.agent_params.size == model.agent_params.size
    for key, value in model.federation.state_dict().items():
        for part, tensor in value.items():
            assert torch.equal(loaded.federation.state_dict()[key][part], tensor)
    for attribute in ("num_timesteps", "rounds_done", "trajectories_per_agent", "seed", "gamma", "_n_updates"):
        assert getattr(loaded, attribute) == getattr(model, attribute)
    if name == "mfpo":
        assert torch.equal(loaded.agent_direction, model.agent_direction) and torch.equal(loaded.agent_theta_prev, model.agent_theta_prev)
        assert loaded.step_size == model.step_size and loaded.momentum == model.momentum and loaded.local_step == model.local_step
    if name == "fedpg_br":
        assert loaded.attack.scale == model.attack.scale and type(loaded.attack) is type(model.attack)
        assert loaded.batch_range == (4, 6) and loaded.filter_history == model.filter_history
        for a, b in zip(loaded.optimizer_state, model.optimizer_state, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(loaded.noise_streams.counters, model.noise_streams.counters)
    if name == "independent_pg":
        assert torch.equal(loaded.agent_theta, model.agent_theta)


def test_mlp_policy_with_a_torch_activation_and_spaces_round_trip(tmp_path):
    model = MFPO("MlpPolicy", "fedrl/CartPole-v0", step_size=1e-3, local_steps=1, n_trajectories=2, horizon=9,
                 policy_kwargs={"net_arch": (4,), "activation_fn": nn.ELU}, seed=0, device="cpu")
    model.save(tmp_path / "mlp.zip")
    loaded = MFPO.load(tmp_path / "mlp.zip", device="cpu")
    assert loaded.policy_kwargs == {"net_arch": (4,), "activation_fn": nn.ELU}
    assert loaded.observation_space == model.observation_space  # a Box, low/high as tensors
    obs = torch.zeros(3, 4)
    assert torch.equal(torch.as_tensor(loaded.predict(obs, deterministic=True)[0]), torch.as_tensor(model.predict(obs, deterministic=True)[0]))


def test_mlp_policy_classes_keep_the_class_path_of_files_saved_before_they_moved(tmp_path):
    # MlpPolicy and FastMlpPolicy live in fedrl_algos/policies/mlp/policy.py but are named, in files and
    # pickles, by the package they are imported from, as before the module became a package
    assert {class_path(MlpPolicy), class_path(FastMlpPolicy)} == {
        "fedrl_algos.policies.mlp:MlpPolicy", "fedrl_algos.policies.mlp:FastMlpPolicy"}
    model = MFPO(FastMlpPolicy, "fedrl/CartPole-v0", step_size=1e-3, local_steps=1, n_trajectories=2, horizon=9,
                 policy_kwargs={"net_arch": (4,), "kernels": "auto"}, seed=0, device="cpu")
    model.save(tmp_path / "fast.zip")
    with zipfile.ZipFile(tmp_path / "fast.zip") as archive:
        assert json.loads(archive.read("data"))["policy_class"] == {":policy_class:": "fedrl_algos.policies.mlp:FastMlpPolicy"}
    loaded = MFPO.load(tmp_path / "fast.zip", device="cpu")
    assert type(loaded.policy) is FastMlpPolicy and loaded.policy.kernels == "auto"
    assert torch.equal(loaded.policy.theta, model.policy.theta)
    assert type(pickle.loads(pickle.dumps(loaded.policy))) is FastMlpPolicy


def test_a_callable_saved_by_name_must_be_given_back(tmp_path):
    def step_size(t):
        return 0.5

    model = MFPO("TabularPolicy", GRID, step_size=step_size, local_steps=1, n_trajectories=2, seed=0, device="cpu")
    with pytest.warns(UserWarning, match=r"\['step_size'\] are callables saved by name only"):
        model.save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match=r"m\.zip: step_size: was saved as a reference .*custom_objects"):
        MFPO.load(tmp_path / "m.zip")
    assert MFPO.load(tmp_path / "m.zip", custom_objects={"step_size": step_size}).step_size is step_size


def test_a_value_that_is_not_data_is_refused_at_save(tmp_path):
    model = _models()["fedavg_pg"]
    model.something = object()
    with pytest.raises(TypeError, match="something: a object cannot be saved as data"):
        model.save(tmp_path / "m.zip")
    assert os.listdir(tmp_path) == []  # nothing at the path, no temporary file either


def test_pickle_payload_in_data_is_refused_and_never_runs(tmp_path):
    model = _models()["fedavg_pg"]
    model.save(tmp_path / "good.zip")
    victim = tmp_path / "created_by_payload"
    payload = {":serialized:": base64.b64encode(pickle.dumps(_CreatesFile(victim))).decode()}

    def inject(name, blob):
        if name != "data":
            return blob
        data = json.loads(blob)
        data["gamma"] = payload
        return json.dumps(data).encode()

    _rewrite(tmp_path / "good.zip", tmp_path / "evil.zip", inject)
    with pytest.raises(ValueError, match=r"evil\.zip: .*\['gamma'\].*pickled"):
        FedAvgPG.load(tmp_path / "evil.zip")
    assert not victim.exists()
    # The same payload in a file without fedrl's marker (SB3's pickle-based format): refused too.
    _rewrite(tmp_path / "evil.zip", tmp_path / "evil_sb3.zip", lambda name, blob: None if name == MARKER else blob)
    with pytest.raises(ValueError, match=r"evil_sb3\.zip: .*pickle-based format.*allow_pickle=True"):
        FedAvgPG.load(tmp_path / "evil_sb3.zip")
    assert not victim.exists()
    # Nested deeper in a plain dict: found as well.
    _rewrite(tmp_path / "good.zip", tmp_path / "nested.zip",
             lambda name, blob: json.dumps({**json.loads(blob), "policy_kwargs": {"x": [payload]}}).encode() if name == "data" else blob)
    with pytest.raises(ValueError, match=r"nested\.zip: .*policy_kwargs.*pickled"):
        FedAvgPG.load(tmp_path / "nested.zip")
    assert not victim.exists()


def test_pickle_payload_in_a_tensor_member_is_refused_and_never_runs(tmp_path):
    model = _models()["fedavg_pg"]
    model.save(tmp_path / "good.zip")
    victim = tmp_path / "created_by_payload"
    for member in ("policy.pth", DATA_TENSORS):
        buf = io.BytesIO()
        torch.save({"theta": _CreatesFile(victim)}, buf)
        evil = buf.getvalue()
        _rewrite(tmp_path / "good.zip", tmp_path / "evil.zip", lambda name, blob, m=member, e=evil: e if name == m else blob)
        with pytest.raises(ValueError, match=rf"evil\.zip: member {member} holds objects other than tensors"):
            FedAvgPG.load(tmp_path / "evil.zip")
        assert not victim.exists()


def test_truncated_corrupt_and_foreign_files_name_the_file_and_the_problem(tmp_path):
    models = _models()
    models["mfpo"].save(tmp_path / "mfpo.zip")
    blob = (tmp_path / "mfpo.zip").read_bytes()
    for size in (len(blob) // 2, len(blob) - 10, 100):
        (tmp_path / "truncated.zip").write_bytes(blob[:size])
        with pytest.raises(ValueError, match=r"truncated\.zip: (not a readable model file \(truncated or corrupt zip|no 'data' member: a truncated)"):
            MFPO.load(tmp_path / "truncated.zip")
    (tmp_path / "empty.zip").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.zip: not a readable model file"):
        MFPO.load(tmp_path / "empty.zip")
    # Flip bytes inside the compressed/stored tensor data: the zip's CRC catches it.
    with zipfile.ZipFile(tmp_path / "mfpo.zip") as archive:
        info = archive.getinfo("policy.pth")
    corrupt = bytearray(blob)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 64
    corrupt[start:start + 16] = bytes(b ^ 0xFF for b in corrupt[start:start + 16])
    (tmp_path / "corrupt.zip").write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match=r"corrupt\.zip: member policy\.pth is corrupt or truncated"):
        MFPO.load(tmp_path / "corrupt.zip")
    _rewrite(tmp_path / "mfpo.zip", tmp_path / "bad_json.zip", lambda name, b: b[:-5] if name == "data" else b)
    with pytest.raises(ValueError, match=r"bad_json\.zip: member data is not valid JSON"):
        MFPO.load(tmp_path / "bad_json.zip")
    with pytest.raises(ValueError, match=r"mfpo\.zip: saved by MFPO .*not by FedPGBR; load it with MFPO\.load"):
        FedPGBR.load(tmp_path / "mfpo.zip")
    (tmp_path / "other.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    with pytest.raises(ValueError, match=r"other\.zip: no 'data' member"):
        MFPO.load(tmp_path / "other.zip")
    with pytest.raises(FileNotFoundError, match="missing"):
        MFPO.load(tmp_path / "missing")


def test_a_failed_save_leaves_the_previous_file(tmp_path, monkeypatch):
    model = _models()["fedavg_pg"]
    model.save(tmp_path / "m.zip")
    before = (tmp_path / "m.zip").read_bytes()
    model.learn(total_rounds=1)

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "m.zip")
    assert (tmp_path / "m.zip").read_bytes() == before and os.listdir(tmp_path) == ["m.zip"]


def test_atomic_write_keeps_the_file_mode_of_a_plain_open(tmp_path):
    atomic_write(tmp_path / "a.bin", lambda f: f.write(b"x"))
    with open(tmp_path / "b.bin", "wb") as f:
        f.write(b"x")
    assert os.stat(tmp_path / "a.bin").st_mode == os.stat(tmp_path / "b.bin").st_mode


_KILLED_MID_SAVE = textwrap.dedent(
    """
    import os, signal, sys, torch
    from fedrl_algos import FedAvgPG
    path = sys.argv[1]
    model = FedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", n_trajectories=4, local_steps=1, seed=3, device="cpu")
    model.save(path)
    model.learn(total_rounds=1)
    real_save = torch.save
    def save_then_die(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # part of the new zip is written ...
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # ... when the process is killed
    torch.save = save_then_die
    model.save(path)
    """
)


def test_a_process_killed_while_saving_leaves_the_previous_file(tmp_path):
    path = tmp_path / "m.zip"
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_SAVE, str(path)], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    loaded = FedAvgPG.load(path, device="cpu")  # the first, complete file
    fresh = _models()["fedavg_pg"]
    assert torch.equal(loaded.policy.theta, fresh.policy.theta) and loaded.rounds_done == 0
    leftovers = [p for p in os.listdir(tmp_path) if p != "m.zip"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".m.zip.") and leftovers[0].endswith(".tmp")
    (tmp_path / leftovers[0]).unlink()


def test_fedavg_sb3_files_hold_no_pickles_and_refuse_them(tmp_path):
    fed = FedAvgSB3(DQN, "fedrl/CartPole-v0", n_agents=2, sync_every=40, seed=0, device="cpu",
                    algorithm_kwargs={"policy_kwargs": {"net_arch": [8], "activation_fn": nn.ReLU}, "learning_starts": 30,
                                      "buffer_size": 200, "train_freq": 4})
    fed.save(tmp_path / "fed.zip")
    with zipfile.ZipFile(tmp_path / "fed.zip") as outer:
        config = json.loads(outer.read("fedavg_sb3.json"))
        assert config["format_version"] == 2 and config["algorithm_kwargs"]["policy_kwargs"]["activation_fn"] == {":torch_module:": "ReLU"}
        for i in range(2):
            with zipfile.ZipFile(io.BytesIO(outer.read(f"agent_{i}.zip"))) as agent:
                assert ":serialized:" not in agent.read("data").decode()
    loaded = FedAvgSB3.load(tmp_path / "fed.zip", device="cpu")
    assert loaded.agents[0].policy_kwargs["activation_fn"] is nn.ReLU
    victim = tmp_path / "created_by_payload"
    payload = {":serialized:": base64.b64encode(pickle.dumps(_CreatesFile(victim))).decode()}

    def inject_agent(name, blob):
        if name != "agent_1.zip":
            return blob
        inner = io.BytesIO()
        _rewrite(io.BytesIO(blob), inner, lambda n, b: json.dumps({**json.loads(b), "exploration_rate": payload}).encode() if n == "data" else b)
        return inner.getvalue()

    _rewrite(tmp_path / "fed.zip", tmp_path / "evil.zip", inject_agent)
    with pytest.raises(ValueError, match=r"evil\.zip: agent_1\.zip: attributes \['exploration_rate'\] hold pickled"):
        FedAvgSB3.load(tmp_path / "evil.zip")
    assert not victim.exists()
    blob = (tmp_path / "fed.zip").read_bytes()
    (tmp_path / "cut.zip").write_bytes(blob[: len(blob) // 3])
    with pytest.raises(ValueError, match=r"cut\.zip: "):
        FedAvgSB3.load(tmp_path / "cut.zip")
    with pytest.raises(ValueError, match=r"format-1 FedAvgSB3 file.*allow_pickle=True"):
        FedAvgSB3.load(ROOT / "tests" / "data" / "fedavg_sb3_format1_halfcheetah.zip")
    with zipfile.ZipFile(tmp_path / "fed.zip") as outer, pytest.raises(ValueError, match=r"saved by DQN .*not by PPO"):
        read_model_file(io.BytesIO(outer.read("agent_0.zip")), PPO)
