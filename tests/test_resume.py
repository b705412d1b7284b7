"""Kill and resume: a run SIGKILLed mid-``learn`` continues from its last checkpoint bitwise.

A child process trains with SB3's ``CheckpointCallback`` (a save every round) and is SIGKILLed
while it is still training, right after it reported a checkpoint. The newest checkpoint is then
loaded and trained on with ``learn(..., reset_num_timesteps=False)``; the result must equal,
bitwise, an uninterrupted run of as many rounds: parameters, per-agent state (MFPO's momentum
directions and previous parameters, IndependentPG's agents), the server's Adam state (FedPG-BR),
every random stream, and the counters. Every checkpoint the killed process left must load (saves
are atomic). Both processes use one torch thread, so that their float sums agree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
GRID = "fedrl/GridWorld-v0"


class NoisyWalk(gym.Env):
    """An env registered only by this module (and the child that imports it): a walk whose start and
    every step draw from ``np_random``, so that a resume that loses the generators differs at once."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, drift: float = 0.0) -> None:
        self.drift = drift
        self.position = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.drift], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = float(self.np_random.uniform(-1.0, 1.0))
        return self._obs(), {}

    def step(self, action):
        self.position += 0.1 * float(np.clip(action[0], -1, 1)) + self.drift + 0.05 * float(self.np_random.normal())
        return self._obs(), -self.position**2, abs(self.position) > 2.0, False, {}


WALK = "fedrl_test/NoisyWalk-v0"
if WALK not in gym.registry:
    gym.register(WALK, entry_point=NoisyWalk, max_episode_steps=20)

#: Gymnasium ids with per-agent kwargs: a classic-control env, a MuJoCo one, one registered only here
GYM_ENVS = {
    "pendulum": ("Pendulum-v1", [{"g": 9.0}, {"g": 10.0}, {"g": 11.0}], 25),
    "mujoco": ("InvertedPendulum-v5", [{"reset_noise_scale": 0.01}, {"reset_noise_scale": 0.05}], 15),
    "walk": (WALK, [{"drift": -0.02}, {"drift": 0.0}, {"drift": 0.03}], 19),
}
GYM_ALGORITHMS = {
    "per_fedavg_pg": (PerFedAvgPG, {"m_in": 2, "m_h": 2, "m_out": 2, "local_steps": 1}),
    "fedavg_pg": (FedAvgPG, {"n_trajectories": 3, "local_steps": 2}),
    "independent_pg": (IndependentPG, {"n_trajectories": 3}),
    "mfpo": (MFPO, {"local_steps": 2, "n_trajectories": 3, "initial_trajectories": 3, "eval_trajectories": 2}),
    "fedpg_br": (FedPGBR, {"batch_range": (2, 3), "inner_batch_size": 2}),
}


def make_on_gym(name: str, env: str):
    """Algorithm ``name`` on the Gymnasium id ``GYM_ENVS[env]``, its agents' kwargs differing."""
    env_id, agent_kwargs, horizon = GYM_ENVS[env]
    cls, kwargs = GYM_ALGORITHMS[name]
    return cls("MlpPolicy", env_id, agent_kwargs=agent_kwargs, horizon=horizon, policy_kwargs={"net_arch": (8,)}, seed=5,
               device="cpu", **kwargs)


def make(name: str):
    """The tiny federations of these tests (also built by the child process)."""
    if "@" in name:
        return make_on_gym(*name.split("@"))
    if name == "per_fedavg_pg":
        return PerFedAvgPG("TabularPolicy", GRID, m_in=2, m_h=2, m_out=2, local_steps=2, agents_per_round=3, seed=11, device="cpu")
    if name == "fedavg_pg":
        return FedAvgPG("TabularPolicy", GRID, n_trajectories=4, local_steps=2, seed=11, device="cpu")
    if name == "independent_pg":
        return IndependentPG("TabularPolicy", GRID, n_trajectories=4, local_steps=2, seed=11, device="cpu")
    if name == "mfpo":
        return MFPO("MlpPolicy", "fedrl/CartPole-v0", local_steps=2, n_trajectories=3, horizon=19, normalize_observations=True,
                    policy_kwargs={"net_arch": (8,)}, seed=11, device="cpu")
    if name == "fedpg_br":
        return FedPGBR("TabularPolicy", GRID, step_size=0.2, batch_range=(4, 6), inner_batch_size=2, attack="random_noise",
                       byzantine_agents=[0, 5], server_optimizer="adam", seed=11, device="cpu")
    raise ValueError(name)


_CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[3])
    from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
    from test_resume import make

    class Announce(BaseCallback):
        def _on_step(self):
            print("checkpoint", self.n_calls, flush=True)
            return True

    model = make(sys.argv[1])
    model.learn(total_rounds=10**6, callback=[CheckpointCallback(save_freq=1, save_path=sys.argv[2], name_prefix="ckpt"), Announce()])
    """
)


def _train_until_killed(name: str, folder: Path, after_checkpoints: int = 3, timeout: float = 120.0, child: str | None = None) -> int:
    """Run the child until it reports ``after_checkpoints`` saves, SIGKILL it; the exit status."""
    proc = subprocess.Popen([sys.executable, "-c", child or _CHILD, name, str(folder), str(TESTS)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(timeout, proc.kill)  # a child that hangs silently is killed too
    watchdog.start()
    try:
        seen = 0
        while seen < after_checkpoints:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"the child ended early or hung ({timeout} s): {proc.stderr.read()[-3000:]}")
            seen += line.startswith("checkpoint")
        assert proc.poll() is None  # still training: the kill lands mid-run
        proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _state(model) -> dict[str, torch.Tensor]:
    """Everything a resumed run must reproduce, as tensors."""
    out = {"theta": model.policy.theta.detach().clone()}
    for key, streams in model._random_state().items():
        if isinstance(streams, str):  # the Gymnasium environments' generators, as JSON text
            out[f"rng/{key}"] = torch.tensor(list(streams.encode()))
            continue
        for part, value in streams.items():
            out[f"rng/{key}/{part}"] = value
    for name in ("agent_direction", "agent_theta_prev", "agent_theta", "adam_step", "adam_first", "adam_second"):
        if name in vars(model):
            out[name] = getattr(model, name).detach().clone()
    if isinstance(model, FedPGBR):
        out["rng/server_traj/counters"] = model.server_sampler.streams.counters.clone()
        out["rng/noise/counters"] = model.noise_streams.counters.clone()
        out["filter_history"] = torch.tensor(model.filter_history)
    if model.obs_normalizer is not None:
        for key, value in model.obs_normalizer.state_dict().items():
            out[f"obs_normalizer/{key}"] = value
    counters = ["num_timesteps", "rounds_done", "trajectories_per_agent", "_n_updates", "local_step", "env_steps_per_agent", "server_env_steps"]
    for name in counters:
        if name in vars(model):
            out[name] = torch.tensor(float(getattr(model, name)), dtype=torch.float64)
    return out


NAMES = ["per_fedavg_pg", "fedavg_pg", "independent_pg", "mfpo", "fedpg_br"]


def _checkpoints(folder: Path) -> list[Path]:
    """The checkpoints a child left, oldest first."""
    return sorted(folder.glob("ckpt_*_steps.zip"), key=lambda p: int(p.stem.split("_")[1]))


def _killed_and_resumed(name: str, folder: Path, more_rounds: int, load_every_checkpoint: bool = False):
    """A child trains ``name`` until SIGKILLed; its newest checkpoint, trained ``more_rounds`` more,
    must equal an uninterrupted run of as many rounds (state by state). Returns both states."""
    assert _train_until_killed(name, folder) == -signal.SIGKILL
    checkpoints = _checkpoints(folder)
    assert len(checkpoints) >= 3
    cls = type(make(name))
    with _one_thread():
        if load_every_checkpoint:
            for path in checkpoints[:-1]:  # every checkpoint left behind is complete
                cls.load(path, device="cpu")
        resumed = cls.load(checkpoints[-1], device="cpu")
        done = resumed.rounds_done
        assert done >= 3
        resumed.learn(total_rounds=more_rounds, reset_num_timesteps=False)
        reference = make(name).learn(total_rounds=done + more_rounds)
    got, want = _state(resumed), _state(reference)
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    return got, want


@pytest.mark.parametrize("name", NAMES)
def test_save_load_continue_equals_an_uninterrupted_run(tmp_path, name):
    # In one process (cheap): the same property for every algorithm, including a save mid-way.
    model = make(name).learn(total_rounds=2)
    model.save(tmp_path / "m.zip")
    resumed = type(model).load(tmp_path / "m.zip", device="cpu").learn(total_rounds=2, reset_num_timesteps=False)
    reference = make(name).learn(total_rounds=4)
    got, want = _state(resumed), _state(reference)
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


# The subprocess kill for the algorithms of issue 15 (the others share the shell and are covered above).
@pytest.mark.parametrize("name", ["per_fedavg_pg", "mfpo", "fedpg_br"])
def test_killed_run_resumes_bitwise_from_its_checkpoint(tmp_path, name):
    got, want = _killed_and_resumed(name, tmp_path, more_rounds=3, load_every_checkpoint=True)
    # Not a vacuous comparison: the run moved, and a resume from the wrong round would differ.
    moved = "agent_theta" if name == "independent_pg" else "theta"  # IndependentPG trains its agents only
    assert not torch.equal(want[moved], _state(make(name))[moved])
    for path in tmp_path.iterdir():  # a kill during a save may leave its temporary file
        if path.name.startswith(".ckpt_"):
            path.unlink()


@pytest.mark.parametrize("env", list(GYM_ENVS))
@pytest.mark.parametrize("name", NAMES)
def test_on_a_gymnasium_id_save_load_continue_equals_an_uninterrupted_run(tmp_path, name, env):
    # The environments' generators travel with the file: the continued episodes are the same ones.
    if env == "mujoco":
        pytest.importorskip("mujoco")
    with _one_thread():
        model = make_on_gym(name, env).learn(total_rounds=2)
        model.save(tmp_path / "m.zip")
        resumed = type(model).load(tmp_path / "m.zip", device="cpu").learn(total_rounds=2, reset_num_timesteps=False)
        reference = make_on_gym(name, env).learn(total_rounds=4)
    got, want = _state(resumed), _state(reference)
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), (key, float((got[key].double() - want[key].double()).abs().max()))


# Killed mid-run on each kind of Gymnasium id (one algorithm each, rotating), as in the test above.
@pytest.mark.parametrize("name", ["per_fedavg_pg@walk", "mfpo@pendulum", "fedpg_br@mujoco", "fedavg_pg@walk", "independent_pg@pendulum"])
def test_on_a_gymnasium_id_a_killed_run_resumes_bitwise(tmp_path, name):
    if "mujoco" in name:
        pytest.importorskip("mujoco")
    _killed_and_resumed(name, tmp_path, more_rounds=2)
    for path in tmp_path.iterdir():
        if path.name.startswith(".ckpt_"):
            path.unlink()


def test_on_a_gymnasium_id_a_resume_without_the_envs_generators_would_differ(tmp_path):
    # The check above can fail: the same resume with the environments' generators left fresh differs.
    with _one_thread():
        model = make_on_gym("fedavg_pg", "walk").learn(total_rounds=2)
        model.save(tmp_path / "m.zip")
        reference = make_on_gym("fedavg_pg", "walk").learn(total_rounds=4)
        resumed = FedAvgPG.load(tmp_path / "m.zip", device="cpu")
        resumed.federation.sampler._reset_seed_used = False  # as before: the envs start from their seed
        resumed.learn(total_rounds=2, reset_num_timesteps=False)
    assert not torch.equal(resumed.policy.theta, reference.policy.theta)


def test_a_resume_without_the_saved_random_streams_would_differ(tmp_path):
    # The check above can fail: restoring everything but the random streams breaks it.
    model = make("fedpg_br").learn(total_rounds=2)
    model.save(tmp_path / "m.zip")
    reference = make("fedpg_br").learn(total_rounds=4)
    resumed = FedPGBR.load(tmp_path / "m.zip", device="cpu")
    fresh = make("fedpg_br")
    resumed.federation.load_state_dict(fresh.federation.state_dict())
    resumed.learn(total_rounds=2, reset_num_timesteps=False)
    assert not torch.equal(resumed.policy.theta, reference.policy.theta)
    assert os.listdir(tmp_path) == ["m.zip"]


# --- FedAvgSB3 -----------------------------------------------------------------------------------
def make_fedavg_sb3():
    """Fed-DQN on two CartPole agents, 40 steps per agent and round."""
    from stable_baselines3 import DQN

    from fedrl_algos import FedAvgSB3

    kwargs = {"policy_kwargs": {"net_arch": [8]}, "learning_starts": 30, "buffer_size": 500, "batch_size": 16, "train_freq": 4,
              "target_update_interval": 50}
    return FedAvgSB3(DQN, "fedrl/CartPole-v0", n_agents=2, algorithm_kwargs=kwargs, sync_every=40, seed=0, device="cpu")


def _agent_state(fed) -> dict[str, torch.Tensor]:
    out = {}
    for i, agent in enumerate(fed.agents):
        for key, state in agent.get_parameters().items():
            flat = state["state"] if "state" in state and "param_groups" in state else state
            for k, v in flat.items():
                for kk, vv in (v.items() if isinstance(v, dict) else [("", v)]):
                    out[f"{i}/{key}/{k}/{kk}"] = torch.as_tensor(vv)
        for name in ("num_timesteps", "_n_updates", "_n_calls", "exploration_rate", "_episode_num"):
            if hasattr(agent, name):  # DQN's exploration counters
                out[f"{i}/{name}"] = torch.tensor(float(getattr(agent, name)), dtype=torch.float64)
    out["num_timesteps"] = torch.tensor(fed.num_timesteps)
    out["rounds_done"] = torch.tensor(fed.rounds_done)
    return out


class _StopAfter(BaseCallback):
    """Ends ``learn`` after ``rounds`` rounds."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds

    def _on_step(self) -> bool:
        return self.n_calls < self.rounds


