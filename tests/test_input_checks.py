"""Bad input found by a new user's first hour (issue 36) is refused before any work, naming the argument.

Each case: the error type, the argument's name and what was expected (and the fix, where one exists),
and nothing changed by the refused call.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_algos import MFPO, PerFedAvgPG
from fedrl_algos.cli import main
from fedrl_wrappers import FederatedVecEnv

GRID = "fedrl/GridWorld-v0"


@pytest.mark.parametrize("seed", [2**63, -1])
def test_a_seed_out_of_int64_range_is_refused(seed):
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63\)"):
        PerFedAvgPG("TabularPolicy", GRID, seed=seed, device="cpu")
    assert PerFedAvgPG("TabularPolicy", GRID, seed=2**63 - 1, device="cpu").seed == 2**63 - 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_loading_onto_a_missing_device_is_refused(tmp_path):
    PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu").save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match="CUDA is not available"):
        PerFedAvgPG.load(tmp_path / "m.zip", device="cuda")


def test_a_bad_callback_is_refused_before_a_round_runs():
    model = PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu")
    theta, steps = model.theta.clone(), model.num_timesteps
    for bad, match in ((42, "callback must be an SB3 BaseCallback"), ([lambda _l, _g: True], "BaseCallback objects only")):
        with pytest.raises(TypeError, match=match):
            model.learn(total_rounds=1, callback=bad)
    assert torch.equal(model.theta, theta) and model.num_timesteps == steps and model.rounds_done == 0
    model.learn(total_rounds=1, callback=lambda _locals, _globals: True)  # a function alone is one (SB3's ConvertCallback)
    assert model.rounds_done == 1


def test_predict_refuses_non_finite_observations():
    model = MFPO("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu")
    with pytest.raises(ValueError, match="observation must be finite"):
        model.predict(np.array([np.nan, 0.0, 0.0, 0.0], dtype=np.float32))
    with pytest.raises(ValueError, match="observation must be finite"):
        model.predict(torch.tensor([[0.0, np.inf, 0.0, 0.0]]))
    action, _ = model.predict(np.zeros(4, dtype=np.float32))
    assert action in (0, 1)


@pytest.mark.parametrize("net_arch", ["big", [64, 0], [32.5], (True,)])
def test_net_arch_is_named_with_what_it_expects(net_arch):
    with pytest.raises(ValueError, match=r"net_arch must be a list of hidden layer sizes \(positive ints"):
        MFPO("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu", policy_kwargs={"net_arch": net_arch})


def test_module_colon_env_ids_are_taken_as_gym_make_takes_them():
    model = MFPO("MlpPolicy", "gymnasium.envs.classic_control:CartPole-v1", n_agents=2, seed=0, device="cpu", eval_trajectories=0)
    assert model.env_id == "CartPole-v1"
    assert FederatedVecEnv("gymnasium.envs.classic_control:Pendulum-v1", 1, agent_kwargs=[{}]).env_id == "Pendulum-v1"
    with pytest.raises(ValueError, match="its module 'no_such_module' cannot be imported"):
        MFPO("MlpPolicy", "no_such_module:Env-v0", n_agents=2, device="cpu")


class _DictObs(gym.Env):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"x": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"x": np.zeros(2, np.float32)}, 0.0, False, False, {}


def test_a_dict_observation_space_points_to_flatten_observation():
    if "fedrl_test/DictObs-v0" not in gym.registry:
        gym.register("fedrl_test/DictObs-v0", entry_point=_DictObs, max_episode_steps=5)
    with pytest.raises(TypeError, match="FlattenObservation"):
        FederatedVecEnv("fedrl_test/DictObs-v0", 1, agent_kwargs=[{}])
    flat = FederatedVecEnv("fedrl_test/DictObs-v0", 1, agent_kwargs=[{"wrappers": [gym.wrappers.FlattenObservation]}])
    assert flat.single_observation_space.shape == (2,)  # the fix the message names works


def test_the_flower_command_reports_bad_input_without_a_traceback(tmp_path, capsys):
    pytest.importorskip("flwr")
    with pytest.raises(SystemExit, match="fedrl flower simulate: error: env must be a registered fedrl family or Gymnasium id"):
        main(["flower", "simulate", "--algo", "mfpo", "--env", "Foo-v0", "--rounds", "1"])
    with pytest.raises(SystemExit, match="fedrl flower simulate: error: .*no model file"):
        main(["flower", "simulate", "--model", str(tmp_path / "missing.zip"), "--rounds", "1"])


@pytest.mark.parametrize("cls", ["MFPO", "FedPGBR"])
@pytest.mark.parametrize(("bad", "error"), [(True, TypeError), ("2", TypeError), (0.5, ValueError), (float("nan"), ValueError)])
def test_max_importance_weight_is_a_number_at_least_one(cls, bad, error):
    """One check for both importance-weighted federations (FedPG-BR let ``True`` through as a cap of 1)."""
    import fedrl_algos

    algo = getattr(fedrl_algos, cls)
    with pytest.raises(error, match="max_importance_weight must be a number >= 1 or None"):
        algo("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu", max_importance_weight=bad)
    assert algo("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu", max_importance_weight=3).max_importance_weight == 3.0


@pytest.mark.parametrize(("cls", "flag"), [("MFPO", "normalize_advantage"), ("MFPO", "normalize_observations"),
                                         ("MFPO", "normalize_returns"), ("MFPO", "self_normalize_weights"),
                                         ("FedPGBR", "use_filter"), ("FedPGBR", "normalize_returns")])
@pytest.mark.parametrize("bad", [1, "yes", None])
def test_flags_take_bools_only(cls, flag, bad):
    """A flag is never read from a truthy value (``use_filter="no"`` used to switch FedPG-BR's filter on)."""
    import fedrl_algos

    algo = getattr(fedrl_algos, cls)
    with pytest.raises(TypeError, match=f"{flag} must be a bool, got {bad!r}"):
        algo("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu", **{flag: bad})
    assert getattr(algo("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu", **{flag: np.bool_(True)}), flag) is True


def _cartpole(cls_name="FedAvgPG", **kwargs):
    import fedrl_algos

    return getattr(fedrl_algos, cls_name)("MlpPolicy", "fedrl/CartPole-v0", seed=0, device="cpu", **kwargs)


@pytest.mark.parametrize("bad", [0.9, "3", True])
def test_init_seed_is_an_int(bad):
    """A float seed of the initialization used to be truncated (0.9 -> 0) and a string parsed."""
    from fedrl_algos.policies import MlpPolicy

    env = gym.make("fedrl/CartPole-v0")
    with pytest.raises(TypeError, match="init_seed must be an int"):
        MlpPolicy(env.observation_space, env.action_space, init_seed=bad)
    with pytest.raises(ValueError, match=r"policy_kwargs .* do not fit MlpPolicy: init_seed must be an int"):
        _cartpole(policy_kwargs=dict(init_seed=bad))
    assert _cartpole(policy_kwargs=dict(init_seed=np.int64(3))).policy.init_seed == 3


@pytest.mark.parametrize("cls_name", ["FedAvgPG", "FedPGBR"])
@pytest.mark.parametrize(("bad", "match"), [(5, "byzantine_agents must be a list of agent indices"),
                                            ("1", "byzantine_agents must be a list of agent indices"),
                                            ([1.7], r"byzantine_agents\[\] must be an int"),
                                            ([True], r"byzantine_agents\[\] must be an int")])
def test_byzantine_agents_are_agent_indices(cls_name, bad, match):
    """FedPG-BR used to turn [1.7], [True] and ['1'] into agent 1."""
    with pytest.raises(TypeError, match=match):
        _cartpole(cls_name, attack="sign_flip", byzantine_agents=bad)
    model = _cartpole(cls_name, attack="sign_flip", byzantine_agents=np.array([1, 3]))
    assert model.byzantine_agents == [1, 3]


def test_adapt_seed_is_checked():
    """adapt(seed=1.7) used to equal seed=1, and a string failed inside torch."""
    model = PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu")
    for bad in (1.7, "3", True):
        with pytest.raises(TypeError, match="seed must be an int"):
            model.adapt(0, n_trajectories=2, seed=bad)
    assert model.adapt(0, n_trajectories=2, seed=np.int64(1)) is not None


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(policy_kwargs=[1]), TypeError, "policy_kwargs must be a dict"),
    (dict(policy_kwargs="abc"), TypeError, "policy_kwargs must be a dict"),
    (dict(tensorboard_log=5), TypeError, "tensorboard_log must be a directory path"),
    (dict(verbose=1.5), TypeError, "verbose must be an int"),
    (dict(verbose=-1), ValueError, "verbose"),
    (dict(policy_kwargs=dict(dtype=torch.int64)), ValueError, "do not fit MlpPolicy: dtype must be a floating torch dtype"),
    (dict(policy_kwargs=dict(dtype="float64")), ValueError, "do not fit MlpPolicy: dtype must be a floating torch dtype"),
])
def test_constructor_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        _cartpole(**kwargs)


