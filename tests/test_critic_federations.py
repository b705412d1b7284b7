"""baseline="critic" on FedAvgPG, IndependentPG and FedPGBR (MFPO's: tests/test_critic_baseline.py).

The local direction :class:`~fedrl_algos.core.critic.CriticGradient` against a loop over agents and,
with a frozen critic and λ = 1, against exact dynamic programming on the gridworld; the federated
rules for φ; save/load and resume bitwise; refused settings; a Flower round by halves.
"""

from __future__ import annotations

import pytest
import torch
from test_critic_baseline import AGENTS, GAMMA, _exact, _frozen_table, _grid_batches, _per_batch, z_scores

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG
from fedrl_algos.common.agent_critic import CRITIC_FIELDS, critic_fields
from fedrl_algos.core.critic import CriticGradient, MlpCritic, average_critics, federate_critics
from fedrl_algos.core.gpomdp import gpomdp

GRID = "fedrl/GridWorld-v0"
SETTINGS = {
    "fedavg_pg": (FedAvgPG, {"step_size": 0.5, "local_steps": 2, "n_trajectories": 4}),
    "independent_pg": (IndependentPG, {"step_size": 0.5, "local_steps": 2, "n_trajectories": 4}),
    "fedpg_br": (FedPGBR, {"step_size": 0.5, "batch_range": (4, 6), "inner_batch_size": 2, "attack": "sign_flip",
                           "byzantine_agents": [0]}),
}


def _model(name: str, **kwargs):
    cls, base = SETTINGS[name]
    return cls("TabularPolicy", GRID, **{**base, "baseline": "critic", "critic_net_arch": [8], "seed": 0, "device": "cpu",
                                         "eval_trajectories": 0, **kwargs})


def _fields(model) -> list[str]:
    return [name for owner in type(model).critic_owners for name in critic_fields(owner)]


def _snapshot(model) -> dict[str, torch.Tensor]:
    out = {"theta": model.policy.theta.detach().clone()}
    for name in (*_fields(model), "agent_theta"):
        if name in model.__dict__:
            out[name] = getattr(model, name).clone()
    return out


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# ---------------------------------------------------------------------------------------------
# the estimator: batched over agents, unbiased with a frozen critic


def _fixed(traj):
    return lambda theta, m: traj


def test_critic_gradient_batched_over_agents_equals_each_agent_alone(tabular):
    """One local step of every agent at once (direction and fitted critic) equals the step of each
    agent alone."""
    theta = torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.3
    rows, traj = _grid_batches(tabular, theta, 1, 6, seed=7)
    critic = MlpCritic(25, [8], discrete=True)
    gen = torch.Generator().manual_seed(4)
    phi = critic.initial_phi(0, torch.float64).expand(len(AGENTS), -1) + 0.1 * torch.randn(len(AGENTS), critic.n_params, generator=gen,
                                                                                        dtype=torch.float64)
    start = critic.initial_state(phi)._replace(mean=torch.tensor([0.3, -0.2], dtype=torch.float64),
                                              scale=torch.tensor([0.5, 2.0], dtype=torch.float64))
    together = CriticGradient(tabular, GAMMA, 6, critic, gae_lambda=0.9, n_epochs=3, lr=1e-2, state=start)
    direction = together(_fixed(traj), rows)
    for a in range(len(AGENTS)):
        one = type(traj)(*(x[a:a + 1] for x in traj))
        alone = CriticGradient(tabular, GAMMA, 6, critic, gae_lambda=0.9, n_epochs=3, lr=1e-2,
                               state=type(start)(start.phi[a:a + 1], type(start.moments)(*(x[a:a + 1] for x in start.moments)),
                                                 start.mean[a:a + 1], start.scale[a:a + 1]))
        assert torch.allclose(alone(_fixed(one), rows[a:a + 1])[0], direction[a], atol=1e-12)
        assert torch.allclose(alone.state.phi[0], together.state.phi[a], atol=1e-12)
        assert torch.allclose(alone.state.moments.second[0], together.state.moments.second[a], atol=1e-14)
        assert torch.equal(alone.state.mean[0], together.state.mean[a])
    assert not torch.equal(together.state.phi, start.phi)  # the call fitted the critics, after weighting the batch


