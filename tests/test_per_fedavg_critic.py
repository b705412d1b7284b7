"""Per-FedAvg-PG with the learned critic (``adaptation_baseline="critic"``, ``outer_baseline="critic"``).

The meta-gradients weight every inner and outer batch with the agents' critics and fit them only
afterwards (against a hand composition); the outer gradient with a critic fitted on the inner batch
stays unbiased for ∇J(θ̃) against exact dynamic programming on the gridworld; the adaptation step
with the critic is CriticGradient's direction; the federation keeps, federates, saves and resumes the
critics, and carries them through Flower's halves bitwise; the evaluation and ``adapt`` use them
without fitting them; refusals name their argument.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_critic_baseline import AGENTS, GAMMA, _frozen_table, _grid_batches, z_scores

from fedrl_algos import PerFedAvgPG
from fedrl_algos.common.agent_critic import CRITIC_FIELDS
from fedrl_algos.core import rollout
from fedrl_algos.core.adaptation import adaptation_gradient
from fedrl_algos.core.critic import CriticBaseline, CriticGradient, CriticState, average_critics, critic_batch_weights
from fedrl_algos.core.gpomdp import score_gradient
from fedrl_algos.per_fedavg_pg import ExactMetaGradient, FirstOrderMetaGradient
from fedrl_algos.per_fedavg_pg.debiased import DebiasedMetaGradient
from fedrl_envs import ARC_NAVIGATION, GRIDWORLD, RandomStreams, derive_keys, index_params, stack_params

GRID = "fedrl/GridWorld-v0"
ALPHA = 1.0


def _repeat(state: CriticState, times: int) -> CriticState:
    def rep(x: torch.Tensor) -> torch.Tensor:
        return x.repeat(times, *([1] * (x.dim() - 1)))

    return CriticState(rep(state.phi), type(state.moments)(*(rep(x) for x in state.moments)), rep(state.mean), rep(state.scale))


def _recording_sampler(tabular, rows: int, seed: int):
    """A sampler of the gridworld's agents ``AGENTS`` repeated to ``rows`` rows that keeps every batch it drew."""
    params = index_params(stack_params(GRIDWORLD.train_tasks), torch.tensor(AGENTS).repeat(rows // len(AGENTS)))
    streams = RandomStreams(derive_keys(seed, torch.arange(rows)))
    drawn = []

    def sample(theta, m):
        traj = rollout(GRIDWORLD, params, tabular, theta, streams, m)
        drawn.append((theta.clone(), traj))
        return traj

    return sample, drawn


# ---------------------------------------------------------------------------------------------
# the estimators


def test_the_adaptation_step_with_the_critic_is_critic_gradients_direction_and_fits_nothing(tabular):
    theta = torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.3
    critic, state = _frozen_table(tabular, theta)
    rows, traj = _grid_batches(tabular, theta, 1, 12, seed=5)
    frozen = CriticBaseline(GAMMA, critic, 1.0, 5, 0.05, state)
    step = adaptation_gradient(tabular, rows, traj, GAMMA, "critic", frozen)
    reference = CriticGradient(tabular, GAMMA, 12, critic, 1.0, 5, 0.05, state)(lambda th, m: traj, rows)
    assert torch.equal(step, reference)
    assert frozen.state is state  # the adaptation step weights, never fits
    with pytest.raises(ValueError, match="baseline='critic' needs critic"):
        adaptation_gradient(tabular, rows, traj, GAMMA, "critic")


@pytest.mark.parametrize("cls", [FirstOrderMetaGradient, ExactMetaGradient, DebiasedMetaGradient])
@pytest.mark.parametrize(("inner", "outer"), [("critic", "critic"), ("critic", "loo"), (None, "critic")])
def test_each_batch_is_weighted_before_the_critic_is_fitted_on_it(tabular, cls, inner, outer):
    """The estimate and the critics afterwards against a hand composition: ψ_in under φ_0, the fit
    on D_in (φ_1), ψ_out under φ_1, the fit on D_out (φ_2)."""
    theta = torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.3
    critic, state = _frozen_table(tabular, theta)
    epochs, lr = 3, 0.05
    critics = CriticBaseline(GAMMA, critic, 1.0, epochs, lr, state)
    m_in, m_out = 6, 5
    sizes = (m_in, 4, m_out) if cls is ExactMetaGradient else (m_in, m_out)
    estimator = cls(tabular, GAMMA, ALPHA, *sizes, inner_baseline=inner, outer_baseline=outer, critics=critics)
    assert estimator.per_agent_state
    sample, drawn = _recording_sampler(tabular, len(AGENTS), seed=7)
    direction = estimator(sample, theta)

    (_, traj_in), (adapted, traj_out) = drawn[0], drawn[1]
    expected = state
    if inner == "critic":
        psi_in, targets = critic_batch_weights(critic, expected, traj_in, GAMMA, 1.0)
        expected = critic.fit(expected, traj_in.obs, targets, traj_in.mask, epochs, lr)
        assert torch.allclose(adapted, theta + ALPHA * score_gradient(tabular, theta, traj_in, psi_in), atol=1e-12)
    g_out = None
    if outer == "critic":
        psi_out, targets = critic_batch_weights(critic, expected, traj_out, GAMMA, 1.0)
        g_out = score_gradient(tabular, adapted, traj_out, psi_out)
        expected = critic.fit(expected, traj_out.obs, targets, traj_out.mask, epochs, lr)
    for got, want in zip(critics.state, expected, strict=True):
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,), strict=True):
            assert torch.equal(a, b)
    if cls is FirstOrderMetaGradient and g_out is not None:
        assert torch.allclose(direction, g_out, atol=1e-12)