def make_fedavg_sb3_on(name: str):
    """Fed-PPO / Fed-SAC on Gymnasium ids with per-agent kwargs (also built by the child process)."""
    from stable_baselines3 import PPO, SAC

    from fedrl_algos import FedAvgSB3

    ppo = {"n_steps": 32, "batch_size": 16, "n_epochs": 2, "policy_kwargs": {"net_arch": [8]}}
    if name == "ppo@pendulum":
        return FedAvgSB3(PPO, "Pendulum-v1", agent_kwargs=[{"g": 9.0}, {"g": 11.0}], algorithm_kwargs=ppo, seed=0, device="cpu")
    if name == "ppo@walk":
        return FedAvgSB3(PPO, WALK, agent_kwargs=[{"drift": 0.01}, {"drift": -0.01}], algorithm_kwargs=ppo, seed=0, device="cpu")
    if name == "ppo@mujoco":
        return FedAvgSB3(PPO, "InvertedPendulum-v5", agent_kwargs=[{"reset_noise_scale": 0.01}, {"reset_noise_scale": 0.05}],
                         algorithm_kwargs=ppo, seed=0, device="cpu")
    if name == "sac@pendulum":
        return FedAvgSB3(SAC, "Pendulum-v1", agent_kwargs=[{"g": 9.0}, {"g": 11.0}], sync_every=20, seed=0, device="cpu",
                         algorithm_kwargs={"learning_starts": 20, "batch_size": 8, "buffer_size": 300, "policy_kwargs": {"net_arch": [8]}})
    if name == "dqn@cartpole":
        return make_fedavg_sb3()
    raise ValueError(name)