def test_critic_gradient_with_a_frozen_critic_is_unbiased(tabular, evaluator):
    """λ = 1 and no fit (``n_epochs=0`` after a fit on another batch): the mean direction is the exact ∇J."""
    n_batches, m = 2000, 8
    theta = torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.3
    critic, state = _frozen_table(tabular, theta)
    rows, traj = _grid_batches(tabular, theta, n_batches, m, seed=41)
    big = type(state)(state.phi.repeat(n_batches, 1), type(state.moments)(*(x.repeat(n_batches, *([1] * (x.dim() - 1)))
                                                                            for x in state.moments)),
                      state.mean.repeat(n_batches), state.scale.repeat(n_batches))
    frozen = CriticGradient(tabular, GAMMA, m, critic, gae_lambda=1.0, n_epochs=0, state=big)
    samples = _per_batch(frozen(_fixed(traj), rows), n_batches)
    assert torch.allclose(critic.values(frozen.state, traj.obs, 3), critic.values(big, traj.obs, 3), atol=1e-12)  # V stays frozen
    z = z_scores(samples, _exact(evaluator, theta))
    assert z.abs().max() < 4.5, float(z.abs().max())
    loo = _per_batch(gpomdp(tabular, rows, traj, GAMMA, "loo"), n_batches)
    ratio = samples.var(0).sum(-1) / loo.var(0).sum(-1)
    print(f"trace cov ratio CriticGradient(frozen, λ=1)/loo per agent at m={m}: {[round(float(r), 3) for r in ratio]}")
    assert (ratio < 1.0).all()


# ---------------------------------------------------------------------------------------------
# the federated rules


def test_federate_critics_masks_and_averages_the_participants():
    critic = MlpCritic(3, [4])
    gen = torch.Generator().manual_seed(0)

    def state(shift):
        phi = torch.randn(1, 3, critic.n_params, generator=gen, dtype=torch.float64) + shift
        s = critic.initial_state(phi)
        return s._replace(mean=torch.rand(1, 3, generator=gen, dtype=torch.float64), scale=1 + torch.rand(1, 3, generator=gen, dtype=torch.float64))

    start, fitted = state(0.0), state(1.0)
    taking_part = torch.tensor([[True, False, True]])
    local = federate_critics(critic, fitted, start, "local", taking_part)
    assert torch.equal(local.phi[0, [0, 2]], fitted.phi[0, [0, 2]]) and torch.equal(local.phi[0, 1], start.phi[0, 1])
    avg = federate_critics(critic, fitted, start, "average", taking_part)
    only = average_critics(critic, type(fitted)(*(x[:, [0, 2]] if isinstance(x, torch.Tensor) else type(x)(*(y[:, [0, 2]] for y in x))
                                                  for x in fitted)))
    for a in range(3):  # every agent receives the average of the participants' critics
        assert torch.allclose(avg.phi[0, a], only.phi[0, 0], atol=1e-12)
        assert torch.allclose(avg.mean[0, a], only.mean[0, 0]) and torch.allclose(avg.scale[0, a], only.scale[0, 0])
    assert torch.equal(federate_critics(critic, fitted, start, "average", None).phi, average_critics(critic, fitted).phi)
    # all weights 0: the run keeps its critics
    kept = average_critics(critic, fitted, torch.zeros(1, 3))
    assert torch.equal(kept.phi, fitted.phi) and torch.equal(kept.mean, fitted.mean)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_federation_runs_and_keeps_every_agents_critic(name):
    model = _model(name).learn(total_rounds=2)
    assert model.agent_critic_phi.shape[0] == model.n_agents
    assert model.agent_critic_phi.std(0).max() > 0  # "local": heterogeneous agents keep their own critics
    assert model.agent_critic_adam_step.max() > 0 and torch.isfinite(model.agent_critic_phi).all()
    plain = _model(name, baseline="loo").learn(total_rounds=2)
    assert "agent_critic_phi" not in plain.__dict__
    theta = model.agent_theta if name == "independent_pg" else model.policy.theta
    assert not torch.equal(theta, plain.agent_theta if name == "independent_pg" else plain.policy.theta)
    if name == "fedpg_br":  # the server's own critic, fitted on its inner-loop batches
        assert model.server_critic_phi.shape[0] == 1 and model.server_critic_adam_step[0] > 0


@pytest.mark.parametrize(("name", "kwargs"), [("fedavg_pg", {}), ("fedavg_pg", {"agents_per_round": 3}), ("fedpg_br", {})])
def test_critic_aggregation_average(name, kwargs):
    model = _model(name, critic_aggregation="average", **kwargs).learn(total_rounds=2)
    for field in CRITIC_FIELDS:
        value = getattr(model, field)
        assert torch.equal(value, value[:1].expand_as(value)), field


def test_client_sampling_updates_only_the_sampled_agents_critics():
    model = _model("fedavg_pg", agents_per_round=3)
    before = model.agent_critic_adam_step.clone()
    model.learn(total_rounds=1)
    changed = model.agent_critic_adam_step != before
    assert int(changed.sum()) == 3  # the 5 others were computed (streams advance) but keep their critics
    assert torch.equal(model.agent_critic_phi[~changed], model.critic_network.initial_phi(0).expand(5, -1))


# ---------------------------------------------------------------------------------------------
# save, load, resume


@pytest.mark.parametrize(("name", "kwargs"), [("fedavg_pg", {}), ("fedavg_pg", {"critic_aggregation": "average", "agents_per_round": 3}),
                                              ("independent_pg", {}), ("fedpg_br", {}), ("fedpg_br", {"critic_aggregation": "average"})])
