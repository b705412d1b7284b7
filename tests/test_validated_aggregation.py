"""Validated aggregation: every server checks each client update (shape, dtype, finite) and
aggregates only the valid ones; a rejected update never touches the server state; with none left
the round is skipped. One pure check (``core.aggregation.validate_updates``), used by every server."""

from __future__ import annotations

import pytest
import torch
from stable_baselines3 import PPO

import fedrl_algos.fedpg_br.update as fedpg_br_update
import fedrl_algos.mfpo.update as mfpo_update
from fedrl_algos import MFPO, FedAvgPG, FedAvgSB3, FedPGBR, PerFedAvgPG
from fedrl_algos.core import GradientEstimator
from fedrl_algos.core.aggregation import (
    RejectedUpdateWarning,
    UpdateCheck,
    aggregate,
    aggregate_valid,
    validate_updates,
)
from fedrl_algos.core.attacks import Attack
from fedrl_algos.fedavg_sb3 import ParameterAverage, PrefixSelector

GRID = "fedrl/GridWorld-v0"
CARTPOLE = "fedrl/CartPole-v0"


# --- the pure check and the masked average --------------------------------------------------------
def test_validate_updates_names_each_bad_update():
    server = torch.zeros(2, 3, dtype=torch.float64)
    local = torch.ones(2, 4, 3, dtype=torch.float64)
    assert validate_updates(local, server).all_valid
    local[1, 2, 0] = float("nan")
    local[0, 3] = float("inf")
    check = validate_updates(local, server, "parameters")
    expected = torch.ones(2, 4, dtype=torch.bool)
    expected[1, 2] = expected[0, 3] = False
    assert torch.equal(check.valid, expected) and check.n_rejected == 2
    assert check.reasons == ("run 0, agent 3: parameters has 3 non-finite values (NaN or inf) of 3",
                             "run 1, agent 2: parameters has 1 non-finite values (NaN or inf) of 3")
    assert not check.skipped.any()
    # A tensor of the wrong shape or dtype: every update of it is rejected, saying what was expected.
    wrong = validate_updates(torch.ones(2, 4, 5, dtype=torch.float64), server, "parameters")
    assert not wrong.valid.any() and "shape [2, 4, 5], expected [2, n, 3]" in wrong.reasons[0]
    wrong = validate_updates(torch.ones(2, 4, 3, dtype=torch.float32), server)
    assert not wrong.valid.any() and "dtype torch.float32, expected torch.float64" in wrong.reasons[0]
    # Scalars per agent (a reported spread): extra_dims=0.
    spread = torch.tensor([[1.0, float("nan")]])
    assert validate_updates(spread, torch.zeros(1), "spread", extra_dims=0).valid.tolist() == [[True, False]]
    # A list of per-agent tensors (as received from clients): each checked on its own.
    check = validate_updates([torch.ones(3), torch.ones(4), torch.ones(3, dtype=torch.int64), torch.tensor([1.0, 2.0, float("nan")])],
                             torch.zeros(3))
    assert check.valid.tolist() == [True, False, False, False]
    assert [r.split(":")[0] for r in check.reasons] == ["agent 1", "agent 2", "agent 3"]
    assert "shape [4], expected [3]" in check.reasons[0] and "dtype torch.int64" in check.reasons[1]
    with pytest.raises(TypeError, match="updates"):
        validate_updates("abc", torch.zeros(3))
    with pytest.raises(TypeError, match="like"):
        validate_updates(torch.ones(1, 2, 3), [0.0])


