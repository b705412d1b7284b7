"""Client sampling that computes only the sampled agents, and SCAFFOLD's control variates."""

from __future__ import annotations

import pytest
import torch

from fedrl_algos import FedAvgPG, PerFedAvgPG
from fedrl_algos.core import PolicyGradient, local_update
from fedrl_algos.core.aggregation import aggregate_valid
from fedrl_algos.core.control_variates import ControlVariates, CorrectedDirection
from fedrl_algos.core.federation import Federation
from fedrl_algos.per_fedavg_pg import ExactMetaGradient, FirstOrderMetaGradient
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import GRIDWORLD, stack_params

GRID = "fedrl/GridWorld-v0"
TASKS = GRIDWORLD.train_tasks
PARAMS = stack_params(TASKS)


def _policy(dtype=torch.float64) -> TabularPolicy:
    return TabularPolicy(GRIDWORLD.observation_space(TASKS[0]), GRIDWORLD.action_space(TASKS[0]), dtype=dtype)


def _estimators(policy):
    return [ExactMetaGradient(policy, 0.9, 2.0, 4, 4, 4), FirstOrderMetaGradient(policy, 0.9, 2.0, 4, 4), PolicyGradient(policy, 0.9, 6)]


def _theta(runs: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(runs, 100, generator=torch.Generator().manual_seed(5)).to(dtype)


# --- the subset computation -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("which", [0, 1, 2], ids=["exact", "first_order", "pg"])
def test_selected_agents_compute_bitwise_the_rows_of_a_full_computation(dtype, which):
    policy = _policy(dtype)
    estimator = _estimators(policy)[which]
    full = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([3, 4]))
    part = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([3, 4]))
    theta = _theta(2, dtype)
    every = local_update(estimator, full.sampler, full.broadcast(theta), 0.3, 2)
    agents = torch.tensor([[1, 5], [0, 7]])
    chosen = part.select(agents)
    some = local_update(estimator, chosen.sampler, chosen.broadcast(theta), 0.3, 2)
    assert some.shape == (2, 2, 100)
    assert torch.equal(some, chosen.gather(every))
    before = part.streams.counters.clone()
    chosen.write_back()
    # the sampled agents' streams are where the full computation left them; the others did not move
    assert torch.equal(part.streams.counters.gather(1, agents), full.streams.counters.gather(1, agents))
    untouched = torch.ones(2, 8, dtype=torch.bool).scatter_(1, agents, False)
    assert torch.equal(part.streams.counters[untouched], before[untouched]) and int(before.sum()) == 0
    assert bool((part.streams.counters.gather(1, agents) > 0).all())


def test_a_selection_at_later_counters_matches_a_full_computation_at_the_same_counters():
    policy = _policy()
    estimator = _estimators(policy)[1]
    part = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([9]))
    theta = _theta(1)
    for agents in ([[2, 6]], [[0, 2]]):  # agent 2 in both rounds: its stream moves on
        chosen = part.select(torch.tensor(agents))
        local_update(estimator, chosen.sampler, chosen.broadcast(theta), 0.3, 1)
        chosen.write_back()
    before = part.streams.counters.clone()
    assert before[0, 2] == 2 * before[0, 6] and before[0, 3] == 0
    chosen = part.select(torch.tensor([[2, 3]]))
    some = local_update(estimator, chosen.sampler, chosen.broadcast(theta), 0.3, 1)
    full = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([9]))
    full.streams.counters = before
    every = local_update(estimator, full.sampler, full.broadcast(theta), 0.3, 1)
    assert torch.equal(some, every[:, [2, 3]])


def test_the_first_partial_round_equals_the_previous_masked_round_bitwise():
    # Same participation draw, same (fresh) streams: only the unsampled agents' work is gone.
    policy = _policy()
    estimator = _estimators(policy)[0]
    theta = _theta(3)
    new = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([0, 1, 2]))
    masked = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([0, 1, 2]))
    result, mask = per_fedavg_pg_round(new, theta, estimator, 0.3, 2, agents_per_round=2)
    old_mask = masked.participation(2)
    old_local = local_update(estimator, masked.sampler, masked.broadcast(theta), 0.3, 2)
    old, _ = aggregate_valid(old_local, theta, old_mask)
    assert torch.equal(mask, old_mask) and torch.equal(mask.sum(-1), torch.full((3,), 2.0))
    assert torch.equal(result, old)
    # and the masked path advanced every stream, the new one only the sampled agents'
    assert torch.equal(new.streams.counters, masked.streams.counters * mask.to(torch.int64))


