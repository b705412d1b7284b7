"""FedAvgSB3 (Fed-DQN, Fed-SAC, Fed-PPO): the server rule by hand, what a sync touches, the shell.

Also: files saved before the split into :mod:`fedrl_algos.fedavg_sb3` (by the module
``fedrl_algos.fed_sb3``, gone since) still load.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import pathlib
import types
import zipfile

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from fedrl_algos import FedAvgSB3
from fedrl_algos.fedavg_sb3 import ParameterAverage, PolicySelector, PrefixSelector, default_selector, parameter_average
from fedrl_algos.fedavg_sb3.persistence import CONFIG_NAME, FORMAT_VERSION, read_archive, write_archive
from fedrl_algos.reproduce.sb3_baselines import SB3_BASELINE_DEFAULTS, run_fed_baseline
from fedrl_wrappers import FederatedVecEnv

DATA = pathlib.Path(__file__).parent / "data"
CARTPOLE = "fedrl/CartPole-v0"
PENDULUM = "fedrl/Pendulum-v0"
TINY = {"policy_kwargs": {"net_arch": [8]}}
DQN_KW = {**TINY, "learning_starts": 30, "buffer_size": 500, "batch_size": 16, "train_freq": 4, "target_update_interval": 50}
SAC_KW = {**TINY, "learning_starts": 30, "buffer_size": 500, "batch_size": 16}
PPO_KW = {**TINY, "n_steps": 32, "batch_size": 16, "n_epochs": 1}


def _fed(cls, env=CARTPOLE, n_agents=2, extra=None, **kwargs):
    algorithm_kwargs = {**{DQN: DQN_KW, SAC: SAC_KW, PPO: PPO_KW}[cls], **(extra or {})}
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("device", "cpu")
    return FedAvgSB3(cls, env, n_agents=n_agents, algorithm_kwargs=algorithm_kwargs, **kwargs)


def _all_tensors(model):
    """Every tensor a sync could touch: the policy's parameters/buffers and SAC's log_ent_coef."""
    return PrefixSelector(None, (), ("log_ent_coef",))(model)


def _perturb(fed):
    """Give agent i's every tensor its own offset, so that nothing is equal across agents."""
    with torch.no_grad():
        for i, agent in enumerate(fed.agents):
            for k, t in enumerate(_all_tensors(agent).values()):
                t.add_(0.01 * (i + 1) * (k + 1))


# --- the server rule, by hand -------------------------------------------------------------------
def _tiny_model(value: float, bias: float):
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    with torch.no_grad():
        net[0].weight.fill_(value)
        net[0].bias.fill_(bias)
        net[1].weight.fill_(-value)
        net[1].bias.fill_(2 * bias)
    return types.SimpleNamespace(policy=net)


def test_parameter_average_by_hand():
    models = [_tiny_model(1.0, 0.0), _tiny_model(2.0, 1.0), _tiny_model(6.0, 5.0)]
    before = [{k: t.data_ptr() for k, t in m.policy.named_parameters()} for m in models]
    stats = ParameterAverage()(models)
    for m, ptrs in zip(models, before):
        assert torch.equal(m.policy[0].weight, torch.full((2, 2), 3.0))
        assert torch.equal(m.policy[0].bias, torch.full((2,), 2.0))
        assert torch.equal(m.policy[1].weight, torch.full((1, 2), -3.0))
        assert torch.equal(m.policy[1].bias, torch.full((1,), 4.0))
        assert {k: t.data_ptr() for k, t in m.policy.named_parameters()} == ptrs  # in place
    assert stats["n_averaged"] == 4 + 2 + 2 + 1
    # dispersion: mean over agents of ||θ_i − θ̄||; θ_i − θ̄ = (v−3)·1 on the 6 weights, (b−2)·1 on 2 biases, 2(b−2) on 1
    expected = np.mean([np.sqrt(6 * (v - 3) ** 2 + 2 * (b - 2) ** 2 + 4 * (b - 2) ** 2) for v, b in [(1, 0), (2, 1), (6, 5)]])
    assert stats["dispersion"] == pytest.approx(expected, rel=1e-6)