def test_the_outer_gradient_with_a_critic_fitted_on_the_inner_batch_is_unbiased(tabular, evaluator):
    """ĝ_out − ∇J(θ̃) has mean zero over many (D_in, D_out): the critic weighting D_out was fitted on
    D_in (20 Adam steps from a critic fitted on a batch of its own), never on D_out."""
    n_batches, m = 1500, 8
    theta = torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.3
    critic, state = _frozen_table(tabular, theta)
    rows = theta.repeat(n_batches, 1)
    critics = CriticBaseline(GAMMA, critic, 1.0, 20, 0.05, _repeat(state, n_batches))
    estimator = FirstOrderMetaGradient(tabular, GAMMA, ALPHA, m, m, inner_baseline="critic", outer_baseline="critic", critics=critics)
    sample, drawn = _recording_sampler(tabular, rows.shape[0], seed=11)
    g_out = estimator(sample, rows)
    adapted = drawn[1][0]
    agents = torch.tensor(AGENTS).repeat(n_batches)
    exact = evaluator.grads(adapted)[torch.arange(rows.shape[0]), agents].reshape(rows.shape)
    assert not torch.equal(critics.state.phi, _repeat(state, n_batches).phi)  # the critics did learn
    diff = (g_out - exact).reshape(n_batches, len(AGENTS), -1)
    z = z_scores(diff, torch.zeros_like(diff[0]))
    assert z.abs().max() < 4.5, float(z.abs().max())


# ---------------------------------------------------------------------------------------------
# the federation


def _model(**kwargs):
    settings = {"alpha": 2.0, "step_size": 0.3, "local_steps": 2, "m_in": 4, "m_h": 4, "m_out": 4, "adaptation_baseline": "critic",
                "outer_baseline": "critic", "critic_net_arch": [8], "n_critic_epochs": 2, "seed": 0, "device": "cpu",
                "eval_trajectories": 0}
    return PerFedAvgPG("TabularPolicy", GRID, **{**settings, **kwargs})


def _snapshot(model) -> dict[str, torch.Tensor]:
    out = {"theta": model.policy.theta.detach().clone()}
    for name in CRITIC_FIELDS:
        if name in model.__dict__:
            out[name] = getattr(model, name).clone()
    return out


def _assert_same(a, b) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