def test_aggregate_valid_averages_the_honest_and_skips_empty_runs():
    g = torch.Generator().manual_seed(0)
    local = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    server = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mean, check = aggregate_valid(local, server)
    assert check.all_valid and torch.equal(mean, aggregate(local))  # bit for bit when nothing is rejected
    weights = torch.tensor([[1.0, 0, 1, 1, 1]] * 3, dtype=torch.float64)
    assert torch.equal(aggregate_valid(local, server, weights)[0], aggregate(local, weights))
    bad = local.clone()
    bad[0, 1] = float("nan")  # run 0: agent 1 rejected
    bad[2] = float("inf")  # run 2: nobody left
    seen: list[UpdateCheck] = []
    mean, check = aggregate_valid(bad, server, on_reject=seen.append)
    assert len(seen) == 1 and seen[0] is check
    honest = [0, 2, 3, 4]
    assert torch.allclose(mean[0], local[0, honest].mean(0), rtol=0, atol=1e-15)
    assert torch.equal(mean[1], aggregate(local)[1])
    assert torch.equal(mean[2], server[2]) and check.skipped.tolist() == [False, False, True]
    with pytest.warns(RejectedUpdateWarning, match="rejected 6 update.*skipped the round"):
        aggregate_valid(bad, server)
    # The whole tensor unusable: every run keeps the server's value.
    with pytest.warns(RejectedUpdateWarning, match="shape"):
        kept, _ = aggregate_valid(torch.ones(3, 5, 2, dtype=torch.float64), server)
    assert torch.equal(kept, server)


# --- one agent poisons its update: per algorithm ---------------------------------------------------
class _Poison(GradientEstimator):
    """Records the honest directions, then makes ``agents``' rows NaN (or of another dtype)."""

    def __init__(self, inner: GradientEstimator, agents: list[int]) -> None:
        super().__init__(inner.policy, inner.gamma)
        self.inner, self.agents, self.honest = inner, agents, []
        self.name = inner.name

    @property
    def trajectories_per_step(self) -> int:
        return self.inner.trajectories_per_step

    def __call__(self, sampler, theta):
        g = self.inner(sampler, theta)
        self.honest.append(g.clone())
        g = g.clone()
        g[..., self.agents, :] = float("nan")
        return g


@pytest.mark.parametrize("cls", [FedAvgPG, PerFedAvgPG])
def test_fedavg_servers_average_the_honest_agents(cls):
    kwargs = dict(step_size=0.3, local_steps=1, seed=0, device="cpu", policy_kwargs=dict(dtype=torch.float64))
    if cls is PerFedAvgPG:
        kwargs.update(alpha=0.5, variant="first_order")
    model = cls("TabularPolicy", GRID, **kwargs)
    before = model.theta
    model.estimator = _Poison(model.estimator, [2])
    with pytest.warns(RejectedUpdateWarning, match=r"round 1.*agent 2: parameters has \d+ non-finite"):
        model.learn(total_rounds=1)
    honest = [k for k in range(model.n_agents) if k != 2]
    expected = (before + 0.3 * model.estimator.honest[0][0, honest]).mean(0)
    assert torch.allclose(model.theta, expected, rtol=0, atol=1e-14)
    assert model._round_rejected == 1 and model._round_skipped == 0
    # Every agent bad: the round is skipped and the server parameters stay as they were, bit for bit.
    model.estimator.agents = list(range(model.n_agents))
    before = model.theta
    with pytest.warns(RejectedUpdateWarning, match="round 2.*skipped the round"):
        model.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(model.theta, before) and model._round_skipped == 1


def test_fedavg_adam_server_state_untouched_by_a_skipped_round():
    model = FedAvgPG("TabularPolicy", GRID, step_size=0.3, local_steps=1, server_optimizer="adam", server_step_size=0.05,
                     seed=0, device="cpu", policy_kwargs=dict(dtype=torch.float64))
    model.learn(total_rounds=1)
    state = {k: v.clone() for k, v in model.optimizer_state._asdict().items()}
    before = model.theta
    model.estimator = _Poison(model.estimator, list(range(model.n_agents)))
    with pytest.warns(RejectedUpdateWarning):
        model.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(model.theta, before)
    for key, value in model.optimizer_state._asdict().items():
        assert torch.equal(value, state[key]), key