def test_parameter_average_update_by_hand():
    flat = torch.tensor([[0.0, 0.0, 2.0], [4.0, 8.0, 2.0]])
    mean, dispersion = parameter_average(flat, torch.tensor([3.0, 1.0], dtype=torch.float64))
    assert torch.equal(mean, torch.tensor([1.0, 2.0, 2.0]))  # (3·row0 + 1·row1) / 4
    # ‖row0 − mean‖ = √5, ‖row1 − mean‖ = √(9 + 36) = 3√5
    assert float(dispersion) == pytest.approx(2 * np.sqrt(5), rel=1e-6)
    mean, dispersion = parameter_average(flat)
    assert torch.equal(mean, torch.tensor([2.0, 4.0, 2.0])) and float(dispersion) == pytest.approx(np.sqrt(20))


def test_parameter_average_weights_and_selection():
    models = [_tiny_model(0.0, 0.0), _tiny_model(4.0, 4.0)]
    ParameterAverage(PrefixSelector(include=("0.",)), weights=[3.0, 1.0])(models)
    for m in models:
        assert torch.equal(m.policy[0].weight, torch.full((2, 2), 1.0))  # (3·0 + 1·4) / 4
        assert torch.equal(m.policy[0].bias, torch.full((2,), 1.0))
    assert torch.equal(models[0].policy[1].weight, torch.zeros(1, 2))  # not selected: untouched
    assert torch.equal(models[1].policy[1].weight, torch.full((1, 2), -4.0))
    with pytest.raises(ValueError, match="weights"):
        ParameterAverage(weights=[1.0, -1.0])
    with pytest.raises(ValueError, match="weights"):
        ParameterAverage(weights=[1.0, 2.0, 3.0])(models)
    with pytest.raises(ValueError, match="selects no tensor"):
        ParameterAverage(PrefixSelector(include=("nothing.",)))(models)


# --- which modules each mode averages ----------------------------------------------------------
DOCUMENTED = {
    # (algorithm, mode): predicate on a tensor name -> averaged?
    (DQN, "policy"): lambda n: n.startswith("q_net."),
    (DQN, "all"): lambda n: True,
    (SAC, "policy"): lambda n: n.startswith("actor."),
    (SAC, "all"): lambda n: True,  # actor, critic, critic_target and log_ent_coef
    (PPO, "policy"): lambda n: not n.startswith(("value_net.", "mlp_extractor.value_net.")),
    (PPO, "all"): lambda n: True,
}


@pytest.mark.parametrize(("cls", "mode"), list(DOCUMENTED))
def test_aggregate_mode_touches_exactly_the_documented_modules(cls, mode):
    fed = _fed(cls, env=PENDULUM if cls is SAC else CARTPOLE, aggregate=mode)
    _perturb(fed)
    before = [{k: t.detach().clone() for k, t in _all_tensors(a).items()} for a in fed.agents]
    names = list(before[0])
    if cls is SAC:
        assert "log_ent_coef" in names and any(n.startswith("critic_target.") for n in names)
    if cls is DQN:
        assert any(n.startswith("q_net_target.") for n in names)
    fed.synchronize()
    after = [_all_tensors(a) for a in fed.agents]
    averaged = {n for n in names if DOCUMENTED[cls, mode](n)}
    assert averaged and (mode == "all") == (averaged == set(names))
    for n in names:
        if n in averaged:
            mean = torch.stack([b[n] for b in before]).mean(0)
            for a in after:
                torch.testing.assert_close(a[n], mean, rtol=0, atol=1e-6)
        else:
            for a, b in zip(after, before):
                assert torch.equal(a[n], b[n]), n


def test_default_selectors():
    assert default_selector("policy") == PolicySelector()
    assert default_selector("all") == PrefixSelector(None, (), ("log_ent_coef",))
    fed = _fed(SAC, env=PENDULUM)
    assert PolicySelector().prefixes(fed.agents[0]) == PrefixSelector(("actor.",))
    with pytest.raises(ValueError, match="aggregate"):
        default_selector("critic")
    assert PrefixSelector(include="actor.").include == ("actor.",)
    with pytest.raises(ValueError, match="exclude"):
        PrefixSelector(exclude=(1,))


# --- a sync: identical parameters, local state untouched --------------------------------------
def _local_state(agent):
    """Deep copies of every optimizer state and of the replay buffer's storage."""
    optimizers = {"policy": getattr(agent.policy, "optimizer", None), "ent_coef": getattr(agent, "ent_coef_optimizer", None)}
    for attr in ("actor", "critic"):
        optimizers[attr] = getattr(getattr(agent.policy, attr, None), "optimizer", None)
    opt = {k: copy.deepcopy(o.state_dict()) for k, o in optimizers.items() if o is not None}
    buf = agent.replay_buffer
    return opt, {k: copy.deepcopy(getattr(buf, k)) for k in ("observations", "actions", "rewards", "dones", "pos", "full")}