def test_learn_and_predict_flags_are_bools():
    """progress_bar="no" used to show the bar, deterministic="no" to act deterministically."""
    model = _cartpole()
    theta = model.theta.clone()
    for kwargs in (dict(progress_bar="no"), dict(reset_num_timesteps="no")):
        with pytest.raises(TypeError, match=f"{next(iter(kwargs))} must be a bool"):
            model.learn(total_rounds=1, **kwargs)
    assert torch.equal(model.theta, theta) and model.rounds_done == 0
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        model.predict(np.zeros(4, dtype=np.float32), deterministic="no")
    with pytest.raises(TypeError, match="monitor must be a bool"):
        FederatedVecEnv("fedrl/CartPole-v0", 2, seed=0).to_sb3(0, monitor="no")


def test_fedavg_sb3_algorithm_kwargs_is_a_dict():
    from stable_baselines3 import PPO

    from fedrl_algos import FedAvgSB3

    with pytest.raises(TypeError, match="algorithm_kwargs must be a dict"):
        FedAvgSB3(PPO, "fedrl/CartPole-v0", n_agents=2, algorithm_kwargs="abc", seed=0, device="cpu")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(sigma=float("inf")), ValueError, "sigma must be a finite number > 0"),  # used to switch the filter off
    (dict(sigma="2"), ValueError, "sigma must be a finite number > 0, 'auto' or 'auto_bound'"),
    (dict(sigma=True), TypeError, "sigma must be a real number"),
    (dict(max_byzantine_fraction=False), TypeError, "max_byzantine_fraction must be a real number"),
    (dict(delta="0.5"), TypeError, "delta must be a real number"),
    (dict(delta=float("nan")), ValueError, r"delta must be a finite number in \(0, 1\)"),
])
def test_fedpg_br_filter_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        _cartpole("FedPGBR", **kwargs)
    model = _cartpole("FedPGBR", sigma=np.float32(2.0), delta=np.float32(0.5), max_byzantine_fraction=np.float64(0.2))
    assert (model.sigma, model.delta, model.max_byzantine_fraction) == (2.0, 0.5, pytest.approx(0.2))