def test_mfpo_server_averages_the_honest_agents(monkeypatch):
    honest: list[torch.Tensor] = []
    bad_agents = [1]
    real = mfpo_update.score_gradient

    def poisoned(policy, theta, traj, psi, *args, **kwargs):
        g = real(policy, theta, traj, psi, *args, **kwargs)
        honest.append(g.clone())
        g = g.clone()
        g[..., bad_agents, :] = float("nan")
        return g

    monkeypatch.setattr(mfpo_update, "score_gradient", poisoned)
    model = MFPO("TabularPolicy", GRID, local_steps=1, n_trajectories=4, initial_trajectories=4, seed=0, device="cpu",
                 policy_kwargs=dict(dtype=torch.float64))
    before = model.theta
    with pytest.warns(RejectedUpdateWarning, match="round 1.*agent 1: direction"):
        model.learn(total_rounds=1)
    keep = [k for k in range(model.n_agents) if k not in bad_agents]
    alpha = float(model.step_size(1))
    u_bar = honest[0][0, keep].mean(0)
    assert torch.allclose(model.theta, before + alpha * u_bar, rtol=0, atol=1e-14)
    assert torch.allclose(model.agent_direction, u_bar.expand_as(model.agent_direction), rtol=0, atol=1e-14)
    assert torch.isfinite(model.agent_theta_prev).all()  # the rejected agent carries no NaN forward
    # Every agent bad (from t = 2 the direction is eq. (3)'s): the round is skipped, θ̄ and the
    # momentum state stay as they were.
    monkeypatch.setattr(mfpo_update, "momentum_direction", lambda g, *args: torch.full_like(g, float("inf")))
    before, direction, prev = model.theta, model.agent_direction.clone(), model.agent_theta_prev.clone()
    with pytest.warns(RejectedUpdateWarning, match="round 2.*skipped the round"):
        model.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(model.theta, before) and torch.equal(model.agent_direction, direction)
    assert torch.equal(model.agent_theta_prev, prev) and model.local_step == 2


class _NaNReport(Attack):
    """A Byzantine agent whose report is NaN (a crashed or malicious client); records the honest reports."""

    name = "nan_report"

    def __init__(self) -> None:
        self.reports: list[torch.Tensor] = []

    def gradient(self, grad, byzantine, streams):
        self.reports.append(grad.clone())
        rows = byzantine.reshape(*byzantine.shape, 1)
        return torch.where(rows, torch.full_like(grad, float("nan")), grad)


@pytest.mark.parametrize("use_filter", [False, True])
def test_fedpg_br_server_filters_the_honest_reports(monkeypatch, use_filter):
    means: list[torch.Tensor] = []
    real = fedpg_br_update.filtered_mean
    monkeypatch.setattr(fedpg_br_update, "filtered_mean", lambda grads, kept: means.append(real(grads, kept)) or means[-1])
    attack = _NaNReport()
    model = FedPGBR("TabularPolicy", GRID, step_size=0.5, batch_range=(6, 8), inner_batch_size=3, gamma=0.9, seed=0,
                    device="cpu", attack=attack, byzantine_agents=[3], use_filter=use_filter, server_optimizer="adam",
                    policy_kwargs=dict(dtype=torch.float64))
    with pytest.warns(RejectedUpdateWarning, match="round 1.*agent 3: gradient has"):
        model.learn(total_rounds=1)
    info = model._last_info
    assert not bool(info["valid"][0, 3]) and int(info["valid"].sum()) == model.n_agents - 1
    assert not model.filter_history[0][3]
    kept = info["kept"][0]
    reports = attack.reports[0][0]
    assert torch.allclose(means[0][0], reports[kept].mean(0), rtol=0, atol=1e-14)
    if not use_filter:  # the unprotected server averages every honest report
        assert kept.tolist() == [k != 3 for k in range(model.n_agents)]
    assert torch.isfinite(model.theta).all()
    # Every agent bad: nothing is kept, the round is skipped: θ and Adam's state unchanged.
    model.byzantine_agents = list(range(model.n_agents))
    model._make_server_sampler()
    before = model.theta
    state = {k: v.clone() for k, v in model.optimizer_state._asdict().items()}
    with pytest.warns(RejectedUpdateWarning, match="round 2.*skipped the round"):
        model.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(model.theta, before) and int(model._last_info["inner_steps"][0]) == 0
    for key, value in model.optimizer_state._asdict().items():
        assert torch.equal(value, state[key]), key