def test_round_work_scales_with_the_sampled_agents():
    policy = _policy(torch.float32)
    estimator = _estimators(policy)[0]
    drawn = {}
    for r in (None, 2, 4):
        fed = Federation(GRIDWORLD, PARAMS, policy, torch.arange(4))
        per_fedavg_pg_round(fed, _theta(4, torch.float32), estimator, 0.3, 2, agents_per_round=r)
        drawn[r] = int(fed.streams.counters.sum())  # random words drawn: one per sampled step
    assert drawn[2] * 4 == drawn[None] and drawn[4] * 2 == drawn[None]


def test_attacked_estimator_keeps_the_masked_path():
    model = FedAvgPG("TabularPolicy", GRID, n_trajectories=3, local_steps=1, agents_per_round=2, attack="sign_flip",
                     byzantine_agents=[0], seed=0, device="cpu")
    assert model.estimator.per_agent_state
    model.learn(total_rounds=1)
    assert bool((model.federation.streams.counters > 0).all())  # every agent was computed
    plain = FedAvgPG("TabularPolicy", GRID, n_trajectories=3, local_steps=1, agents_per_round=2, seed=0, device="cpu")
    plain.learn(total_rounds=1)
    assert int((plain.federation.streams.counters > 0).sum()) == 2


@pytest.mark.parametrize("agents, error, match", [
    (torch.tensor([[0, 1]]), ValueError, "shape"),
    (torch.tensor([[0, 8], [1, 2]]), ValueError, r"\[0, 7\]"),
    (torch.tensor([[-1, 2], [1, 2]]), ValueError, r"\[0, 7\]"),
    (torch.tensor([[3, 3], [1, 2]]), ValueError, "distinct"),
    (torch.tensor([[0.0, 1.0], [1.0, 2.0]]), TypeError, "integer"),
    ([[0, 1], [1, 2]], TypeError, "integer"),
    (torch.zeros(2, 0, dtype=torch.int64), ValueError, "r >= 1"),
])
def test_select_rejects_bad_agent_indices(agents, error, match):
    fed = Federation(GRIDWORLD, PARAMS, _policy(), torch.tensor([0, 1]))
    with pytest.raises(error, match=match):
        fed.select(agents)


# --- control variates -------------------------------------------------------------------------------
def test_control_variates_at_zero_with_one_local_step_are_the_plain_update():
    policy = _policy()
    estimator = _estimators(policy)[0]
    theta = _theta(2)
    plain = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([4, 5]))
    scaffold = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([4, 5]))
    control = ControlVariates.zeros(2, 8, 100, torch.float64)
    expected, mask = per_fedavg_pg_round(plain, theta, estimator, 0.3, 1, agents_per_round=3)
    got, mask2 = per_fedavg_pg_round(scaffold, theta, estimator, 0.3, 1, agents_per_round=3, control=control)
    assert torch.equal(got, expected) and torch.equal(mask, mask2)
    # option II from zero: c_i = (y_i − x)/β = the agent's own direction; c = (1/n) Σ_{i ∈ S} c_i
    replay = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([4, 5]))
    direction = estimator(replay.sampler, replay.broadcast(theta))
    chosen = mask.bool()
    assert torch.allclose(control.agents[chosen], direction[chosen], rtol=0, atol=1e-12)
    assert torch.equal(control.agents[~chosen], torch.zeros_like(control.agents[~chosen]))
    assert torch.allclose(control.server, control.agents.sum(1) / 8, rtol=0, atol=1e-15)


def test_corrected_local_steps_follow_the_scaffold_equations():
    policy = _policy()
    estimator = _estimators(policy)[1]
    theta = _theta(1)
    generator = torch.Generator().manual_seed(1)
    agents_c = torch.randn(1, 8, 100, generator=generator, dtype=torch.float64)
    control = ControlVariates(agents_c.mean(1), agents_c.clone())
    fed = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([7]))
    beta, tau = 0.25, 3
    new, mask = per_fedavg_pg_round(fed, theta, estimator, beta, tau, agents_per_round=2, control=control)
    # by hand, on the same two agents from fresh streams
    replay = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([7]))
    agents = replay.sample_agents(2)
    chosen = replay.select(agents)
    correction = chosen.gather(agents_c.mean(1).unsqueeze(1) - agents_c)
    y = chosen.broadcast(theta)
    for _ in range(tau):
        y = y + beta * (estimator(chosen.sampler, y) + correction)
    assert torch.equal(new, y.mean(1))
    c_i = chosen.gather(agents_c) - agents_c.mean(1).unsqueeze(1) + (y - theta.unsqueeze(1)) / (beta * tau)
    assert torch.allclose(chosen.gather(control.agents), c_i, rtol=0, atol=1e-12)
    others = ~mask.bool()
    assert torch.equal(control.agents[others], agents_c[others])
    # c started as the mean of the c_i and stays it
    assert torch.allclose(control.server, control.agents.mean(1), rtol=0, atol=1e-12)