def _assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("cls", [DQN, SAC])
def test_sync_makes_policies_identical_and_leaves_buffers_and_optimizers_alone(cls):
    fed = _fed(cls, env=PENDULUM if cls is SAC else CARTPOLE, n_agents=3, sync_every=40)
    fed.learn(3 * 40 * 2)
    assert fed.num_timesteps == 240 and fed.rounds_done == 2
    policy = PolicySelector()
    synced = [policy(a) for a in fed.agents]
    for name, t in synced[0].items():  # right after learn() (which ends with a sync)
        for other in synced[1:]:
            assert torch.equal(t, other[name]), name
    for agent in fed.agents:  # local training only: the agents drift apart
        agent.learn(40, reset_num_timesteps=False)
    drifted = [{k: t.detach().clone() for k, t in policy(a).items()} for a in fed.agents]
    assert any(not torch.equal(drifted[0][k], drifted[1][k]) for k in drifted[0])
    local = [_local_state(a) for a in fed.agents]
    assert local[0][0]["policy" if cls is DQN else "actor"]["state"], "the optimizer has state to protect"
    stats = fed.synchronize()
    assert stats["dispersion"] > 0
    for agent, (opt, buf) in zip(fed.agents, local):
        now_opt, now_buf = _local_state(agent)
        _assert_same(opt, now_opt)
        _assert_same(buf, now_buf)
    synced = [policy(a) for a in fed.agents]
    for name, t in synced[0].items():
        torch.testing.assert_close(t, torch.stack([d[name] for d in drifted]).mean(0), rtol=0, atol=1e-6)
        for other in synced[1:]:
            assert torch.equal(t, other[name])


def test_agents_start_from_one_initialization():
    fed = _fed(DQN, n_agents=3)
    ref = _all_tensors(fed.agents[0])
    for agent in fed.agents[1:]:
        for name, t in _all_tensors(agent).items():
            assert torch.equal(t, ref[name])
    assert fed.agents[0].seed != fed.agents[1].seed  # their own exploration streams


# --- smoke runs of the three baselines ---------------------------------------------------------
def test_fed_dqn_smoke_cartpole_and_logged_metrics(tmp_path):
    fed = _fed(DQN, n_agents=2, sync_every=40, extra={"exploration_fraction": 1.0})
    fed.set_logger(configure(str(tmp_path), ["csv"]))
    fed.learn(400, log_interval=1)
    assert fed.num_timesteps == 400 and fed.rounds_done == 5
    assert all(a.num_timesteps == 200 for a in fed.agents)
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert len(rows) == 5
    for key in ("fed/round", "fed/dispersion", "fed/n_averaged", "rollout/ep_rew_mean", "rollout/exploration_rate",
                "train/loss", "time/fps", "agents/ep_rew_mean_0"):
        assert key in rows[-1], key
    assert float(rows[-1]["rollout/ep_rew_mean"]) > 0
    # the exploration schedule runs over the whole federated run (200 steps per agent), not per round
    # (a schedule restarted by every round's learn() call would sit at its final value 0.05)
    eps = [float(row["rollout/exploration_rate"]) for row in rows]
    assert eps == pytest.approx([1 - 0.95 * k / 5 for k in range(1, 6)])
    obs = np.zeros((5, 4), dtype=np.float32)
    action, state = fed.predict(obs, deterministic=True)
    assert action.shape == (5,) and state is None
    assert np.array_equal(action, fed.predict(obs, deterministic=True, agent=1)[0])


def test_fed_sac_smoke_pendulum():
    fed = _fed(SAC, env=PENDULUM, n_agents=2, sync_every=20, aggregate="all")
    assert fed.sync_every == 20
    fed.learn(240)
    assert fed.num_timesteps == 240
    assert all(a._n_updates > 0 for a in fed.agents)
    names = _all_tensors(fed.agents[0])
    for name, t in _all_tensors(fed.agents[1]).items():
        assert torch.equal(t, names[name])
    returns = fed.evaluate(n_episodes=1)
    assert returns.shape == (2,) and np.all(returns < 0)