@pytest.mark.parametrize(("policy_kwargs", "error", "match"), [
    (dict(init_std=float("nan")), ValueError, "init_std must be a finite number >= 0"),  # used to make most weights NaN
    (dict(init_std="05"), TypeError, "init_std must be a number >= 0 or one per weight layer"),  # used to read [0.0, 5.0]
    (dict(init_std=(0.5, float("inf"))), ValueError, r"init_std\[1\] must be a finite number"),
    (dict(init_std=None), TypeError, "init_std must be"),
    (dict(log_std_init=float("nan")), ValueError, "log_std_init must be a finite number"),
])
def test_mlp_initialization_is_checked(policy_kwargs, error, match):
    from fedrl_algos.policies import MlpPolicy

    env = gym.make("fedrl/Pendulum-v0")
    with pytest.raises(error, match=match):
        MlpPolicy(env.observation_space, env.action_space, **policy_kwargs)
    policy = MlpPolicy(env.observation_space, env.action_space, net_arch=(8, 8), init_std=np.array([0.5, 0.1]),
                       log_std_init=np.float32(-1))
    assert policy.init_std == [0.5, 0.5, 0.1] and policy.log_std_init == -1.0


@pytest.mark.parametrize(("gamma", "error"), [("0.9", TypeError), (True, TypeError), (1.5, ValueError), (float("nan"), ValueError)])
def test_gamma_is_a_number_in_unit_interval(gamma, error):
    with pytest.raises(error, match="gamma must be a"):
        _cartpole(gamma=gamma)
    assert _cartpole(gamma=np.float32(0.5)).gamma == 0.5


def test_save_and_structured_name_what_they_take(tmp_path):
    model = PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu")
    with pytest.raises(TypeError, match="path must be a file path"):
        model.save(5)
    model.save(tmp_path / "m")  # a path without suffix gets .zip, as SB3
    assert (tmp_path / "m.zip").is_file()
    venv = FederatedVecEnv(GRID, 2, seed=0)
    with pytest.raises(TypeError, match="batch must be a torch tensor or NumPy array"):
        venv.structured([1, 2])
    with pytest.raises(ValueError, match="batch must have num_envs"):
        venv.structured(np.array(1.0))
    assert venv.structured(np.arange(venv.num_envs)).shape == (venv.n_agents, venv.n_envs)