def test_control_variate_round_checks_its_inputs():
    policy = _policy()
    fed = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([0]))
    estimator = _estimators(policy)[2]
    with pytest.raises(ValueError, match="shapes"):
        per_fedavg_pg_round(fed, _theta(1), estimator, 0.3, 1, control=ControlVariates.zeros(1, 7, 100, torch.float64))
    with pytest.raises(ValueError, match="dtype"):
        per_fedavg_pg_round(fed, _theta(1), estimator, 0.3, 1, control=ControlVariates.zeros(1, 8, 100, torch.float32))
    with pytest.raises(ValueError, match="step_size"):
        per_fedavg_pg_round(fed, _theta(1), estimator, 0.0, 1, control=ControlVariates.zeros(1, 8, 100, torch.float64))


def test_corrected_direction_adds_the_correction():
    policy = _policy()
    fed = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([0]))
    again = Federation(GRIDWORLD, PARAMS, policy, torch.tensor([0]))
    estimator = _estimators(policy)[2]
    shift = torch.randn(1, 8, 100, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    corrected = CorrectedDirection(estimator, shift)
    assert corrected.trajectories_per_step == estimator.trajectories_per_step and corrected.name == estimator.name
    assert torch.equal(corrected(fed.sampler, fed.broadcast(_theta(1))), estimator(again.sampler, again.broadcast(_theta(1))) + shift)


# --- the algorithm shells -------------------------------------------------------------------------
def _model(cls, **kwargs):
    if cls is PerFedAvgPG:
        base = dict(alpha=2.0, step_size=0.3, local_steps=2, m_in=3, m_h=3, m_out=3, variant="exact")
    else:
        base = dict(alpha=2.0, step_size=0.3, local_steps=2, n_trajectories=6)
    base.update(kwargs)
    return cls("TabularPolicy", GRID, seed=3, device="cpu", **base)


@pytest.mark.parametrize("cls", [PerFedAvgPG, FedAvgPG])
def test_control_variates_are_saved_loaded_and_resume_bitwise(cls, tmp_path):
    model = _model(cls, agents_per_round=2, control_variates=True).learn(total_rounds=2)
    assert model.control_agents.shape == (1, 8, 100) and model.control_server.shape == (1, 100)
    assert int((model.control_agents.abs().sum(-1) > 0).sum()) >= 2
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = cls.load(path, device="cpu")
    assert loaded.control_variates is True
    assert torch.equal(loaded.control_agents, model.control_agents) and torch.equal(loaded.control_server, model.control_server)
    model.learn(total_rounds=2, reset_num_timesteps=False)
    loaded.learn(total_rounds=2, reset_num_timesteps=False)
    assert torch.equal(loaded.theta, model.theta) and torch.equal(loaded.control_agents, model.control_agents)
    plain = _model(cls, agents_per_round=2)
    plain.save(tmp_path / "plain.zip")
    assert cls.load(tmp_path / "plain.zip", device="cpu").control_agents is None


@pytest.mark.parametrize("cls", [PerFedAvgPG, FedAvgPG])
def test_same_seed_twice_is_bitwise_the_same(cls):
    a = _model(cls, agents_per_round=2, control_variates=True).learn(total_rounds=3)
    b = _model(cls, agents_per_round=2, control_variates=True).learn(total_rounds=3)
    assert torch.equal(a.theta, b.theta) and torch.equal(a.control_agents, b.control_agents)
    assert torch.equal(a.federation.streams.counters, b.federation.streams.counters)
    c = _model(cls, agents_per_round=2).learn(total_rounds=3)
    assert not torch.equal(a.theta, c.theta)  # the correction changes the path from round 2 on


@pytest.mark.parametrize("cls", [PerFedAvgPG, FedAvgPG])
def test_control_variates_reject_bad_arguments(cls):
    with pytest.raises(TypeError, match="control_variates"):
        _model(cls, control_variates="yes")
    with pytest.raises(TypeError, match="control_variates"):
        _model(cls, control_variates=1)
    with pytest.raises(ValueError, match="step_size"):
        _model(cls, control_variates=True, step_size=0.0)
    model = _model(cls, control_variates=True)
    with pytest.raises(ValueError, match="agents"):
        model.set_env(FedAvgPG("TabularPolicy", GRID, agent_kwargs=[{"goal": (0, 0)}], seed=0, device="cpu").get_env())


def test_agents_per_round_streams_of_unsampled_agents_stay_in_the_shell():
    model = _model(PerFedAvgPG, agents_per_round=2).learn(total_rounds=1)
    counters = model.federation.streams.counters
    assert int((counters > 0).sum()) == 2 and model.timesteps_per_round == 2 * 2 * 9 * 16


class _Quadratic(PolicyGradient):
    """Exact ascent direction of J_i(θ) = −½ (θ − b_i)ᵀ diag(a_i) (θ − b_i): heterogeneous curvature,
    so FedAvg's local steps drift (its fixed point is not the maximizer of Σ_i J_i)."""

    per_agent_state = True  # a_i, b_i belong to agent i: the masked path keeps every agent's row

    def __init__(self, policy, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__(policy, 0.9, 1)
        self.a, self.b = a, b

    def __call__(self, sampler, theta):
        return self.a * (self.b - theta)


@pytest.mark.parametrize("agents_per_round", [None, 3])
def test_scaffold_removes_client_drift_where_fedavg_does_not(agents_per_round):
    # SCAFFOLD's defining property (Karimireddy et al. 2020, with exact local gradients): its fixed
    # point is the maximizer x* = (Σ a_i)^-1 Σ a_i b_i of the average objective; FedAvg's is not.
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(1, 8, 5, generator=generator, dtype=torch.float64) * 1.8 + 0.2
    b = torch.randn(1, 8, 5, generator=generator, dtype=torch.float64)
    best = (a * b).sum(1) / a.sum(1)
    estimator = _Quadratic(_policy(), a, b)
    finals = {}
    for cv in (False, True):
        fed = Federation(GRIDWORLD, PARAMS, _policy(), torch.tensor([0]))
        theta = torch.zeros(1, 5, dtype=torch.float64)
        control = ControlVariates.zeros(1, 8, 5, torch.float64) if cv else None
        for _ in range(400):
            theta, _ = per_fedavg_pg_round(fed, theta, estimator, 0.2, 10, agents_per_round, control=control)
        finals[cv] = float((theta - best).norm())
    assert finals[True] < 1e-8
    assert finals[False] > 0.05


def test_reproduce_partial_quick_writes_its_table_and_figures(tmp_path):
    from fedrl_algos.reproduce import EXPERIMENTS, run_experiment

    experiment = EXPERIMENTS["partial"]
    config = experiment.config(quick=True, methods=("first_order",))
    payload = run_experiment(experiment, tmp_path, seeds=2, config=config)
    curves = [r for r in payload["records"] if r["kind"] == "curve"]
    assert {(r["agents_per_round"], r["control_variates"]) for r in curves} == {(8, False), (8, True), (2, False), (2, True)}
    assert len(curves) == 4 * 2 * (config.rounds + 1)
    timing = [r for r in payload["records"] if r["kind"] == "timing"]
    assert {r["path"] for r in timing} == {"full", "subset", "masked"} and all(len(r["round_s"]) == config.timing_rounds for r in timing)
    report = (tmp_path / "partial" / "report.md").read_text()
    assert "random words drawn by the agents' streams, r=2 / r=n" in report and "| 0.250 |" in report
    for name in ("partial_rounds.png", "partial_trajectories.png", "partial_wall_time.png"):
        assert (tmp_path / "partial" / name).stat().st_size > 0
    with pytest.raises(ValueError, match="fraction"):
        experiment.config(fraction=0)
    with pytest.raises(ValueError, match="control_variates"):
        experiment.config(control_variates=())


def test_env_backed_federation_keeps_the_masked_path_and_cannot_select():
    model = FedAvgPG("MlpPolicy", "CartPole-v1", n_agents=4, agents_per_round=2, n_trajectories=2, local_steps=1, horizon=9,
                     policy_kwargs={"net_arch": (4,)}, control_variates=True, seed=0, device="cpu",
                     baseline=None)  # eq. (2): with 2 trajectories of 10 +1 rewards a leave-one-out baseline often cancels all
    assert not model.federation.can_select
    with pytest.raises(ValueError, match="family-backed"):
        model.federation.select(torch.tensor([[0, 1]]))
    model.learn(total_rounds=2)
    sampled = int((model.control_agents.abs().sum(-1) > 0).sum())
    assert 2 <= sampled <= 4  # only the sampled agents' controls moved, two per round
    assert torch.allclose(model.control_server, model.control_agents.mean(1), atol=1e-6)