def test_save_load_and_resume_bitwise(tmp_path, name, kwargs):
    straight = _model(name, **kwargs).learn(total_rounds=4)
    half = _model(name, **kwargs).learn(total_rounds=2)
    half.save(tmp_path / "m.zip")
    cls = SETTINGS[name][0]
    loaded = cls.load(tmp_path / "m.zip", device="cpu")
    assert loaded.baseline == "critic" and loaded.critic_net_arch == [8]
    assert loaded.critic_aggregation == kwargs.get("critic_aggregation", "local")
    _assert_same(_snapshot(loaded), _snapshot(half))
    resumed = loaded.learn(total_rounds=2, reset_num_timesteps=False)
    _assert_same(_snapshot(resumed), _snapshot(straight))


def test_files_without_the_critic_keep_their_fields(tmp_path):
    model = _model("fedavg_pg", baseline="loo").learn(total_rounds=1)
    model.save(tmp_path / "plain.zip")
    loaded = FedAvgPG.load(tmp_path / "plain.zip", device="cpu")
    assert loaded.baseline == "loo" and "agent_critic_phi" not in loaded.__dict__ and loaded.critic_state is None


# ---------------------------------------------------------------------------------------------
# refused settings


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"gae_lambda": -0.1}, "gae_lambda"),
    ({"n_critic_epochs": 1.5}, "n_critic_epochs"),
    ({"critic_learning_rate": -1.0}, "critic_learning_rate"),
    ({"critic_aggregation": "median"}, "critic_aggregation"),
    ({"critic_net_arch": [0]}, "critic_net_arch"),
    ({"critic_activation": "gelu"}, "critic_activation"),
])
def test_bad_critic_settings_name_their_argument(name, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        _model(name, **kwargs)


@pytest.mark.parametrize("name", ["fedavg_pg", "fedpg_br"])
def test_the_critic_needs_gpomdp(name):
    with pytest.raises(ValueError, match="baseline='critic' needs estimator='gpomdp'"):
        _model(name, estimator="reinforce")


def test_independent_pg_has_no_server_to_average_critics():
    with pytest.raises(ValueError, match="critic_aggregation must be one of \\('local',\\) for IndependentPG"):
        _model("independent_pg", critic_aggregation="average")


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_flower_round_continues_a_trained_critic(name):
    """A model trained one round in one process continues by halves (Flower's messages, no Flower):
    its saved critics travel to the agents and back, and the second round equals the in-process one
    bitwise in θ and every critic field."""
    pytest.importorskip("flwr")
    import copy

    from fedrl_algos.flower import AgentWorker, protocol_for, round_by_halves

    reference = _model(name).learn(total_rounds=2)
    model = _model(name).learn(total_rounds=1)
    round_by_halves(protocol_for(model), [AgentWorker(copy.deepcopy(model), a) for a in range(model.n_agents)])
    _assert_same(_snapshot(model), _snapshot(reference))


@pytest.mark.parametrize("cls", [MFPO, FedAvgPG, IndependentPG, FedPGBR])
def test_sb3_net_arch_dict_sizes_the_policy_and_the_critic(cls, tmp_path):
    """SB3's ``policy_kwargs=dict(net_arch=dict(pi=..., vf=...))``: pi is the policy's, vf the critic's."""
    kwargs = dict(baseline="critic", seed=0, device="cpu")
    model = cls("MlpPolicy", "fedrl/CartPole-v0", policy_kwargs=dict(net_arch=dict(pi=[16], vf=[32, 8])), **kwargs)
    assert model.policy.net_arch == [16] and model.critic_net_arch == [32, 8] and model.critic_network.sizes == [4, 32, 8, 1]
    assert model.policy_kwargs == {"net_arch": [16]}  # the saved policy_kwargs are the policy's own
    model.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip", device="cpu")
    assert loaded.critic_net_arch == [32, 8] and torch.equal(loaded.agent_critic_phi, model.agent_critic_phi)
    with pytest.raises(ValueError, match="needs baseline='critic'"):
        cls("MlpPolicy", "fedrl/CartPole-v0", policy_kwargs=dict(net_arch=dict(vf=[8])), seed=0, device="cpu")
    with pytest.raises(ValueError, match="'pi'.*'vf'.*\\['qf'\\]"):
        cls("MlpPolicy", "fedrl/CartPole-v0", policy_kwargs=dict(net_arch=dict(pi=[8], qf=[3])), **kwargs)
    with pytest.raises(ValueError, match="both size the critic"):
        cls("MlpPolicy", "fedrl/CartPole-v0", critic_net_arch=[4], policy_kwargs=dict(net_arch=dict(vf=[8])), **kwargs)
    with pytest.raises(ValueError, match="critic_net_arch"):
        cls("MlpPolicy", "fedrl/CartPole-v0", policy_kwargs=dict(net_arch=dict(vf=["big"])), **kwargs)
    same = cls("MlpPolicy", "fedrl/CartPole-v0", critic_net_arch=[8], policy_kwargs=dict(net_arch=dict(vf=[8])), **kwargs)
    assert same.critic_net_arch == [8]