#: the total every run of these tests plans its SB3 schedules over (exploration, learning rate)
SB3_TOTAL = 10**7


def _fedavg_sb3_resumed(path, rounds: int):
    from fedrl_algos import FedAvgSB3

    resumed = FedAvgSB3.load(path, device="cpu")
    return resumed.learn(SB3_TOTAL - resumed.num_timesteps, reset_num_timesteps=False, callback=_StopAfter(rounds))


def _assert_same_agents(got, want) -> None:
    got, want = _agent_state(got), _agent_state(want)
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("name", ["dqn@cartpole", "ppo@pendulum", "ppo@walk", "ppo@mujoco", "sac@pendulum"])
def test_fedavg_sb3_save_load_continue_equals_an_uninterrupted_run(tmp_path, name):
    # The agents' files, their environments mid-episode (replayed from their records, or a family's
    # state), the monitors, the action spaces' and the process's generators: the same run goes on.
    if "mujoco" in name:
        pytest.importorskip("mujoco")
    with _one_thread():
        make_fedavg_sb3_on(name).learn(SB3_TOTAL, callback=_StopAfter(2)).save(tmp_path / "m.zip", save_replay_buffer=True)
        resumed = _fedavg_sb3_resumed(tmp_path / "m.zip", 2)
        reference = make_fedavg_sb3_on(name).learn(SB3_TOTAL, callback=_StopAfter(4))
    _assert_same_agents(resumed, reference)
    assert resumed.rounds_done == 4 and resumed.num_timesteps == reference.num_timesteps