VARIANTS = [{"variant": "exact"}, {"variant": "first_order"}, {"variant": "exact", "objective": "debiased"}]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("inner", "outer"), [("critic", "critic"), ("critic", "loo"), ("loo", "critic")])
def test_the_federation_keeps_every_agents_critic(variant, inner, outer):
    model = _model(adaptation_baseline=inner, outer_baseline=outer, **variant).learn(total_rounds=2)
    assert model.uses_critic and model.agent_critic_phi.shape[0] == model.n_agents
    assert model.agent_critic_phi.std(0).max() > 0  # "local": each agent its own
    fits_per_step = (inner == "critic") + (outer == "critic")
    assert torch.equal(model.agent_critic_adam_step, torch.full((model.n_agents,), 2.0 * 2 * 2 * fits_per_step))
    plain = _model(adaptation_baseline="loo", outer_baseline="loo", **variant).learn(total_rounds=2)
    assert "agent_critic_phi" not in plain.__dict__ and plain.critic_state is None
    assert not torch.equal(model.policy.theta, plain.policy.theta)


def test_client_sampling_updates_only_the_sampled_agents_critics():
    model = _model(agents_per_round=3)
    before = model.agent_critic_adam_step.clone()
    model.learn(total_rounds=1)
    changed = model.agent_critic_adam_step != before
    assert int(changed.sum()) == 3
    assert torch.equal(model.agent_critic_phi[~changed], model.critic_network.initial_phi(0).expand(5, -1))


@pytest.mark.parametrize("kwargs", [{}, {"agents_per_round": 3}])
def test_critic_aggregation_average(kwargs):
    model = _model(critic_aggregation="average", **kwargs).learn(total_rounds=2)
    for field in CRITIC_FIELDS:
        value = getattr(model, field)
        assert torch.equal(value, value[:1].expand_as(value)), field


@pytest.mark.parametrize("kwargs", [{}, {"critic_aggregation": "average", "agents_per_round": 3}, {"control_variates": True},
                                    {"variant": "exact", "objective": "debiased"}])
def test_save_load_and_resume_bitwise(tmp_path, kwargs):
    straight = _model(**kwargs).learn(total_rounds=4)
    half = _model(**kwargs).learn(total_rounds=2)
    half.save(tmp_path / "m.zip")
    loaded = PerFedAvgPG.load(tmp_path / "m.zip", device="cpu")
    assert loaded.uses_critic and loaded.critic_net_arch == [8] and loaded.n_critic_epochs == 2
    _assert_same(_snapshot(loaded), _snapshot(half))
    resumed = loaded.learn(total_rounds=2, reset_num_timesteps=False)
    _assert_same(_snapshot(resumed), _snapshot(straight))


@pytest.mark.parametrize("aggregation", ["local", "average"])
def test_a_flower_round_continues_a_trained_critic(aggregation):
    """Round 2 by halves (Flower's messages, no Flower) equals the in-process round 2 bitwise in θ
    and every agent's critic."""
    pytest.importorskip("flwr")
    from fedrl_algos.flower import AgentWorker, protocol_for, round_by_halves

    reference = _model(critic_aggregation=aggregation).learn(total_rounds=2)
    model = _model(critic_aggregation=aggregation).learn(total_rounds=1)
    round_by_halves(protocol_for(model), [AgentWorker(copy.deepcopy(model), a) for a in range(model.n_agents)])
    _assert_same(_snapshot(model), _snapshot(reference))


def test_the_evaluation_and_adapt_use_the_critics_without_fitting_them():
    model = _model(eval_trajectories=4, eval_adapt_trajectories=6).learn(total_rounds=2)
    before = _snapshot(model)
    metrics = model.evaluate_round()
    assert "adapted_return" in metrics
    task = index_params(stack_params(GRIDWORLD.heldout_tasks), 0)
    adapted = model.adapt([0, task], n_trajectories=6, steps=2)
    assert len(adapted) == 2 and not torch.equal(adapted[0].theta, model.policy.theta)
    _assert_same(_snapshot(model), before)
    # agent 0's own critic for agent 0, the agents' averaged critic for a new task
    critics = model._adaptation_critics([2, task, 0])
    average = average_critics(model.critic_network, model.critic_state)
    for got, own, common in zip(critics.state, model.critic_state, average, strict=True):
        for g, o, c in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (got, own, common)), strict=True):
            assert torch.equal(g[0], o[0, 2]) and torch.equal(g[2], o[0, 0]) and torch.equal(g[1], c[0, 0])
    assert critics.n_epochs == 0