def test_fedpg_br_rejects_forged_non_finite_or_negative_spreads():
    class BadSpread(Attack):
        name = "bad_spread"

        def spread(self, spread, byzantine, streams):
            return torch.where(byzantine, torch.tensor([-1.0, float("nan")], dtype=spread.dtype).repeat(spread.shape[-1] // 2), spread)

    model = FedPGBR("TabularPolicy", GRID, step_size=0.5, batch_range=(6, 8), inner_batch_size=3, gamma=0.9, seed=0,
                    device="cpu", attack=BadSpread(), byzantine_agents=[0, 1], policy_kwargs=dict(dtype=torch.float64))
    with pytest.warns(RejectedUpdateWarning) as record:
        model.learn(total_rounds=1)
    message = str(record[0].message)
    assert "agent 0: spread is negative" in message and "agent 1: spread has 1 non-finite" in message
    assert model._last_info["valid"][0].tolist() == [False, False] + [True] * (model.n_agents - 2)
    assert torch.isfinite(model._last_info["sigma"]).all()


def test_fedavg_sb3_averages_the_honest_agents(monkeypatch):
    fed = FedAvgSB3(PPO, CARTPOLE, n_agents=3, algorithm_kwargs={"policy_kwargs": {"net_arch": [8]}, "n_steps": 32,
                    "batch_size": 16, "n_epochs": 1}, seed=0, device="cpu")
    poisoned = {1}
    seen: list[list[dict[str, torch.Tensor]]] = []
    real_call = ParameterAverage.__call__

    def recording(self, models, on_reject=None):
        for k in poisoned:  # the client's update arrives non-finite
            with torch.no_grad():
                next(iter(self.selector(models[k]).values())).fill_(float("nan"))
        seen.append([{k: t.detach().clone() for k, t in self.selector(m).items()} for m in models])
        return real_call(self, models, on_reject)

    monkeypatch.setattr(ParameterAverage, "__call__", recording)
    with pytest.warns(RejectedUpdateWarning, match="round 1.*agent 1: parameters has"):
        fed.learn(3 * 32)
    names = list(seen[0][0])
    for name in names:
        expected = (seen[0][0][name] + seen[0][2][name]) / 2
        for agent in fed.agents:  # the rejected agent gets the honest average too
            assert torch.allclose(fed.aggregator.selector(agent)[name], expected, rtol=0, atol=1e-7), name
    # Every agent bad: the server changes nothing (each agent keeps exactly what it sent).
    poisoned.update({0, 2})
    with pytest.warns(RejectedUpdateWarning, match="rejected 3 update"):
        stats = fed.synchronize()
    assert stats["skipped_round"] == 1.0 and stats["rejected_updates"] == 3.0
    for agent, sent in zip(fed.agents, seen[-1], strict=True):
        for name, now in fed.aggregator.selector(agent).items():
            assert torch.equal(torch.nan_to_num(now, nan=7.0), torch.nan_to_num(sent[name], nan=7.0)), name


def test_parameter_average_rejects_a_structurally_different_agent():
    class Tiny:
        def __init__(self, width: int) -> None:
            self.policy = torch.nn.Sequential(torch.nn.Linear(2, width))

    models = [Tiny(2), Tiny(2), Tiny(3)]
    with torch.no_grad():
        for value, m in zip([0.0, 2.0, 5.0], models, strict=True):
            for p in m.policy.parameters():
                p.fill_(value)
    rule = ParameterAverage(PrefixSelector())
    seen: list[UpdateCheck] = []
    stats = rule(models, on_reject=seen.append)
    assert stats["rejected_updates"] == 1.0 and "agent 2: selected tensors" in seen[0].reasons[0]
    for m in models[:2]:
        assert all(torch.equal(p, torch.full_like(p, 1.0)) for p in m.policy.parameters())
    assert all(torch.equal(p, torch.full_like(p, 5.0)) for p in models[2].policy.parameters())  # left as it was