def test_fed_ppo_smoke_and_sync_every_units():
    fed = _fed(PPO, n_agents=2)
    assert fed.sync_every == 32  # default: one rollout (n_steps * n_envs)
    fed.learn(128)
    assert fed.num_timesteps == 128 and fed.rounds_done == 2
    with pytest.raises(ValueError, match="sync_every must be a multiple of n_steps"):
        _fed(PPO, sync_every=48)
    with pytest.raises(ValueError, match="sync_every must be a multiple of train_freq"):
        _fed(DQN, sync_every=10)
    assert _fed(DQN).sync_every == 40  # default: ten training phases (10 * train_freq * n_envs)


def test_tensorboard_and_stdout_loggers(tmp_path, capsys):
    fed = _fed(DQN, sync_every=40, tensorboard_log=str(tmp_path), verbose=1)
    fed.learn(160, log_interval=2)
    assert list(tmp_path.glob("FedAvgSB3_1/events.out.tfevents.*"))
    out = capsys.readouterr().out
    assert out.count("fed/") == 1 and "dispersion" in out  # one dump: 2 rounds, log_interval=2


def test_same_seed_same_federation():
    a = _fed(DQN, sync_every=40).learn(240)
    b = _fed(DQN, sync_every=40).learn(240)
    c = _fed(DQN, sync_every=40, seed=1).learn(240)
    pa, pb, pc = (_all_tensors(m.agents[0]) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


def test_federated_vec_env_and_heterogeneous_agent_kwargs():
    venv = FederatedVecEnv(CARTPOLE, 2, agents=[0, 3], seed=0)
    fed = FedAvgSB3(PPO, venv, algorithm_kwargs=PPO_KW, seed=0, device="cpu")
    assert fed.n_agents == 2 and fed.n_envs_per_agent == 2 and fed.sync_every == 64
    assert fed.get_env() is venv
    fed.learn(256)
    assert fed.num_timesteps == 256
    kw = [{"masspole": 0.1}, {"masspole": 0.3}]
    fed = FedAvgSB3(DQN, CARTPOLE, agent_kwargs=kw, algorithm_kwargs=DQN_KW, seed=0, device="cpu")
    assert [k["masspole"] for k in fed.get_env().agent_kwargs] == pytest.approx([0.1, 0.3])
    gym_fed = FedAvgSB3(DQN, "CartPole-v1", n_agents=2, algorithm_kwargs=DQN_KW, seed=0, device="cpu")
    assert gym_fed.get_env().backend == "generic"
    gym_fed.learn(80)


# --- callbacks, progress bar, persistence ------------------------------------------------------
class _Count(BaseCallback):
    def __init__(self, stop_after=None):
        super().__init__()
        self.calls, self.stop_after = 0, stop_after

    def _on_step(self) -> bool:
        self.calls += 1
        return self.stop_after is None or self.calls < self.stop_after


@pytest.mark.filterwarnings("ignore:rich is experimental")
def test_callbacks_once_per_round_and_can_stop():
    fed = _fed(DQN, sync_every=40)
    counter = _Count()
    fed.learn(400, callback=counter, progress_bar=True)
    assert counter.calls == fed.rounds_done == 5
    stopper = _Count(stop_after=2)
    fed.learn(400, callback=stopper, reset_num_timesteps=False)
    assert stopper.calls == 2 and fed.num_timesteps == 400 + 160


def test_save_load_roundtrip(tmp_path):
    fed = _fed(SAC, env=PENDULUM, sync_every=20).learn(120)
    fed.save(tmp_path / "fed")
    loaded = FedAvgSB3.load(tmp_path / "fed", device="cpu")
    assert (tmp_path / "fed.zip").exists()
    assert loaded.num_timesteps == 120 and loaded.rounds_done == 3 and loaded.sync_every == 20
    assert loaded.aggregate_mode == "policy" and loaded.n_agents == 2
    assert [k["mass"] for k in loaded.get_env().agent_kwargs] == [k["mass"] for k in fed.get_env().agent_kwargs]
    for a, b in zip(fed.agents, loaded.agents):
        pa, pb = _all_tensors(a), _all_tensors(b)
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
        _assert_same(a.actor.optimizer.state_dict()["state"], b.actor.optimizer.state_dict()["state"])
        assert b.num_timesteps == a.num_timesteps
    obs = np.zeros((3, 3), dtype=np.float32)
    assert np.array_equal(fed.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    loaded.learn(40, reset_num_timesteps=False)
    assert loaded.num_timesteps == 160 and loaded.rounds_done == 4
    params = loaded.get_parameters()
    assert set(params) == {"agent_0", "agent_1"}
    loaded.set_parameters(params)


def test_save_load_custom_rule_needs_the_rule(tmp_path):
    rule = ParameterAverage(PrefixSelector(include=("q_net.q_net.0.",)))
    fed = _fed(DQN, aggregate=rule)
    fed.save(tmp_path / "fed.zip")
    with pytest.raises(ValueError, match="aggregate"):
        FedAvgSB3.load(tmp_path / "fed.zip")
    loaded = FedAvgSB3.load(tmp_path / "fed.zip", aggregate=rule)
    assert loaded.aggregator is rule


def test_loads_a_federation_saved_before_the_split():
    # tests/data/fedavg_sb3_format1_halfcheetah.zip was saved by fedrl_algos/fed_sb3.py at commit e06eef9:
    #   FedAvgSB3(SAC, "HalfCheetah-v5", agent_kwargs=mujoco_agent_kwargs(mass_scale=[0.9, 1.1]), sync_every=20,
    #             seed=0, algorithm_kwargs={"learning_starts": 20, "batch_size": 8, "buffer_size": 100,
    #             "policy_kwargs": {"net_arch": [8]}}, device="cpu").learn(80).save(...)
    # and the .json beside it holds that federation's deterministic actions on a fixed batch of observations.
    pytest.importorskip("mujoco")
    from fedrl_wrappers.heterogeneity import MuJoCoDynamics

    expected = json.loads((DATA / "fedavg_sb3_format1_halfcheetah.json").read_text())
    loaded = FedAvgSB3.load(DATA / "fedavg_sb3_format1_halfcheetah.zip", device="cpu", allow_pickle=True)
    try:
        assert loaded.num_timesteps == 80 and loaded.rounds_done == 2 and loaded.sync_every == 20
        assert loaded.n_agents == 2 and loaded.aggregate_mode == "policy" and loaded.seed == 0
        assert type(loaded.agents[0]) is SAC
        assert [k["wrappers"] for k in loaded.get_env().agent_kwargs] == [[MuJoCoDynamics(0.9, 1.0)], [MuJoCoDynamics(1.1, 1.0)]]
        obs = np.linspace(-1, 1, 34, dtype=np.float32).reshape(2, 17)
        for agent, actions in enumerate(expected["deterministic_actions_per_agent"]):
            got = loaded.predict(obs, deterministic=True, agent=agent)[0]
            # The saved networks, up to the last float32 bits: the BLAS kernels' rounding depends on the CPU
            # (one action an ulp apart on the AVX-512 machine of 2026-12-04 from the file's).
            np.testing.assert_allclose(got, np.asarray(actions, dtype=np.float32), rtol=4e-7, atol=0)
        loaded.learn(40, reset_num_timesteps=False)
        assert loaded.num_timesteps == 120 and loaded.rounds_done == 3
    finally:
        loaded.close()


def test_archive_format_version_is_checked(tmp_path):
    fed = _fed(DQN)
    buf = io.BytesIO()
    fed.save(buf)
    config, blobs = read_archive(io.BytesIO(buf.getvalue()))
    assert config["format_version"] == FORMAT_VERSION == 2 and len(blobs) == 2
    for version in (FORMAT_VERSION + 1, None):
        write_archive(tmp_path / "other", {**config, "format_version": version}, blobs)
        with pytest.raises(ValueError, match="format_version"):
            FedAvgSB3.load(tmp_path / "other")
    write_archive(tmp_path / "same", config, blobs)
    assert FedAvgSB3.load(tmp_path / "same.zip", device="cpu").n_agents == 2
    assert sorted(zipfile.ZipFile(tmp_path / "same.zip").namelist()) == sorted([CONFIG_NAME, "agent_0.zip", "agent_1.zip"])


# --- the layering --------------------------------------------------------------------------------
def test_the_algorithm_package_does_not_import_its_experiment_settings():
    import test_layers

    graph = test_layers.import_graph()
    package = "fedrl_algos.fedavg_sb3"
    ours = [m for m in graph if test_layers._within(m, package)]
    assert set(ours) == {package, f"{package}.aggregation", f"{package}.fedavg_sb3", f"{package}.persistence"}
    reached, todo = set(), list(ours)  # everything the package imports, directly or not
    while todo:
        for target in graph[todo.pop()]:
            if target not in reached:
                reached.add(target)
                todo.append(target)
    assert not {m for m in reached if test_layers._within(m, "fedrl_algos.reproduce")}
    assert "fedrl_algos.fedavg_sb3" in graph["fedrl_algos.reproduce.sb3_baselines"]
    involved = [c for c in test_layers._cycles(graph) if any(test_layers._within(m, package) or m in (
        "fedrl_algos.reproduce.sb3_baselines",) for m in c)]
    assert not involved


# --- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"algorithm_class": torch.nn.Linear}, "algorithm_class"),
        ({"env": 3}, "env"),
        ({"env": "CartPole-v1", "n_agents": None}, "n_agents"),
        ({"n_agents": 0}, "n_agents"),
        ({"agent_kwargs": [{}], "n_agents": 2}, "n_agents"),
        ({"agent_kwargs": {"masspole": 0.1}, "n_agents": None}, "agent_kwargs"),
        ({"aggregate": "critic"}, "aggregate"),
        ({"sync_every": 0}, "sync_every"),
        ({"algorithm_kwargs": {"seed": 3}}, "algorithm_kwargs"),
        ({"policy": "NoSuchPolicy"}, "policy"),
        ({"n_envs": 0}, "n_envs"),
        ({"seed": "zero"}, "seed"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    args = {"algorithm_class": DQN, "env": CARTPOLE, "n_agents": 2, "algorithm_kwargs": DQN_KW, "device": "cpu"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        FedAvgSB3(**args)


@pytest.mark.parametrize("name", ["sync_every", "n_agents", "n_envs"])
def test_non_integer_counts_name_themselves(name):
    # fedrl_envs.validation.check_int: a float is never truncated, a bool is not a count
    args = {"algorithm_class": DQN, "env": CARTPOLE, "n_agents": 2, "algorithm_kwargs": DQN_KW, "device": "cpu"}
    for bad in (40.0, True):
        with pytest.raises(TypeError, match=name):
            FedAvgSB3(**{**args, name: bad})


def test_bad_call_arguments():
    fed = _fed(DQN)
    with pytest.raises(ValueError, match=r"agent must be in \[0, 1\], got 2"):
        fed.predict(np.zeros((1, 4), dtype=np.float32), agent=2)
    with pytest.raises(ValueError, match="agent"):
        fed.predict(np.zeros((1, 4), dtype=np.float32), agent=-1)
    assert fed.predict(np.zeros((1, 4), dtype=np.float32), agent=np.int64(1))[0].shape == (1,)
    with pytest.raises(ValueError, match="total_timesteps"):
        fed.learn(0)
    with pytest.raises(ValueError, match="n_agents"):
        FedAvgSB3(DQN, FederatedVecEnv(CARTPOLE, 1, agents=[0, 1]), n_agents=3)


# --- the MFPO comparison's entry point ---------------------------------------------------------
def test_run_fed_baseline_records():
    records = run_fed_baseline(
        "fed-dqn", CARTPOLE, 2, 320, seed=0, sync_every=40, eval_every=160, eval_episodes=1,
        algorithm_kwargs={"learning_starts": 50, "policy_kwargs": {"net_arch": [8]}},
    )
    assert [r["env_steps"] for r in records] == [160, 320]
    last = records[-1]
    assert last["method"] == "Fed-DQN" and last["n_agents"] == 2 and last["round"] == 4
    assert len(last["eval_return_per_agent"]) == 2 and last["eval_return"] >= 1
    assert last["eval_return"] == pytest.approx(np.mean(last["eval_return_per_agent"]))
    assert set(SB3_BASELINE_DEFAULTS) == {"Fed-DQN", "Fed-SAC", "Fed-PPO"}
    with pytest.raises(ValueError, match="algo"):
        run_fed_baseline("Fed-A3C", CARTPOLE, 2, 100, 0)


# --- learning (slow) ---------------------------------------------------------------------------
@pytest.mark.slow
def test_fed_dqn_learns_cartpole():
    # measured: eval returns 110, 201, 176, 117 after 10k..40k steps (a random policy gets ~20);
    # DQN on CartPole oscillates, as the MFPO paper's Fed-DQN (234 ± 93) does
    records = run_fed_baseline("Fed-DQN", CARTPOLE, 2, 40_000, seed=0, eval_every=10_000, eval_episodes=5)
    returns = [r["eval_return"] for r in records]
    assert max(returns) > 150 and returns[-1] > 80


@pytest.mark.slow
def test_fed_sac_learns_pendulum():
    # measured: -1539, -857, -153, -259 after 3k..12k steps (a random policy gets ~ -1200)
    records = run_fed_baseline("Fed-SAC", PENDULUM, 2, 12_000, seed=0, eval_every=3_000, eval_episodes=5)
    assert records[-1]["eval_return"] > -500
