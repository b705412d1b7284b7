"""``fedrl reproduce mfpo --env halfcheetah|hopper|pong|breakout``: the MFPO paper's other four rows
of Table I run every policy-gradient method on heterogeneous Gymnasium agents (MuJoCo mass scales
0.75–1.25; Atari difficulties), sampled through the federated env, all seeds in one env."""

from __future__ import annotations

import math

import pytest
import torch

from fedrl_algos.policies import MlpPolicy
from fedrl_algos.reproduce import EXPERIMENTS
from fedrl_algos.reproduce.mfpo import GENERIC_ENVS, MethodConfig, Population, generic_agent_kwargs, paper_methods

pytest.importorskip("mujoco")


def _run(env: str) -> list[dict]:
    experiment = EXPERIMENTS["mfpo"]
    config = experiment.config(quick=True, env=env, sweeps=False, sb3_baselines=False)
    assert config.methods.squash == "tanh" and config.methods.horizon == 15
    return experiment.run(config, seeds=2, device="cpu", progress=False).records


@pytest.mark.parametrize("env", ["halfcheetah", "hopper"])
def test_mujoco_rows_run_every_method(env):
    records = _run(env)
    methods = {r["method"] for r in records}
    assert methods == {"MFPO", "FedAvg-PG", "FedPG-BR"}
    assert all(math.isfinite(r["return"]) for r in records)
    assert {r["seed"] for r in records} == {0, 1} and max(r["round"] for r in records) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("env", ["pong", "breakout"])
def test_atari_rows_run_every_method_with_the_nature_cnn(env):
    pytest.importorskip("ale_py")
    records = _run(env)
    assert {r["method"] for r in records} == {"MFPO", "FedAvg-PG", "FedPG-BR"}
    assert all(math.isfinite(r["return"]) for r in records)


def test_paper_settings_of_the_gymnasium_rows():
    """Section VI-A3: 256-unit ReLU layers, tanh-Gaussian outputs and K = 20 outside classic control."""
    cfg = paper_methods("hopper", MethodConfig())
    assert (cfg.net_arch, cfg.activation, cfg.squash, cfg.local_steps, cfg.n_trajectories) == ((256, 256), "relu", "tanh", 20, 20)
    assert cfg.init_gains == (math.sqrt(2.0), 0.01)  # SB3's orthogonal initialization: the actions start unsaturated
    assert paper_methods("cartpole", MethodConfig()) == MethodConfig()  # classic control keeps its settings
    custom = MethodConfig(local_steps=3)
    assert paper_methods("hopper", custom) is custom  # a user's settings are kept
    kwargs = generic_agent_kwargs("halfcheetah", 5)
    assert [kw["wrappers"][0].mass_scale for kw in kwargs] == [0.75, 0.875, 1.0, 1.125, 1.25]
    assert set(GENERIC_ENVS) == {"halfcheetah", "hopper", "pong", "breakout"}


def test_a_seed_alone_equals_the_same_seed_batched():
    cfg = EXPERIMENTS["mfpo"].config(quick=True, env="hopper").methods
    both = Population("hopper", [0, 1], 3, cfg)
    one = Population("hopper", [1], 3, cfg)
    theta = both.initial_theta()
    a = both.federation.sampler(both.federation.broadcast(theta), 2)
    b = one.federation.sampler(one.federation.broadcast(theta[1:]), 2)
    for x, y in zip(a, b):
        assert torch.equal(x[1], y[0])


def test_the_mujoco_rows_initial_policy_does_not_saturate_its_actions():
    """With the classic-control initialization (N(0, 0.5²) hidden weights) a 256-unit network's
    pre-squash means are ~15 on Hopper's states: every action at the bounds, every hopper falling."""
    pop = Population("hopper", [0], 2, paper_methods("hopper", MethodConfig()))
    theta = pop.initial_theta()
    traj = pop.federation.eval_sampler(pop.federation.broadcast(theta), 2)
    obs = traj.obs[traj.mask > 0].float()
    assert float(pop.policy.head(theta[0].float(), obs).abs().max()) < 0.1
    custom = Population("hopper", [0], 1, MethodConfig(net_arch=(8,), init_std=(0.3, 0.02), log_std_init=-0.5)).policy
    assert custom.init_std == [0.3, 0.02] and custom.log_std_init == -0.5 and custom.init_gains is None
    wide = MlpPolicy(pop.policy.observation_space, pop.policy.action_space, net_arch=(256, 256), activation="relu", squash="tanh")
    assert float(wide.head(wide.theta.detach(), obs).abs().median()) > 3.0


def test_a_rows_env_holds_a_steps_batch_of_episodes_per_agent():
    """``n_envs=None``: D environments per agent (at most 20) and the evaluation episodes on the
    evaluation env, so that no pass steps environments whose episodes a call drops; an explicit
    ``n_envs`` is kept."""
    pop = Population("hopper", [0], 2, MethodConfig(n_trajectories=4, eval_trajectories=5, horizon=15))
    assert pop.env_obj.n_envs == 4 and pop.federation.eval_sampler.env.n_envs == 5
    wide = Population("hopper", [0], 2, MethodConfig(n_trajectories=50, eval_trajectories=30, horizon=15))
    assert wide.env_obj.n_envs == 17 and wide.federation.eval_sampler.env.n_envs == 15  # 3 and 2 passes
    fixed = Population("hopper", [0], 2, MethodConfig(n_trajectories=4, eval_trajectories=5, horizon=15, n_envs=20))
    assert fixed.env_obj.n_envs == 20 and fixed.federation.eval_sampler.env.n_envs == 5
    for p in (pop, wide, fixed):
        p.env_obj.close()
        p.federation.eval_sampler.env.close()