def test_adapt_with_the_critic_needs_a_model_that_keeps_one():
    model = _model(adaptation_baseline="loo", outer_baseline="loo")
    with pytest.raises(ValueError, match="baseline='critic' needs a model trained with the critic"):
        model.adapt(0, n_trajectories=4, baseline="critic")
    trained = _model(adaptation_baseline="loo", outer_baseline="critic").learn(total_rounds=1)
    assert len(trained.adapt([0, 1], n_trajectories=4, baseline="critic")) == 2  # any model trained with the critic


def test_the_critic_on_continuous_tasks_trains_and_adapts_a_held_out_agent():
    model = PerFedAvgPG("MlpPolicy", "fedrl/ArcNavigation-v0", local_steps=1, m_in=4, m_h=4, m_out=4, adaptation_baseline="critic",
                        outer_baseline="critic", policy_kwargs=dict(net_arch=dict(pi=[8], vf=[16])), seed=0, device="cpu",
                        eval_trajectories=0).learn(total_rounds=2)
    assert model.critic_net_arch == [16] and model.policy.net_arch == [8]
    assert torch.isfinite(model.agent_critic_phi).all() and model.agent_critic_adam_step.max() == 2 * 2 * 5
    policy = model.adapt(ARC_NAVIGATION.heldout_tasks[0], n_trajectories=4)
    assert torch.isfinite(policy.theta).all()


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"gae_lambda": 1.5}, "gae_lambda"),
    ({"n_critic_epochs": -1}, "n_critic_epochs"),
    ({"critic_learning_rate": 0.0}, "critic_learning_rate"),
    ({"critic_aggregation": "median"}, "critic_aggregation"),
    ({"critic_net_arch": [0]}, "critic_net_arch"),
    ({"critic_activation": "gelu"}, "critic_activation"),
    ({"adaptation_baseline": "critics"}, "adaptation_baseline"),
    ({"outer_baseline": "crtic"}, "outer_baseline"),
])
def test_bad_critic_settings_name_their_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        _model(**kwargs)


def test_a_vf_net_arch_without_the_critic_names_the_baselines():
    with pytest.raises(ValueError, match="adaptation_baseline='critic' or outer_baseline='critic'.*adaptation_baseline='loo'"):
        PerFedAvgPG("MlpPolicy", "fedrl/ArcNavigation-v0", policy_kwargs=dict(net_arch=dict(pi=[8], vf=[8])), device="cpu")


@pytest.mark.parametrize("cls", ["per_fedavg_pg", "fedavg_pg"])
def test_agents_whose_update_the_server_rejects_keep_their_critic_of_the_rounds_start(cls):
    """As Flower's server does with a rejected reply: an infinite step makes every update non-finite,
    the round is skipped, and no agent keeps the critic it fitted during the round."""
    from fedrl_algos import FedAvgPG
    from fedrl_algos.core.aggregation import RejectedUpdateWarning

    if cls == "per_fedavg_pg":
        model = _model(step_size=float("inf"), local_steps=1)
    else:
        model = FedAvgPG("TabularPolicy", GRID, step_size=float("inf"), local_steps=1, n_trajectories=4, baseline="critic",
                         critic_net_arch=[8], seed=0, device="cpu", eval_trajectories=0)
    before = _snapshot(model)
    with pytest.warns(RejectedUpdateWarning, match="rejected 8 update"):
        model.learn(total_rounds=1)
    _assert_same(_snapshot(model), before)


def test_adapt_with_the_critic_weights_absolute_discounted_steps_and_refuses_normalised_critics():
    from fedrl_algos import FedAvgPG

    relative = FedAvgPG("TabularPolicy", GRID, local_steps=1, n_trajectories=4, baseline="critic", discounting="relative",
                        critic_net_arch=[8], seed=0, device="cpu", eval_trajectories=0).learn(total_rounds=1)
    assert relative._adaptation_critics([0]).discounting == "absolute"  # eq. (2)'s weights, as every adapt baseline
    normalised = FedAvgPG("TabularPolicy", GRID, local_steps=1, n_trajectories=4, baseline="critic", normalize_returns=True,
                          critic_net_arch=[8], seed=0, device="cpu", eval_trajectories=0)
    with pytest.raises(ValueError, match="normalize_returns=True"):
        normalised.adapt(0, n_trajectories=4, step_size=0.1, baseline="critic")