def test_fedavg_sb3_a_file_without_the_resume_state_warns_and_differs(tmp_path):
    # The check above can fail: the same file without its resume state (as saved by an earlier fedrl)
    # loads with a warning and starts new episodes.
    import json
    import zipfile

    with _one_thread():
        make_fedavg_sb3_on("ppo@walk").learn(SB3_TOTAL, callback=_StopAfter(2)).save(tmp_path / "new.zip")
        with zipfile.ZipFile(tmp_path / "new.zip") as src, zipfile.ZipFile(tmp_path / "old.zip", "w") as dst:
            for member in src.namelist():
                content = src.read(member)
                if member == "fedavg_sb3.json":
                    config = json.loads(content)
                    del config["resume"]
                    content = json.dumps(config).encode()
                dst.writestr(member, content)
        with pytest.warns(UserWarning, match="does not continue bitwise"):
            resumed = _fedavg_sb3_resumed(tmp_path / "old.zip", 2)
        reference = make_fedavg_sb3_on("ppo@walk").learn(SB3_TOTAL, callback=_StopAfter(4))
    assert resumed.rounds_done == 4
    assert not np.array_equal(resumed.agents[0].policy.parameters_to_vector(), reference.agents[0].policy.parameters_to_vector())


_CHILD_SB3 = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[3])
    from stable_baselines3.common.callbacks import BaseCallback
    from test_resume import SB3_TOTAL, make_fedavg_sb3_on

    class SaveAndAnnounce(BaseCallback):
        # A checkpoint every round, replay buffers included (the off-policy agents resume from them).
        def _on_step(self):
            self.model.save(f"{sys.argv[2]}/ckpt_{self.n_calls}_steps.zip", save_replay_buffer=True)
            print("checkpoint", self.n_calls, flush=True)
            return True

    make_fedavg_sb3_on(sys.argv[1]).learn(SB3_TOTAL, callback=SaveAndAnnounce())
    """
)


@pytest.mark.parametrize("name", ["dqn@cartpole", "ppo@walk"])
def test_fedavg_sb3_killed_run_resumes_bitwise(tmp_path, name):
    status = _train_until_killed(name, tmp_path, after_checkpoints=3, child=_CHILD_SB3)
    assert status == -signal.SIGKILL
    with _one_thread():
        resumed = _fedavg_sb3_resumed(_checkpoints(tmp_path)[-1], 2)
        done = resumed.rounds_done - 2
        assert done >= 3
        reference = make_fedavg_sb3_on(name).learn(SB3_TOTAL, callback=_StopAfter(done + 2))
    _assert_same_agents(resumed, reference)
    for path in tmp_path.iterdir():
        if path.name.startswith(".ckpt_"):
            path.unlink()


def test_fedavg_sb3_replay_buffers_are_saved_on_request(tmp_path):
    from fedrl_algos import FedAvgSB3

    fed = make_fedavg_sb3().learn(160)
    fed.save(tmp_path / "without.zip")
    fed.save(tmp_path / "with.zip", save_replay_buffer=True)
    without = FedAvgSB3.load(tmp_path / "without.zip", device="cpu")
    assert all(a.replay_buffer.pos == 0 and not a.replay_buffer.full for a in without.agents)
    loaded = FedAvgSB3.load(tmp_path / "with.zip", device="cpu")
    for a, b in zip(fed.agents, loaded.agents, strict=True):
        assert b.replay_buffer.pos == a.replay_buffer.pos == 80
        for key in ("observations", "actions", "rewards", "dones", "timeouts", "next_observations"):
            assert (getattr(a.replay_buffer, key) == getattr(b.replay_buffer, key)).all(), key
        assert b.exploration_rate == a.exploration_rate and b._n_calls == a._n_calls


def test_a_file_without_the_envs_generators_loads_warns_and_trains_on(tmp_path):
    # A file of an earlier fedrl (no "envs" in its random state) loads as before, with a warning.
    import json
    import zipfile

    model = make_on_gym("fedavg_pg", "walk").learn(total_rounds=1)
    model.save(tmp_path / "new.zip")
    with zipfile.ZipFile(tmp_path / "new.zip") as src, zipfile.ZipFile(tmp_path / "old.zip", "w") as dst:
        for member in src.namelist():
            content = src.read(member)
            if member == "data":
                data = json.loads(content)
                del data["_rng_state"]["envs"]
                content = json.dumps(data).encode()
            dst.writestr(member, content)
    with pytest.warns(UserWarning, match="holds no random state of its Gymnasium environments"):
        old = FedAvgPG.load(tmp_path / "old.zip", device="cpu")
    assert old.learn(total_rounds=1, reset_num_timesteps=False).rounds_done == 2
