"""Tests that kill the mutants the mutation-testing run (docs/testing.md) found alive in the other
core modules: aggregation, the server optimizer, the schedules, observation normalization, the
local directions, SCAFFOLD's control variates, and (further down) the estimators, attacks,
samplers and the federation's seeds, agent selection, evaluation and adaptation.

Each test compares values against an independent computation (plain Python floats, a loop, a
formula written out), never "nonzero".
"""

from __future__ import annotations

import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_algos.core import attacks as atk
from fedrl_algos.core import federation as fd
from fedrl_algos.core import gpomdp as gp
from fedrl_algos.core.adaptation import adaptation_gradient
from fedrl_algos.core.aggregation import (
    RejectedUpdateWarning,
    UpdateCheck,
    aggregate,
    aggregate_valid,
    masked_weights,
    validate_updates,
    warn_rejected,
)
from fedrl_algos.core.control_variates import (
    ControlVariates,
    CorrectedDirection,
    agent_control_update,
    server_control_update,
)
from fedrl_algos.core.directions import (
    GradientEstimator,
    PolicyGradient,
    check_step_size,
    check_step_size_or_tensor,
    local_update,
    scale,
)
from fedrl_algos.core.estimators import policy_gradient
from fedrl_algos.core.normalization import ObservationNormalizer
from fedrl_algos.core.optim import AdamState, adam_ascent, check_server_optimizer
from fedrl_algos.core.schedules import (
    ConstantSchedule,
    ExponentialStepSize,
    MomentumSchedule,
    as_momentum,
    as_step_size,
)
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.per_fedavg_pg.update import per_fedavg_pg_round
from fedrl_algos.policies import MlpPolicy, TabularPolicy
from fedrl_envs import CARTPOLE, GRIDWORLD, RandomStreams, derive_keys, stack_params
from fedrl_envs.rng import mix64

# ---------------------------------------------------------------------------------------------
# schedules


@pytest.mark.parametrize("initial, growth, maximum", [(1e-4, 1 / 0.99, 1e-3), (0.5, 0.9, None), (2.0, 1.5, 7.0)])
def test_exponential_step_size_is_the_capped_power(initial, growth, maximum):
    schedule = ExponentialStepSize(initial, growth, maximum)
    for t in (0, 1, 2, 5, 17, 230, 231, 600):
        expected = initial * growth**t
        if maximum is not None:
            expected = min(expected, maximum)
        assert schedule(t) == pytest.approx(expected, rel=1e-12, abs=0), t


def test_exponential_step_size_defaults_are_the_papers_with_the_cap():
    schedule = ExponentialStepSize()
    assert (schedule.initial, schedule.growth, schedule.maximum) == (1e-4, 1 / 0.99, 1e-3)
    assert schedule(1) == pytest.approx(1e-4 / 0.99, rel=1e-13)
    assert schedule(229) < 1e-3 and schedule(230) == 1e-3  # the cap is reached at t = 230


def test_exponential_step_size_zero_initial_and_overflow():
    assert ExponentialStepSize(0.0)(5) == 0.0  # log(0) is never taken
    with pytest.raises(ValueError, match="initial"):  # a negative α_0 is refused, not silently 0
        ExponentialStepSize(-1.0, maximum=None)
    # log α_t = 709 exactly (log e = 1): the overflow guard is strict, so this is inf, not exp(709)
    assert math.log(math.e) == 1.0
    assert ExponentialStepSize(1.0, math.e, None)(709) == math.inf
    assert ExponentialStepSize(1.0, math.e, None)(708) == pytest.approx(math.exp(708), rel=1e-12)
    # log α_t ≈ 709.9 (past float's largest exp, 709.78): inf rather than an OverflowError
    assert ExponentialStepSize(math.exp(0.9), math.e, None)(709) == math.inf
    assert ExponentialStepSize(math.exp(0.9), math.e, 5.0)(709) == 5.0
    assert ExponentialStepSize(1.0, 1 / 0.99, None)(100_000) == math.inf


def test_momentum_schedule_is_the_clipped_formula():
    assert MomentumSchedule()(3, 0.1) == pytest.approx(1 - 3 * 0.1, rel=1e-15)
    assert (MomentumSchedule().c, MomentumSchedule().power) == (3.0, 1.0)
    assert MomentumSchedule(c=2.0, power=2.0)(1, 0.3) == pytest.approx(1 - 2 * 0.09, rel=1e-15)
    assert MomentumSchedule(c=5.0, power=0.5)(1, 0.04) == pytest.approx(1 - 5 * 0.2, abs=1e-15)
    assert MomentumSchedule()(1, 0.5) == 0.0  # 1 − 1.5 clipped at 0
    assert MomentumSchedule(c=-1.0)(1, 0.5) == 1.0  # 1.5 clipped at 1
    assert MomentumSchedule()(1, 0.0) == 1.0


def test_constant_schedules_and_their_checks():
    assert ConstantSchedule(0.25)(7, 0.1) == 0.25 and ConstantSchedule(0.25)() == 0.25
    step = as_step_size(3)
    assert isinstance(step, ConstantSchedule) and step(10) == 3.0 and isinstance(step.value, float)
    assert as_step_size(0)(1) == 0.0
    schedule = ExponentialStepSize()
    assert as_step_size(schedule) is schedule
    for bad in (-1e-9, float("nan")):
        with pytest.raises(ValueError, match="beta must be >= 0"):
            as_step_size(bad, "beta")
    with pytest.raises(ValueError, match="step_size must be >= 0"):
        as_step_size(-1)
    for bad, kind in ((True, "bool"), ("0.1", "str"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"beta must be a number or a callable t -> α_t, got {kind}$"):
            as_step_size(bad, "beta")
    for value in (0, 0.0, 0.5, 1, 1.0):
        nu = as_momentum(value)
        assert isinstance(nu, ConstantSchedule) and nu(1, 0.1) == float(value) and isinstance(nu.value, float)
    momentum = MomentumSchedule()
    assert as_momentum(momentum) is momentum
    for bad in (-1e-12, 1.0000001, float("nan")):
        with pytest.raises(ValueError, match="momentum must be in"):
            as_momentum(bad)
    for bad, kind in ((False, "bool"), ("0.5", "str")):
        with pytest.raises(TypeError, match=f"momentum must be a number in .*, got {kind}$"):
            as_momentum(bad)


# ---------------------------------------------------------------------------------------------
# observation normalization: SB3's RunningMeanStd (an independent implementation) is the reference


def _sb3_reference(batches):
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    reference = RunningMeanStd(epsilon=1e-4, shape=batches[0].shape[1:])
    for batch in batches:
        reference.update(batch)
    return reference


def test_normalizer_starts_from_sb3s_prior():
    norm = ObservationNormalizer((np.int64(2), 3))
    assert norm.shape == (2, 3) and all(type(s) is int for s in norm.shape)
    assert torch.equal(norm.mean, torch.zeros(2, 3, dtype=torch.float64))
    assert torch.equal(norm.var, torch.ones(2, 3, dtype=torch.float64))
    assert norm.mean.dtype == norm.var.dtype == norm.count.dtype == torch.float64 and float(norm.count) == 1e-4
    assert all(value.dtype == torch.float64 for value in norm.state_dict().values())  # what a fresh model saves


def test_normalizer_round_with_a_single_observation_counts():
    norm = ObservationNormalizer((2,))
    norm.accumulate(torch.tensor([[3.0, -1.0], [9.0, 9.0]]), torch.tensor([1.0, 0.0]))
    norm.commit()
    reference = _sb3_reference([np.array([[3.0, -1.0]])])
    assert np.allclose(norm.mean.numpy(), reference.mean, rtol=0, atol=1e-15)
    assert np.allclose(norm.var.numpy(), reference.var, rtol=1e-14, atol=0)
    assert float(norm.count) == pytest.approx(1 + 1e-4, rel=1e-15)
    assert (norm.clip, norm.eps) == (10.0, 1e-8)


def test_normalizer_pools_masked_observations_like_running_mean_std():
    gen = torch.Generator().manual_seed(4)
    norm = ObservationNormalizer((3,))
    kept = []
    for round_ in range(3):
        obs = torch.randn(2, 4, 5, 3, generator=gen, dtype=torch.float32) * (round_ + 1) + round_
        mask = (torch.rand(2, 4, 5, generator=gen) > 0.3).to(torch.float32)
        mask[0, 0, 0] = 0.5  # any positive mask value counts as a step that ran
        before = norm.normalize(obs)
        norm.accumulate(obs[:1], mask[:1])
        norm.accumulate(obs[1:], mask[1:])  # two calls in a round pool as one
        assert torch.equal(norm.normalize(obs), before)  # nothing changes until commit
        norm.commit()
        kept.append(obs[mask > 0].to(torch.float64).numpy())
        reference = _sb3_reference(kept)
        assert np.allclose(norm.mean.numpy(), reference.mean, rtol=0, atol=1e-12)
        assert np.allclose(norm.var.numpy(), reference.var, rtol=1e-12, atol=1e-13)
        assert float(norm.count) == pytest.approx(reference.count, rel=1e-15)
    # a round with nothing accumulated changes nothing (no 0/0)
    state = norm.state_dict()
    norm.commit()
    norm.accumulate(torch.ones(2, 3), torch.zeros(2))
    norm.commit()
    for key, value in norm.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_normalizer_batch_variance_never_negative():
    norm = ObservationNormalizer((1,))
    # identical observations: E[x²] − E[x]² rounds below zero in float64 (1000.1 is not exact)
    obs = torch.full((7, 1), 1000.1, dtype=torch.float64)
    total, squares = obs.sum(0), (obs * obs).sum(0)
    assert float(squares / 7 - (total / 7) ** 2) < 0
    norm.accumulate(obs, torch.ones(7))
    norm.commit()
    count = 1e-4 + 7
    delta = float(total[0]) / 7
    expected_var = (1e-4 * 1.0 + 0.0 + delta * delta * 1e-4 * 7 / count) / count
    # unclamped, the rounding (−3.5e-10 · 7) would move the variance by ~2e-11 relative
    assert float(norm.var[0]) == pytest.approx(expected_var, rel=1e-14)


def test_normalize_is_the_clipped_standardization():
    norm = ObservationNormalizer((2,), clip=3.0, eps=1e-2)
    norm.load_state_dict({"mean": torch.tensor([1.0, -2.0]), "var": torch.tensor([4.0, 0.0]), "count": torch.tensor(5.0)})
    obs = torch.tensor([[1.0, -2.0], [3.0, -1.9], [100.0, -100.0], [-1.0, -2.05]], dtype=torch.float64)
    expected = [[0.0, 0.0], [2 / math.sqrt(4.01), 0.1 / math.sqrt(0.01)], [3.0, -3.0], [-2 / math.sqrt(4.01), -0.05 / 0.1]]
    out = norm.normalize(obs)
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-6)
    out64 = norm.normalize(obs, torch.float64)
    assert out64.dtype == torch.float64
    assert torch.allclose(out64, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    # default clip 10 and eps 1e-8 (SB3's)
    plain = ObservationNormalizer((1,))
    plain.load_state_dict({"mean": torch.zeros(1), "var": torch.zeros(1), "count": torch.tensor(1.0)})
    assert float(plain.normalize(torch.tensor([[5e-4]], dtype=torch.float64), torch.float64)) == pytest.approx(5e-4 / 1e-4, rel=1e-12)
    assert float(plain.normalize(torch.tensor([[1.0]]), torch.float64)) == 10.0


def test_normalizer_state_round_trips_as_float64_copies():
    norm = ObservationNormalizer((2,))
    norm.accumulate(torch.tensor([[1.0, 2.0], [3.0, 6.0]]), torch.ones(2))
    norm.commit()
    state = norm.state_dict()
    assert set(state) == {"mean", "var", "count"}
    state["mean"] += 100.0  # a copy: the normalizer's moments do not move
    assert torch.allclose(norm.mean, torch.tensor([2.0, 4.0], dtype=torch.float64) * 2 / (2 + 1e-4), rtol=1e-15)
    other = ObservationNormalizer((2,))
    source = {"mean": torch.tensor([1.5, -0.5], dtype=torch.float32), "var": torch.tensor([2.0, 3.0], dtype=torch.float32),
              "count": torch.tensor(9.0, dtype=torch.float32)}
    other.load_state_dict(source)
    for key in ("mean", "var", "count"):
        assert getattr(other, key).dtype == torch.float64 and torch.equal(getattr(other, key), source[key].double())
    source["mean"] += 1.0  # loaded as copies too
    assert other.mean.tolist() == [1.5, -0.5]


# ---------------------------------------------------------------------------------------------
# aggregation


def _weighted_mean_by_hand(local, weights, valid):
    """The weighted mean of the valid rows, one batch row at a time in float64 Python sums."""
    *batch, n, d = local.shape
    flat_local, flat_w, flat_v = local.reshape(-1, n, d), weights.reshape(-1, n), valid.reshape(-1, n)
    rows = []
    for x, w, v in zip(flat_local.tolist(), flat_w.tolist(), flat_v.tolist()):
        total = sum(wk for wk, vk in zip(w, v) if vk)
        rows.append([sum(wk * xk[j] for wk, xk, vk in zip(w, x, v) if vk) / total if total else math.nan for j in range(d)])
    return torch.tensor(rows, dtype=torch.float64).reshape(*batch, d)


def test_aggregate_normalizes_each_runs_weights_in_the_parameters_dtype():
    g = torch.Generator().manual_seed(1)
    local = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float32)  # two run axes [2, 3], n = 4
    weights = torch.rand(2, 3, 4, generator=g, dtype=torch.float64) + 0.1
    out = aggregate(local, weights)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 5)
    expected = _weighted_mean_by_hand(local.double(), weights.float().double(), torch.ones(2, 3, 4, dtype=torch.bool))
    assert torch.allclose(out.double(), expected, rtol=0, atol=1e-6)
    assert torch.equal(aggregate(local), local.mean(-2))
    # a participation mask as weights
    mask = torch.tensor([True, False, True, True])
    assert torch.allclose(aggregate(local[0, 0], mask), local[0, 0, [0, 2, 3]].mean(0), rtol=0, atol=1e-6)


def test_masked_weights_are_float64_with_the_rejected_at_zero():
    valid = torch.tensor([[True, False, True]])
    ones = masked_weights(valid, None)
    assert ones.dtype == torch.float64 and ones.tolist() == [[1.0, 0.0, 1.0]]
    given = masked_weights(valid, torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float32))
    assert given.dtype == torch.float64
    assert given.tolist() == [[float(torch.tensor(0.1, dtype=torch.float32)), 0.0, float(torch.tensor(0.3, dtype=torch.float32))]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_aggregate_valid_weighted_with_rejections_on_two_run_axes(dtype):
    g = torch.Generator().manual_seed(2)
    local = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64).to(dtype)
    server = torch.randn(2, 3, 5, generator=g, dtype=torch.float64).to(dtype)
    weights = torch.full((2, 3, 4), 0.125, dtype=torch.float64)  # every run's weights sum to < 1
    weights[1, 2] = torch.tensor([0.0, 0.3, 0.0, 0.2])
    bad = local.clone()
    bad[0, 0, 1] = float("nan")
    bad[0, 1, :3] = float("inf")  # one agent left: weight 0.125 (< 1), still aggregated
    bad[1, 0] = float("nan")  # nobody left: the server's value
    bad[1, 2, 1] = float("-inf")  # only agent 3 is valid and weighted
    seen = []
    mean, check = aggregate_valid(bad, server, weights, on_reject=seen.append)
    assert len(seen) == 1 and check.valid.shape == (2, 3, 4)
    assert mean.dtype == dtype and mean.shape == (2, 3, 5)
    assert check.skipped.tolist() == [[False, False, False], [True, False, False]]
    expected = _weighted_mean_by_hand(local.double().nan_to_num(), weights, check.valid)
    expected[1, 0] = server[1, 0].double()
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert torch.allclose(mean.double(), expected, rtol=0, atol=tol)
    assert torch.equal(mean[0, 1], local[0, 1, 3]) and torch.equal(mean[1, 2], local[1, 2, 3])
    assert torch.equal(mean[1, 0], server[1, 0])
    # fractional weights that exclude every valid agent: the run keeps the server's value
    zero_w = weights.clone()
    zero_w[0, 1, 3] = 0.0
    mean, check = aggregate_valid(bad, server, zero_w, on_reject=seen.append)
    assert torch.equal(mean[0, 1], server[0, 1]) and torch.equal(mean[1, 2], local[1, 2, 3])


def test_aggregate_valid_without_a_run_axis():
    local = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [3.0, 8.0]], dtype=torch.float64)
    server = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    check = validate_updates(local, server, "parameters")
    assert check.valid.tolist() == [True, False, True]
    assert check.reasons == ("agent 1: parameters has 1 non-finite values (NaN or inf) of 2",)
    mean, _ = aggregate_valid(local, server, check=check, on_reject=lambda c: None)
    assert mean.tolist() == [2.0, 5.0]
    mean, _ = aggregate_valid(local, server, torch.tensor([1.0, 1.0, 3.0]), on_reject=lambda c: None)
    assert mean.tolist() == [2.5, 6.5]
    nothing = torch.full((3, 2), float("nan"), dtype=torch.float64)
    mean, check = aggregate_valid(nothing, server, on_reject=lambda c: None)
    assert torch.equal(mean, server) and bool(check.skipped)


def test_validate_updates_reasons_name_every_run_axis_and_shape():
    like = torch.zeros(2, 3, 4)
    updates = torch.zeros(2, 3, 5, 4)
    updates[1, 2, 0, 1] = float("nan")
    updates[0, 1, 4] = float("inf")
    check = validate_updates(updates, like, "direction")
    assert check.reasons == ("run 0, 1, agent 4: direction has 4 non-finite values (NaN or inf) of 4",
                             "run 1, 2, agent 0: direction has 1 non-finite values (NaN or inf) of 4")
    # a wrong shape rejects every agent: the mask keeps the batch and agent axes
    wrong = validate_updates(torch.zeros(2, 3, 5, 7), like)
    assert wrong.valid.shape == (2, 3, 5) and not wrong.valid.any()
    assert wrong.reasons == ("every agent: update tensor has shape [2, 3, 5, 7], expected [2, 3, n, 4]",)
    # too few dims to hold an agent axis: one (rejected) agent per run
    short = validate_updates(torch.zeros(2), torch.zeros(2, 4))
    assert short.valid.shape == (2, 1) and not short.valid.any()
    assert short.reasons == ("every agent: update tensor has shape [2], expected [2, n, 4]",)
    scalar = validate_updates(torch.zeros(()), torch.zeros(3), extra_dims=0)
    assert scalar.valid.shape == (3, 1) and not scalar.valid.any()
    listed = validate_updates([torch.zeros(4), [0.0] * 4, None], torch.zeros(4), "gradient")
    assert listed.reasons == ("agent 1: gradient is a list, not a tensor", "agent 2: gradient is a NoneType, not a tensor")


def test_warn_rejected_message_and_where_it_points():
    check = UpdateCheck(torch.tensor([[True, False], [True, True]]), ("run 0, agent 1: a", "run 0, agent 0: b"))
    with pytest.warns(RejectedUpdateWarning) as record:
        warn_rejected(check)
    assert str(record[0].message) == "server: rejected 1 update(s): run 0, agent 1: a; run 0, agent 0: b"
    skipped = UpdateCheck(torch.tensor([[False, False], [True, True]]), ("x", "y"))
    with pytest.warns(RejectedUpdateWarning) as record:
        warn_rejected(skipped, "round 3")
    assert str(record[0].message) == ("round 3: rejected 2 update(s): x; y; 1 run(s) had no valid update and skipped "
                                      "the round (server state unchanged)")


@pytest.mark.skipif("MUTANT_UNDER_TEST" in os.environ, reason="mutmut's trampolines add frames between the caller and the server function")
def test_rejected_update_warning_points_at_the_servers_caller():
    # stacklevel 3: warn_rejected <- aggregate_valid <- its caller (this file), not the library
    local = torch.tensor([[[1.0], [float("nan")]]])
    with pytest.warns(RejectedUpdateWarning) as record:
        aggregate_valid(local, torch.zeros(1, 1))
    assert record[0].filename == __file__


# ---------------------------------------------------------------------------------------------
# directions


class _Affine(GradientEstimator):
    """Direction ``target − θ`` (deterministic), recording every call's batch size request."""

    def __init__(self, target: torch.Tensor) -> None:
        super().__init__(policy=object(), gamma=1)
        self.target, self.calls = target, 0

    @property
    def trajectories_per_step(self) -> int:
        return 3

    def __call__(self, sampler, theta):
        self.calls += 1
        assert sampler(theta, self.trajectories_per_step) == "batch"
        return self.target - theta


def test_local_update_takes_tau_steps_along_the_direction():
    theta0 = torch.tensor([[0.0, 1.0], [2.0, -4.0]], dtype=torch.float64)
    target = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    for tau, beta in ((0, 0.5), (1, 0.5), (3, 0.25), (4, torch.tensor([[0.5], [0.125]], dtype=torch.float64))):
        estimator = _Affine(target)
        out = local_update(estimator, lambda theta, m: "batch", theta0, beta, tau)
        expected = target + (1 - beta) ** tau * (theta0 - target)  # θ_k − target shrinks by (1 − β) a step
        assert estimator.calls == tau
        assert torch.allclose(out, expected, rtol=0, atol=1e-15), tau
    assert _Affine(target).gamma == 1.0 and isinstance(_Affine(target).gamma, float)


def test_policy_gradient_direction_draws_m_trajectories_at_theta():
    policy = TabularPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2), dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    theta = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    m, horizon = 4, 3
    traj = Trajectories(
        torch.randint(0, 3, (2, m, horizon), generator=g),
        torch.randint(0, 2, (2, m, horizon), generator=g),
        torch.rand(2, m, horizon, generator=g, dtype=torch.float64),
        torch.ones(2, m, horizon, dtype=torch.float64),
    )
    requests = []

    def sampler(at, count):
        requests.append((at, count))
        return traj

    estimator = PolicyGradient(policy, 0.8, m)
    assert (estimator.name, estimator.m, estimator.trajectories_per_step, estimator.gamma) == ("pg", m, m, 0.8)
    assert estimator.policy is policy and PolicyGradient(policy, 1, 2, name="fedavg").name == "fedavg"
    out = estimator(sampler, theta)
    assert requests[0][0] is theta and requests[0][1] == m
    assert torch.equal(out, policy_gradient(policy, theta, traj, 0.8))
    assert not torch.allclose(out, policy_gradient(policy, theta, traj, 0.5))  # γ is the estimator's
    for bad, error in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="m must be"):
            PolicyGradient(policy, 0.9, bad)


def test_step_size_checks():
    for value in (0, 3, 0.5, np.int64(2), np.float32(0.25)):
        out = check_step_size("beta", value)
        assert type(out) is float and out == float(value)
    for bad, kind in ((True, "bool"), (np.bool_(False), "bool"), ("0.1", "str"), (None, "NoneType"), (torch.tensor(0.1), "Tensor")):
        with pytest.raises(TypeError, match=f"^beta must be a number, got {kind}$"):
            check_step_size("beta", bad)
    for bad in (-1, -1e-300, float("nan"), np.float64(-2.0)):
        with pytest.raises(ValueError, match="beta must be >= 0"):
            check_step_size("beta", bad)
    assert check_step_size_or_tensor("alpha", 2) == 2.0 and type(check_step_size_or_tensor("alpha", 2)) is float
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        check_step_size_or_tensor("alpha", -0.5)
    leaf = torch.tensor([[0.0], [0.5]], requires_grad=True)
    out = check_step_size_or_tensor("alpha", leaf)
    assert not out.requires_grad and torch.equal(out, leaf.detach())
    with pytest.raises(TypeError, match="alpha must be a floating-point tensor"):
        check_step_size_or_tensor("alpha", torch.tensor([1, 2]))
    for bad in (torch.tensor([0.1, -1e-30]), torch.tensor([float("nan")]), torch.tensor([float("inf"), 1.0])):
        with pytest.raises(ValueError, match="alpha must be finite and >= 0"):
            check_step_size_or_tensor("alpha", bad)


def test_scale_casts_a_tensor_step_to_the_vectors_dtype():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float32)
    alpha = torch.tensor([[0.1], [1 / 3]], dtype=torch.float64)
    out = scale(alpha, x)
    assert out.dtype == torch.float32 and torch.equal(out, alpha.float() * x)
    assert torch.equal(scale(0.5, x), x * 0.5)


# ---------------------------------------------------------------------------------------------
# SCAFFOLD's control variates


def test_control_updates_are_scaffolds_option_two():
    g = torch.Generator().manual_seed(6)
    runs, n, d = 2, 3, 4
    c = torch.randn(runs, d, generator=g, dtype=torch.float64)
    c_i = torch.randn(runs, n, d, generator=g, dtype=torch.float64)
    x = torch.randn(runs, d, generator=g, dtype=torch.float64)
    y = torch.randn(runs, n, d, generator=g, dtype=torch.float64)
    new = agent_control_update(c_i, c, y, x, 0.4)
    for r in range(runs):
        for i in range(n):
            assert torch.allclose(new[r, i], c_i[r, i] - c[r] + (y[r, i] - x[r]) / 0.4, rtol=0, atol=1e-14)
    sums = torch.tensor([[[0.5], [1.0], [2.0]]] * runs, dtype=torch.float64)
    assert torch.allclose(agent_control_update(c_i, c, y, x, sums)[:, 2], c_i[:, 2] - c + (y[:, 2] - x) / 2.0, rtol=0, atol=1e-14)
    used = torch.tensor([[True, False, True], [False, False, False]])
    server = server_control_update(c, c_i, new, used)
    assert torch.allclose(server[0], c[0] + ((new[0, 0] - c_i[0, 0]) + (new[0, 2] - c_i[0, 2])) / n, rtol=0, atol=1e-14)
    assert torch.equal(server[1], c[1])


def test_control_variates_round_in_place_keeps_c_the_mean_of_c_i():
    runs, n, d = 2, 3, 2
    controls = ControlVariates.zeros(runs, n, d, dtype=torch.float64)
    assert controls.server.shape == (runs, d) and controls.agents.shape == (runs, n, d)
    assert controls.server.dtype == controls.agents.dtype == torch.float64
    assert not controls.server.any() and not controls.agents.any()
    assert ControlVariates.zeros(1, 2, 3).server.dtype == torch.float32
    g = torch.Generator().manual_seed(7)
    theta = torch.randn(runs, d, generator=g, dtype=torch.float64)
    everyone = torch.ones(runs, n, dtype=torch.bool)
    for step_sum in (0.5, 0.25):
        local = theta.unsqueeze(-2) + torch.randn(runs, n, d, generator=g, dtype=torch.float64)
        before_server, before_agents = controls.server.clone(), controls.agents.clone()
        controls.update(local, theta, step_sum, everyone)
        expected_agents = before_agents - before_server.unsqueeze(-2) + (local - theta.unsqueeze(-2)) / step_sum
        assert torch.allclose(controls.agents, expected_agents, rtol=0, atol=1e-14)
        assert torch.allclose(controls.server, controls.agents.mean(-2), rtol=0, atol=1e-14)
        assert torch.allclose(controls.correction(), controls.server.unsqueeze(-2) - controls.agents, rtol=0, atol=0)
    some = torch.tensor([[True, False, False], [False, True, True]])
    before_server, before_agents = controls.server.clone(), controls.agents.clone()
    local = theta.unsqueeze(-2) + 1.0
    controls.update(local, theta, 2.0, some)
    assert torch.equal(controls.agents[0, 1:], before_agents[0, 1:]) and torch.equal(controls.agents[1, 0], before_agents[1, 0])
    moved = before_agents[0, 0] - before_server[0] + 0.5
    assert torch.allclose(controls.agents[0, 0], moved, rtol=0, atol=1e-14)
    assert torch.allclose(controls.server[0], before_server[0] + (moved - before_agents[0, 0]) / n, rtol=0, atol=1e-14)


def test_control_variates_check_names_the_problem():
    controls = ControlVariates.zeros(2, 3, 4, dtype=torch.float64)
    theta = torch.zeros(2, 4, dtype=torch.float64)
    controls.check(theta, 3, 0.1)
    controls.check(theta, 3, torch.tensor([[[0.1]], [[1e-9]]]))
    with pytest.raises(ValueError, match=r"shapes c \[2, 4\] and c_i \[2, 5, 4\], got \[2, 4\] and \[2, 3, 4\]"):
        controls.check(theta, 5, 0.1)
    with pytest.raises(ValueError, match=r"c \[2, 5\]"):
        controls.check(torch.zeros(2, 5, dtype=torch.float64), 3, 0.1)
    with pytest.raises(ValueError, match=r"c \[1, 4\]"):
        controls.check(torch.zeros(1, 4, dtype=torch.float64), 3, 0.1)
    with pytest.raises(ValueError, match="parameters' dtype torch.float32, got torch.float64 / torch.float64"):
        controls.check(theta.float(), 3, 0.1)
    mixed = ControlVariates(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, 3, 4, dtype=torch.float32))
    with pytest.raises(ValueError, match="got torch.float64 / torch.float32"):
        mixed.check(theta, 3, 0.1)
    for bad in (0.0, -1.0, torch.tensor([[[0.1]], [[0.0]]])):
        with pytest.raises(ValueError, match="sum to > 0"):
            controls.check(theta, 3, bad)


def test_corrected_direction_adds_the_correction_in_thetas_dtype():
    target = torch.tensor([[1.0, 2.0]], dtype=torch.float32)
    inner = _Affine(target)
    inner.name = "inner"
    correction = torch.tensor([[0.1, -0.2]], dtype=torch.float64)
    corrected = CorrectedDirection(inner, correction)
    assert (corrected.name, corrected.trajectories_per_step, corrected.gamma) == ("inner", 3, 1.0)
    assert corrected.policy is inner.policy and corrected.inner is inner and not corrected.per_agent_state
    theta = torch.tensor([[0.5, 0.5]], dtype=torch.float32)
    out = corrected(lambda at, m: "batch", theta)
    assert out.dtype == torch.float32 and torch.equal(out, (target - theta) + correction.float())


def test_validate_updates_sizes_in_reasons_and_type_errors():
    spreads = torch.tensor([[0.5, float("nan"), 1.0]])
    check = validate_updates(spreads, torch.zeros(1), "spread", extra_dims=0)
    assert check.reasons == ("run 0, agent 1: spread has 1 non-finite values (NaN or inf) of 1",)
    one = validate_updates(torch.tensor([[[float("inf")], [0.0]]]), torch.zeros(1, 1))
    assert one.reasons == ("run 0, agent 0: update has 1 non-finite values (NaN or inf) of 1",)
    assert one.valid.tolist() == [[False, True]]
    empty = validate_updates([], torch.zeros(3))  # a round in which no client answered
    assert empty.valid.dtype == torch.bool and empty.valid.shape == (0,) and empty.all_valid
    with pytest.raises(TypeError, match="like must be a torch.Tensor, got list"):
        validate_updates(torch.ones(1, 2, 3), [0.0])
    with pytest.raises(TypeError, match="sequence of tensors, got int"):
        validate_updates(5, torch.zeros(3))
    with pytest.raises(TypeError, match="sequence of tensors, got str"):
        validate_updates("abc", torch.zeros(3))


# ---------------------------------------------------------------------------------------------
# the server's Adam


def test_adam_on_two_run_axes_equals_the_flattened_runs():
    g = torch.Generator().manual_seed(8)
    theta = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    state = AdamState.zeros_like(theta)
    assert state.step.shape == (2, 3) and state.step.dtype == torch.float64
    assert AdamState.zeros_like(theta.float()).step.dtype == torch.float32
    flat_theta, flat_state = theta.reshape(6, 4), AdamState.zeros_like(theta.reshape(6, 4))
    active = torch.tensor([[True, False, True], [True, True, False]])
    for k in range(3):
        direction = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
        mask = None if k == 0 else active
        theta, state = adam_ascent(theta, direction, state, 0.05, active=mask)
        flat_theta, flat_state = adam_ascent(flat_theta, direction.reshape(6, 4), flat_state, 0.05,
                                             active=None if mask is None else mask.reshape(6))
        assert torch.equal(theta.reshape(6, 4), flat_theta) and torch.equal(state.step.reshape(6), flat_state.step)
        assert torch.equal(state.first.reshape(6, 4), flat_state.first)
        assert torch.equal(state.second.reshape(6, 4), flat_state.second)
    assert state.step.tolist() == [[3.0, 1.0, 3.0], [3.0, 3.0, 1.0]]


def test_adam_defaults_are_torchs_and_shape_errors_name_the_tensors():
    theta0 = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)
    p = torch.nn.Parameter(theta0[0].clone())
    reference = torch.optim.Adam([p], lr=0.1)  # betas (0.9, 0.999), eps 1e-8
    theta, state = theta0.clone(), AdamState.zeros_like(theta0)
    for direction in ([1e-7, -2e-7, 3.0], [2e-7, 1e-7, -1.0], [0.0, 1e-8, 0.5]):
        theta, state = adam_ascent(theta, torch.tensor([direction], dtype=torch.float64), state, 0.1)
        reference.zero_grad()
        p.grad = -torch.tensor(direction, dtype=torch.float64)
        reference.step()
    assert torch.allclose(theta[0], p.detach(), rtol=0, atol=1e-15)
    theta = torch.zeros(2, 3, 4)
    good = AdamState.zeros_like(theta)
    with pytest.raises(ValueError, match="moments"):
        adam_ascent(theta, torch.ones(2, 3, 4), AdamState(good.step, torch.zeros(2, 3, 5), good.second), 0.1)
    with pytest.raises(ValueError, match="moments"):
        adam_ascent(theta, torch.ones(2, 3, 4), AdamState(good.step, good.first, torch.zeros(1, 4)), 0.1)
    with pytest.raises(ValueError, match=r"state.step must have theta's batch shape \(2, 3\), got \(2,\)"):
        adam_ascent(theta, torch.ones(2, 3, 4), AdamState(torch.zeros(2), good.first, good.second), 0.1)
    assert check_server_optimizer("opt", "sgd") == "sgd"
    with pytest.raises(ValueError, match=r"^opt must be one of \('sgd', 'adam'\), got 'Adam'$"):
        check_server_optimizer("opt", "Adam")


# ---------------------------------------------------------------------------------------------
# device routing, on PyTorch's meta device: tensors without data, on which any operation that
# mixes them with CPU tensors raises. A dropped or ``None`` ``device=`` (observable on a GPU
# only, otherwise) leaves a tensor on the CPU, so these tests catch it on a CPU-only machine.
# Only shapes, dtypes and devices can be checked on meta tensors; the values are the other tests'.

META = torch.device("meta")


def test_normalizer_statistics_live_on_its_device():
    norm = ObservationNormalizer((3,), device="meta")
    assert {t.device for t in (norm.mean, norm.var, norm.count, *norm._pending)} == {META}
    # raw observations from the CPU are moved to the statistics' device before they are summed
    norm.accumulate(torch.ones(4, 2, 3), torch.ones(4, 2))
    assert [t.device for t in norm._pending] == [META] * 3 and [tuple(t.shape) for t in norm._pending] == [(), (3,), (3,)]
    # a saved state from the CPU is loaded onto the statistics' device
    norm.load_state_dict(ObservationNormalizer((3,)).state_dict())
    assert {t.device for t in (norm.mean, norm.var, norm.count)} == {META}
    assert {t.dtype for t in (norm.mean, norm.var, norm.count)} == {torch.float64}


def test_normalize_moves_the_statistics_to_the_observations_device():
    norm = ObservationNormalizer((3,))  # statistics on the CPU, observations elsewhere
    out = norm.normalize(torch.zeros(5, 3, device="meta"), torch.float32)
    assert out.device == META and out.dtype == torch.float32 and tuple(out.shape) == (5, 3)


def test_validity_masks_are_on_the_servers_device():
    like = torch.zeros(3, device="meta")
    check = validate_updates([torch.zeros(2), torch.zeros(4)], like, "parameters")  # both of the wrong shape
    assert check.valid.device == META and tuple(check.valid.shape) == (2,)
    batched = validate_updates(torch.zeros(2, 4, 5), torch.zeros(2, 3, device="meta"), "parameters")  # d = 5, not 3
    assert batched.valid.device == META and tuple(batched.valid.shape) == (2, 4)


def test_adam_and_control_variate_states_are_made_on_the_parameters_device():
    state = AdamState.zeros_like(torch.zeros(2, 3, device="meta", dtype=torch.float64))
    assert {t.device for t in state} == {META} and state.step.dtype == torch.float64 and tuple(state.step.shape) == (2,)
    controls = ControlVariates.zeros(2, 3, 4, torch.float64, device="meta")
    assert (controls.server.device, controls.agents.device) == (META, META)
    assert (tuple(controls.server.shape), tuple(controls.agents.shape)) == ((2, 4), (2, 3, 4))


def test_rewards_to_go_are_computed_on_the_rewards_device():
    from fedrl_algos.core.estimators import discounted_rewards_to_go

    out = discounted_rewards_to_go(torch.zeros(2, 5, device="meta", dtype=torch.float64), 0.9)
    assert out.device == META and out.dtype == torch.float64 and tuple(out.shape) == (2, 5)


# ---------------------------------------------------------------------------------------------
# GPOMDP / REINFORCE weights, the estimators' baseline arguments, importance weights: against
# loops over plain Python floats.



def _episodes(batch=(2,), m=3, steps=4, n_states=3, n_actions=2, seed=11) -> tuple[TabularPolicy, Trajectories]:
    """A tabular policy and trajectories with early terminations (padded steps: random actions)."""
    g = torch.Generator().manual_seed(seed)
    terminated = torch.rand(*batch, m, steps, generator=g) < 0.3
    from fedrl_envs.family import alive_mask

    mask = alive_mask(terminated).to(torch.float64)
    rewards = torch.randn(*batch, m, steps, generator=g, dtype=torch.float64) * mask
    obs = torch.randint(0, n_states, (*batch, m, steps), generator=g)
    actions = torch.randint(0, n_actions, (*batch, m, steps), generator=g)
    policy = TabularPolicy(gym.spaces.Discrete(n_states), gym.spaces.Discrete(n_actions), dtype=torch.float64)
    return policy, Trajectories(obs, actions, rewards, mask)


#: the baselines that average over the batch at each time step (``"linear"``: tests/test_linear_baseline.py)
TIME_BASELINES = tuple(b for b in gp.BASELINES if b != "linear")


def _loop_weights(traj: Trajectories, gamma: float, estimator: str, baseline) -> torch.Tensor:
    """ψ by loops: reward-to-go (GPOMDP) or return (REINFORCE) minus the running trajectories' baseline."""
    rewards, mask = traj.rewards.reshape(-1, *traj.rewards.shape[-2:]).tolist(), traj.mask.reshape(-1, *traj.mask.shape[-2:]).tolist()
    out = []
    for row_r, row_m in zip(rewards, mask, strict=True):
        m, steps = len(row_r), len(row_r[0])
        rtg = [[sum(gamma**t * row_r[j][t] * row_m[j][t] for t in range(h, steps)) for h in range(steps)] for j in range(m)]
        value = rtg if estimator == "gpomdp" else [[rtg[j][0]] * steps for j in range(m)]
        row = []
        for j in range(m):
            psi = []
            for h in range(steps):
                # REINFORCE's baseline is over all trajectories (every one runs at h = 0)
                running = [k for k in range(m) if estimator == "reinforce" or row_m[k][h] > 0]
                if baseline is None:
                    b = 0.0
                else:
                    others = [k for k in running if not (baseline == "loo" and k == j)]
                    b = sum(value[k][h] for k in others) / len(others) if others else 0.0
                psi.append((value[j][h] - b) * row_m[j][h])
            row.append(psi)
        out.append(row)
    return torch.tensor(out, dtype=torch.float64).reshape(traj.rewards.shape)


def test_step_weights_of_every_estimator_and_baseline_and_their_defaults():
    _, traj = _episodes()
    for estimator in gp.ESTIMATORS:
        for baseline in TIME_BASELINES:
            expected = _loop_weights(traj, 0.8, estimator, baseline)
            assert torch.allclose(gp.step_weights(traj, 0.8, estimator, baseline), expected, rtol=0, atol=1e-12), (estimator, baseline)
    loo_gpomdp = _loop_weights(traj, 0.8, "gpomdp", "loo")
    assert torch.allclose(gp.step_weights(traj, 0.8), loo_gpomdp, rtol=0, atol=1e-12)  # defaults: GPOMDP, leave-one-out
    assert torch.allclose(gp.gpomdp_weights(traj, 0.8), loo_gpomdp, rtol=0, atol=1e-12)
    assert torch.allclose(gp.reinforce_weights(traj, 0.8), _loop_weights(traj, 0.8, "reinforce", "loo"), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^estimator must be one of \('gpomdp', 'reinforce'\), got 'GPOMDP'$"):
        gp.step_weights(traj, 0.8, "GPOMDP")


def test_gpomdp_and_reinforce_estimates_use_the_baseline_they_are_given():
    policy, traj = _episodes()
    theta = torch.randn(2, policy.n_params, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for baseline in TIME_BASELINES:
        for estimate, name in ((gp.gpomdp, "gpomdp"), (gp.reinforce, "reinforce")):
            expected = policy.score_gradient(theta, traj, _loop_weights(traj, 0.8, name, baseline))
            assert torch.allclose(estimate(policy, theta, traj, 0.8, baseline), expected, rtol=0, atol=1e-12), (name, baseline)
    assert torch.allclose(gp.reinforce(policy, theta, traj, 0.8), gp.reinforce(policy, theta, traj, 0.8, "loo"), rtol=0, atol=0)


def test_normalize_step_weights_divides_by_each_rows_standard_deviation():
    psi = torch.tensor([[[1.0, 3.0, 9.0], [2.0, 4.0, 0.0]],        # row 0: five running steps
                        [[5.0, 0.0, 0.0], [0.0, 0.0, 0.0]],        # row 1: one running step (count 1)
                        [[-2.0, 7.0, 1.0], [4.0, 4.0, 6.0]]], dtype=torch.float64)
    mask = torch.tensor([[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
                         [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
                         [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]], dtype=torch.float64)
    for eps in (1e-8, 0.5):
        expected = []
        for row_psi, row_mask in zip(psi.tolist(), mask.tolist(), strict=True):
            running = [p for ps, ms in zip(row_psi, row_mask, strict=True) for p, k in zip(ps, ms, strict=True) if k > 0]
            mean = sum(running) / len(running)
            std = math.sqrt(sum((p - mean) ** 2 for p in running) / len(running))
            expected.append([[p / (std + eps) for p in ps] for ps in row_psi])
        out = gp.normalize_step_weights(psi, mask, eps)
        assert torch.allclose(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0), eps
    assert torch.equal(gp.normalize_step_weights(psi, mask), gp.normalize_step_weights(psi, mask, 1e-8))


def test_per_trajectory_score_terms_carry_the_trajectory_weights():
    policy, traj = _episodes()
    theta = torch.randn(2, policy.n_params, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    psi = _loop_weights(traj, 0.8, "gpomdp", "loo")
    c = torch.tensor([[0.5, 2.0, -1.0], [3.0, 0.25, 1.5]], dtype=torch.float64)
    plain = gp.score_gradient(policy, theta, traj, psi, per_trajectory=True)  # [2, m, d]
    weighted = gp.score_gradient(policy, theta, traj, psi, c, per_trajectory=True)
    assert torch.allclose(weighted, c.unsqueeze(-1) * plain, rtol=1e-13, atol=1e-15)
    assert torch.allclose(gp.score_gradient(policy, theta, traj, psi, c), (c.unsqueeze(-1) * plain).mean(-2), rtol=1e-12, atol=1e-15)


def test_importance_weight_caps_are_exact_at_their_boundaries():
    big = torch.finfo(torch.float64).max
    w, clipped = gp.importance_weights(torch.tensor([[0.0, 1e6, -3.0]], dtype=torch.float64))
    assert clipped.tolist() == [[False, True, False]]
    assert w[0, 1].item() == math.exp(math.log(big) - 1.0) and w[0, 0].item() == 1.0 and w[0, 2].item() == math.exp(-3.0)
    cap = math.log(2.0)
    w, clipped = gp.importance_weights(torch.tensor([[cap, cap + 1e-9, 0.0]], dtype=torch.float64), max_weight=2.0)
    assert clipped.tolist() == [[False, True, False]]  # a weight equal to the cap is not truncated
    assert w.tolist() == [[math.exp(cap), math.exp(cap), 1.0]]


def test_self_normalized_weights_average_to_one_over_the_trajectory_axis_of_any_batch():
    log_w = torch.tensor([[[0.0, 1.0, 2.0], [-1.0, 0.5, 3.0]], [[4.0, 4.0, 0.0], [0.0, 0.0, 0.0]]], dtype=torch.float64)  # [2, 2, m=3]
    w, clipped = gp.importance_weights(log_w, self_normalize=True)
    expected = [[[3 * math.exp(x) / sum(math.exp(y) for y in row) for x in row] for row in block] for block in log_w.tolist()]
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)
    assert not clipped.any()


def test_paired_importance_weights_count_only_the_running_steps():
    policy, traj = _episodes(seed=12)
    g = torch.Generator().manual_seed(6)
    theta = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    theta_prev = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    psi = _loop_weights(traj, 0.8, "gpomdp", None)
    assert (traj.mask == 0).any()
    _, _, w, clipped = gp.paired_gradients(policy, theta, theta_prev, traj, psi)
    probs_now = torch.softmax(theta.reshape(2, 3, 2), -1)
    probs_prev = torch.softmax(theta_prev.reshape(2, 3, 2), -1)
    expected = []
    for b in range(2):
        row = []
        for j in range(3):
            log_w = sum(
                math.log(probs_prev[b, s, a]) - math.log(probs_now[b, s, a])
                for s, a, k in zip(traj.obs[b, j].tolist(), traj.actions[b, j].tolist(), traj.mask[b, j].tolist(), strict=True)
                if k > 0
            )
            row.append(math.exp(log_w))
        expected.append(row)
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0) and not clipped.any()


def test_time_baseline_defaults_to_leave_one_out():
    _, traj = _episodes()
    values = torch.randn(traj.mask.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    assert torch.equal(gp.time_baseline(values, traj.mask), gp.time_baseline(values, traj.mask, "loo"))
    assert not torch.allclose(gp.time_baseline(values, traj.mask), gp.time_baseline(values, traj.mask, "mean"))


def test_score_function_gradient_checks_m_and_normalizes_over_the_running_steps():
    policy, traj = _episodes()
    theta = torch.randn(2, policy.n_params, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    one = gp.ScoreFunctionGradient(policy, 0.8, 1)  # a single trajectory is a valid batch
    assert one.trajectories_per_step == 1 and one.m == 1
    for bad in (0, -2, 1.0, True):
        with pytest.raises(ValueError, match=rf"^m must be an int >= 1, got {bad!r}$"):
            gp.ScoreFunctionGradient(policy, 0.8, bad)
    estimator = gp.ScoreFunctionGradient(policy, 0.8, 3, "reinforce", "mean", normalize_advantage=True)
    psi = _loop_weights(traj, 0.8, "reinforce", "mean")
    assert torch.allclose(estimator.weights(traj), gp.normalize_step_weights(psi, traj.mask), rtol=1e-14, atol=0)
    # the standard deviation is over the running steps only: not over every step of the block
    assert not torch.allclose(estimator.weights(traj), gp.normalize_step_weights(psi, torch.ones_like(traj.mask)))
    assert torch.allclose(estimator(lambda th, m: traj, theta), policy.score_gradient(theta, traj, estimator.weights(traj)), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# the trajectory batch and its checks


def test_trajectory_returns_are_the_discounted_sums_of_the_running_steps():
    _, traj = _episodes(batch=(2, 2), m=3, steps=5, seed=13)
    for gamma in (None, 0.5, 0.9):
        expected = [
            sum((1.0 if gamma is None else gamma) ** t * r * k for t, (r, k) in enumerate(zip(rs, ks, strict=True)))
            for rs, ks in zip(traj.rewards.reshape(-1, 5).tolist(), traj.mask.reshape(-1, 5).tolist(), strict=True)
        ]
        out = traj.returns() if gamma is None else traj.returns(gamma)
        assert out.dtype == torch.float64 and tuple(out.shape) == (2, 2, 3)
        assert torch.allclose(out.reshape(-1), torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=1e-15), gamma
    on_meta = Trajectories(traj.obs, traj.actions, traj.rewards.to("meta"), traj.mask.to("meta")).returns(0.9)
    assert on_meta.device == META and tuple(on_meta.shape) == (2, 2, 3)


def test_rollout_batch_checks_name_what_they_expected():
    from fedrl_algos.core.trajectories import check_rollout_batch
    from fedrl_envs import RandomStreams

    streams = RandomStreams(torch.zeros(2, 3, dtype=torch.int64))
    assert check_rollout_batch(torch.zeros(2, 3, 5), streams, 4) == 4
    with pytest.raises(ValueError, match=r"^streams must have batch shape \(3, 2\) \(that of theta\), got \(2, 3\)$"):
        check_rollout_batch(torch.zeros(3, 2, 5), streams, 4)
    with pytest.raises(ValueError, match=r"^n_trajectories must be >= 1, got 0$"):
        check_rollout_batch(torch.zeros(2, 3, 5), streams, 0)


def test_log_likelihood_jvp_is_in_the_parameters_dtype():
    from fedrl_algos.core.score_calculus import log_likelihood_jvp

    policy = TabularPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2), dtype=torch.float32)
    _, traj = _episodes()
    g = torch.Generator().manual_seed(10)
    theta = torch.randn(2, policy.n_params, generator=g)
    v = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64) / 3  # a float64 direction
    out = log_likelihood_jvp(policy, theta, traj, v)
    assert out.dtype == torch.float32 and torch.equal(out, log_likelihood_jvp(policy, theta, traj, v.float()))


# ---------------------------------------------------------------------------------------------
# attacks: every attack's report against its formula written out with plain Python floats, the
# random numbers taken from a copy of the streams the attack is handed.



def _streams(shape: tuple[int, ...], seed: int = 0) -> RandomStreams:
    return RandomStreams(derive_keys(seed, torch.arange(math.prod(shape)).reshape(shape)))


def _copy(streams: RandomStreams) -> RandomStreams:
    twin = RandomStreams(streams.keys.clone())
    twin.load_state_dict(streams.state_dict())
    return twin


def test_random_noise_is_uniform_noise_in_units_of_each_gradients_range():
    assert atk.RandomNoise().scale == 3.0 and repr(atk.RandomNoise(2.0)) == "RandomNoise(scale=2.0)"
    grad = torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.0, 1.0], [-2.0, -2.5, 4.0]], dtype=torch.float64)
    byzantine = torch.tensor([1, 0, 1])  # an integer mask is a mask too
    streams = _streams((3,))
    u = _copy(streams).uniform((3,), dtype=torch.float64).tolist()
    out = atk.RandomNoise().gradient(grad, byzantine, streams)
    for i, row in enumerate(grad.tolist()):
        span = (max(row) - min(row)) * 3.0
        expected = [g + (2 * ui - 1) * span for g, ui in zip(row, u[i], strict=True)] if byzantine[i] else row
        assert out[i].tolist() == pytest.approx(expected, rel=1e-15, abs=1e-15), i


def _fedscspg_by_hand(grad: torch.Tensor, bad: torch.Tensor, streams: RandomStreams, scale: float) -> list:
    u = (2 * _copy(streams).uniform((grad.shape[-1],), dtype=grad.dtype) - 1).tolist()
    out = []
    for r, (rows, flags) in enumerate(zip(grad.tolist(), bad.tolist(), strict=True)):
        colluders = [i for i, f in enumerate(flags) if f]
        mean = [sum(rows[i][k] for i in colluders) / len(colluders) for k in range(len(rows[0]))]
        two_sigma = max(math.dist(rows[i], rows[j]) for i in colluders for j in colluders)
        first = u[r][colluders[0]]
        norm = math.sqrt(sum(x * x for x in first))
        forged = [mu + x / norm * two_sigma * scale / 2 for mu, x in zip(mean, first, strict=True)]
        out.append([forged if f else row for row, f in zip(rows, flags, strict=True)])
    return out


def test_fedscspg_colluders_report_their_mean_plus_a_shared_direction_of_their_spread():
    g = torch.Generator().manual_seed(21)
    grad = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    bad = torch.tensor([[False, True, False, True, True, False],   # the first colluder is agent 1
                        [False, False, False, False, True, False],  # a single colluder: 2σ̂ = 0
                        [True, False, True, False, False, True]])
    streams = _streams((3, 6))
    expected = _fedscspg_by_hand(grad, bad, streams, 2.5)
    out = atk.FedScsPGAttack(2.5).gradient(grad, bad, streams)
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-13, atol=1e-15)
    assert atk.FedScsPGAttack().scale == 3.0


def test_fedscspg_spread_is_exact_for_many_close_colluders():
    # 27 colluders: torch.cdist would switch to its matrix-product formula, which cancels
    # catastrophically for gradients this close to each other.
    g = torch.Generator().manual_seed(22)
    grad = 1e4 + torch.randn(1, 30, 3, generator=g, dtype=torch.float64) * 1e-3
    bad = torch.zeros(1, 30, dtype=torch.bool)
    bad[0, 2:29] = True
    streams = _streams((1, 30))
    expected = torch.tensor(_fedscspg_by_hand(grad, bad, streams, 3.0), dtype=torch.float64)
    out = atk.FedScsPGAttack().gradient(grad, bad, streams)
    assert torch.allclose(out - 1e4, expected - 1e4, rtol=1e-9, atol=0)


class _StayPolicy:
    """A stand-in policy that always takes action 0 (or the zero vector) and draws nothing."""

    def __init__(self, space, dtype=torch.int64):
        self.action_space, self.dtype = space, dtype

    def sample(self, theta, obs, streams):
        shape = (*streams.keys.shape, obs.shape[streams.keys.dim()], *(self.action_space.shape or ()))
        return torch.zeros(shape, dtype=self.dtype)


def test_random_action_policy_draws_uniform_actions_on_byzantine_rows_only():
    byzantine = torch.tensor([[True], [False], [True]])  # [agents, 1]: over every trajectory
    obs = torch.zeros(3, 5, 2)
    streams = _streams((3,))
    u = _copy(streams).uniform((5,), dtype=torch.float64)
    out = atk.RandomActionPolicy(_StayPolicy(gym.spaces.Discrete(4)), byzantine).sample(None, obs, streams)
    assert out.dtype == torch.int64
    assert out.tolist() == [[min(int(x * 4), 3) for x in u[0].tolist()], [0] * 5, [min(int(x * 4), 3) for x in u[2].tolist()]]
    # Box actions: uniform in the bounds, in the action's dtype (a float64 space, float32 actions)
    box = gym.spaces.Box(np.array([-1.0, 0.1]), np.array([2.0, 0.7]), dtype=np.float64)
    streams = _streams((3,), seed=1)
    u = _copy(streams).uniform((5, 2), dtype=torch.float32)
    out = atk.RandomActionPolicy(_StayPolicy(box, torch.float32), byzantine).sample(None, obs, streams)
    low, high = torch.tensor([-1.0, 0.1], dtype=torch.float32), torch.tensor([2.0, 0.7], dtype=torch.float32)
    assert out.dtype == torch.float32
    assert torch.equal(out[0], low + (high - low) * u[0]) and torch.equal(out[2], low + (high - low) * u[2])
    assert torch.equal(out[1], torch.zeros(5, 2))
    # a float64 policy on a float32 space draws float64 uniforms
    streams = _streams((3,), seed=2)
    u64 = _copy(streams).uniform((5, 2), dtype=torch.float64)
    box32 = gym.spaces.Box(-1.0, 2.0, (2,), dtype=np.float32)
    out = atk.RandomActionPolicy(_StayPolicy(box32, torch.float64), byzantine).sample(None, obs, streams)
    assert out.dtype == torch.float64 and torch.equal(out[0], -1.0 + 3.0 * u64[0])


def test_forged_spreads_pass_every_hook_to_the_attack_they_wrap():
    default = atk.ForgedSpread()
    assert default.factor == 1000.0 and isinstance(default.attack, atk.SignFlip) and default.name == "forged_spread"
    assert atk.ForgedSpread(2.0, "sign_flip", name="doubled").name == "doubled"
    huge, tiny = atk.HugeSpread(), atk.TinySpread()
    assert (huge.factor, tiny.factor) == (1e3, 1e-3) and isinstance(huge.attack, atk.SignFlip) and isinstance(tiny.attack, atk.SignFlip)
    mask = torch.tensor([True, False, True])
    acting = atk.ForgedSpread(2.0, "random_action").policy(_StayPolicy(gym.spaces.Discrete(2)), mask)
    assert isinstance(acting, atk.RandomActionPolicy) and acting._byzantine is mask
    grad = torch.tensor([[1.0, 2.0], [3.0, -4.0], [0.5, 0.5]], dtype=torch.float64)
    streams = _streams((3,))
    noisy = atk.ForgedSpread(2.0, "random_noise").gradient(grad, mask, streams)
    assert torch.equal(noisy, atk.RandomNoise().gradient(grad, mask, _streams((3,))))
    nested = atk.ForgedSpread(2.0, atk.ForgedSpread(3.0, "sign_flip"))
    spread = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    assert nested.spread(spread, mask, streams).tolist() == [6.0, 2.0, 24.0]
    assert "factor=2.0" in repr(nested) and "ForgedSpread(factor=3.0" in repr(nested)


def test_attack_streams_are_the_agents_keys_salted_and_mixed():
    streams = _streams((2, 3))
    derived = atk.attack_streams(streams)
    assert torch.equal(derived.keys, mix64(streams.keys ^ 0x5A17_A77A_C4)) and derived.device == streams.device
    assert torch.equal(derived.counters, torch.zeros(2, 3, dtype=torch.int64))


def test_attacked_estimator_acts_reports_and_draws_as_its_attack():
    policy = TabularPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2), dtype=torch.float64)
    inner = PolicyGradient(policy, 0.8, 2)
    attacked = atk.AttackedEstimator(inner, "random_noise", [True, False, True])
    assert attacked.policy is policy and attacked.gamma == 0.8 and attacked.byzantine.dtype == torch.bool
    assert attacked.name == "pg+random_noise" and attacked.trajectories_per_step == 2

    class Sampler:
        def __init__(self, policy):
            self.policy, self.streams = policy, _streams((3,))

        def with_policy(self, policy):
            self.acting = policy
            return lambda theta, m: _episodes(batch=(3,), m=m, seed=30)[1]

    sampler = Sampler(policy)
    theta = torch.zeros(3, policy.n_params, dtype=torch.float64)
    noise = atk.attack_streams(sampler.streams)
    honest = policy_gradient(policy, theta, _episodes(batch=(3,), m=2, seed=30)[1], 0.8)
    for _ in range(2):  # the attack's noise streams continue from one call to the next
        out = attacked(sampler, theta)
        assert torch.equal(out, atk.RandomNoise().gradient(honest, torch.tensor([True, False, True]), noise))
    random_actions = atk.AttackedEstimator(inner, "random_action", torch.tensor([True, False, True]))
    random_actions(sampler, theta)
    assert isinstance(sampler.acting, atk.RandomActionPolicy)
    assert sampler.acting._byzantine.tolist() == [[True], [False], [True]]  # rows broadcast over trajectories


# ---------------------------------------------------------------------------------------------
# adaptation baselines and the curvature estimators' autograd path


def test_adaptation_baseline_checks_name_the_argument_they_were_given():
    from fedrl_algos.core.adaptation import adaptation_weights, check_adaptation_baseline

    with pytest.raises(TypeError, match=r"^adaptation_baseline must be None or one of \('loo', 'mean', 'linear'\), got int$"):
        check_adaptation_baseline(3)
    with pytest.raises(ValueError, match=r"^inner_baseline must be one of \(None, 'loo', 'mean', 'linear'\), got 'LOO'$"):
        check_adaptation_baseline("LOO", "inner_baseline")
    _, traj = _episodes()
    with pytest.raises(ValueError, match=r"^baseline must be one of \(None, 'loo', 'mean', 'linear'\), got 'median'$"):
        adaptation_weights(traj, 0.8, "median")
    for baseline in (None, "loo", "mean"):
        expected = _loop_weights(traj, 0.8, "gpomdp", baseline)
        assert torch.allclose(adaptation_weights(traj, 0.8, baseline), expected, rtol=0, atol=1e-12), baseline


def test_autograd_curvature_of_the_paper_is_the_autograd_hvp_and_in_the_parameters_dtype():
    from fedrl_algos.core.curvature import autograd_curvature_hvp, curvature_weights
    from fedrl_algos.core.estimators import autograd_hvp

    policy, traj = _episodes()
    g = torch.Generator().manual_seed(23)
    theta = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    v = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    weights = curvature_weights(traj, 0.8, "paper")
    assert torch.equal(autograd_curvature_hvp(policy, theta, traj, v, weights, "paper"), autograd_hvp(policy, theta, traj, v, weights))
    policy32 = TabularPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2), dtype=torch.float32)
    for coupling in ("causal", "lvc"):
        out = autograd_curvature_hvp(policy32, theta.float(), traj, v / 3, weights.float(), coupling)
        assert out.dtype == torch.float32
        assert torch.equal(out, autograd_curvature_hvp(policy32, theta.float(), traj, (v / 3).float(), weights.float(), coupling)), coupling


class _RecordingTabular(TabularPolicy):
    """The tabular softmax, recording which of its closed forms were asked for."""

    def __init__(self):
        super().__init__(gym.spaces.Discrete(3), gym.spaces.Discrete(2), dtype=torch.float64)
        self.asked = []

    def hvp(self, theta, traj, v, weights):
        self.asked.append("hvp")
        return super().hvp(theta, traj, v, weights)

    def curvature_hvp(self, theta, traj, v, weights, coupling):
        self.asked.append(coupling)
        return super().curvature_hvp(theta, traj, v, weights, coupling)


def test_curvature_products_use_the_closed_form_unless_told_otherwise():
    from fedrl_algos.core.curvature import (
        autograd_curvature_hvp,
        curvature_hvp,
        curvature_vector_product,
        curvature_weights,
    )
    from fedrl_algos.core.estimators import autograd_hvp, hessian_vector_product, reward_to_go_weights

    policy = _RecordingTabular()
    _, traj = _episodes()
    g = torch.Generator().manual_seed(24)
    theta = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    v = torch.randn(2, policy.n_params, generator=g, dtype=torch.float64)
    # the default curvature is the paper's, eq. (3): exactly hessian_vector_product
    assert torch.equal(curvature_vector_product(policy, theta, traj, v, 0.8), hessian_vector_product(policy, theta, traj, v, 0.8))
    assert policy.asked == ["hvp", "paper"] * 2  # the tabular hvp is its curvature product with the paper's coupling
    policy.asked.clear()
    assert torch.equal(curvature_vector_product(policy, theta, traj, v, 0.8, "paper", closed_form=False),
                       autograd_hvp(policy, theta, traj, v, reward_to_go_weights(traj, 0.8)))
    assert policy.asked == []
    weights = curvature_weights(traj, 0.8, "causal")
    assert torch.equal(curvature_vector_product(policy, theta, traj, v, 0.8, "causal", closed_form=False),
                       autograd_curvature_hvp(policy, theta, traj, v, weights, "causal"))
    assert torch.equal(curvature_hvp(policy, theta, traj, v, weights, "causal", closed_form=False),
                       autograd_curvature_hvp(policy, theta, traj, v, weights, "causal"))
    assert policy.asked == []
    closed = curvature_hvp(policy, theta, traj, v, weights, "lvc")
    assert policy.asked == ["lvc"]
    assert torch.allclose(closed, autograd_curvature_hvp(policy, theta, traj, v, weights, "lvc"), rtol=1e-10, atol=1e-13)
    assert torch.equal(curvature_vector_product(policy, theta, traj, v, 0.8, "lvc"), closed) and policy.asked == ["lvc", "lvc"]


# ---------------------------------------------------------------------------------------------
# samplers: batched against looped, the normalizer's path, and the policies' fast plans


def test_generic_rollout_of_a_batch_equals_its_rows_rolled_out_alone():
    from fedrl_algos.core.sampling import generic_rollout
    from fedrl_algos.policies import MlpPolicy
    from fedrl_envs import PENDULUM, stack_params

    tasks = PENDULUM.train_tasks[:3]
    policy = MlpPolicy(PENDULUM.observation_space(tasks[0]), PENDULUM.action_space(tasks[0]), dtype=torch.float64)
    theta = policy.theta.detach() + 0.1 * torch.randn(3, policy.n_params, generator=torch.Generator().manual_seed(25), dtype=torch.float64)
    keys = derive_keys(3, torch.arange(3))
    batched = generic_rollout(PENDULUM, stack_params(tasks), policy, theta, RandomStreams(keys), 2, 9)
    assert batched.actions.shape == (3, 2, 10, 1) and batched.rewards.shape[-1] == 10  # no early stop by default
    for i in range(3):
        alone = generic_rollout(PENDULUM, stack_params([tasks[i]]), policy, theta[i : i + 1], RandomStreams(keys[i : i + 1]), 2, 9)
        for name in ("obs", "actions", "rewards", "mask"):
            assert torch.equal(getattr(alone, name)[0], getattr(batched, name)[i]), (i, name)


def test_generic_rollout_normalizes_what_the_policy_sees_and_counts_only_running_steps():
    from fedrl_algos.core.normalization import ObservationNormalizer
    from fedrl_algos.core.sampling import generic_rollout
    from fedrl_algos.policies import MlpPolicy
    from fedrl_envs import CARTPOLE, stack_params

    tasks = CARTPOLE.train_tasks[:2]
    policy = MlpPolicy(CARTPOLE.observation_space(tasks[0]), CARTPOLE.action_space(tasks[0]), dtype=torch.float64)
    theta = policy.theta.detach().expand(2, -1)
    keys = derive_keys(4, torch.arange(2))
    raw = generic_rollout(CARTPOLE, stack_params(tasks), policy, theta, RandomStreams(keys), 3, 59)
    assert bool((raw.mask == 0).any())  # some poles fall: the steps after that must not count
    norm = ObservationNormalizer((4,))
    norm.var = torch.full((4,), 1.0 - 1e-8, dtype=torch.float64)  # an identity map: the policy acts as on raw observations
    assert bool((norm.var + norm.eps == 1.0).all())
    shown = []
    inner = policy.sample

    def recording(th, obs, streams):
        shown.append(obs)
        return inner(th, obs, streams)

    policy.sample = recording
    seen = generic_rollout(CARTPOLE, stack_params(tasks), policy, theta, RandomStreams(keys), 3, 59, normalizer=norm)
    assert [float(p.abs().sum()) for p in norm._pending] == [0.0, 0.0, 0.0]  # update_normalizer is off by default
    assert torch.equal(seen.obs, norm.normalize(raw.obs, torch.float64)) and torch.equal(seen.actions, raw.actions)
    assert all(o.dtype == torch.float64 for o in shown) and len(shown) == 60
    generic_rollout(CARTPOLE, stack_params(tasks), policy, theta, RandomStreams(keys), 3, 59, normalizer=norm, update_normalizer=True)
    alive = (raw.mask > 0).unsqueeze(-1).to(torch.float64)
    assert norm._pending[0].item() == raw.mask.sum().item()
    assert torch.allclose(norm._pending[1], (raw.obs.to(torch.float64) * alive).sum((0, 1, 2)), rtol=1e-12, atol=1e-12)
    assert torch.allclose(norm._pending[2], (raw.obs.to(torch.float64) ** 2 * alive).sum((0, 1, 2)), rtol=1e-12, atol=1e-12)


class _PlannedTabular(TabularPolicy):
    """The tabular softmax with a fake fast plan, recording what it was asked."""

    def __init__(self, answer: Trajectories | None):
        super().__init__(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)
        self.answer, self.plans, self.calls = answer, [], []

    def kernel_rollout_plan(self, family, params):
        self.plans.append((family, params))

        def plan(theta, streams, m, horizon, stop_when_done):
            self.calls.append((m, horizon, stop_when_done))
            return self.answer

        return plan


def test_rollouts_take_the_policys_fast_plan_once_and_hand_it_every_argument():
    from fedrl_algos.core.normalization import ObservationNormalizer
    from fedrl_algos.core.sampling import KernelSampler, rollout
    from fedrl_envs import GRIDWORLD, stack_params

    params = stack_params(GRIDWORLD.train_tasks[:2])
    answer = Trajectories(torch.zeros(2, 1, 1, dtype=torch.long), torch.zeros(2, 1, 1, dtype=torch.long),
                          torch.zeros(2, 1, 1, dtype=torch.float64), torch.ones(2, 1, 1, dtype=torch.float64))
    policy = _PlannedTabular(answer)
    theta = torch.zeros(2, 100, dtype=torch.float64)
    assert rollout(GRIDWORLD, params, policy, theta, RandomStreams(derive_keys(0, torch.arange(2))), 3, 7, stop_when_done=True) is answer
    assert policy.calls == [(3, 7, True)]
    sampler = KernelSampler(GRIDWORLD, params, policy, RandomStreams(derive_keys(0, torch.arange(2))), stop_when_done=True)
    assert sampler(theta, 2) is answer and sampler(theta, 4) is answer
    assert len(policy.plans) == 2 and policy.calls[1:] == [(2, 15, True), (4, 15, True)]  # planned once, the family's horizon
    sampler.horizon = 5
    assert sampler(theta, 1) is answer and policy.calls[-1] == (1, 5, True)
    from fedrl_envs.gridworld import GridWorldFamily

    sampler(theta, 1)
    assert len(policy.plans) == 2  # the same family, params and policy objects: the kept plan
    # a reassigned family, params or policy (another object, even an equal one) is planned anew
    for attribute, value in (("params", stack_params(GRIDWORLD.train_tasks[:2])), ("family", GridWorldFamily())):
        before = len(policy.plans)
        setattr(sampler, attribute, value)
        sampler(theta, 1)
        assert len(policy.plans) == before + 1 and policy.plans[-1] == (sampler.family, sampler.params), attribute
    sampler.policy = _PlannedTabular(answer)
    sampler(theta, 1)
    assert len(sampler.policy.plans) == 1 and sampler._plan[2] is sampler.policy
    # a plan that declines (None) falls back to the kernels; a normalizer never uses the plan
    policy = _PlannedTabular(None)
    traj = rollout(GRIDWORLD, params, policy, theta, RandomStreams(derive_keys(0, torch.arange(2))), 3, 7)
    assert traj.obs.shape == (2, 3, 8) and policy.calls == [(3, 7, False)]
    normalized = KernelSampler(GRIDWORLD, params, _PlannedTabular(answer), RandomStreams(derive_keys(0, torch.arange(2))),
                               normalizer=ObservationNormalizer(()))
    assert normalized(theta, 2) is not answer and normalized.policy.calls == []


def test_kernel_sampler_without_a_plan_forwards_its_normalizer_and_early_stop():
    from fedrl_algos.core.normalization import ObservationNormalizer
    from fedrl_algos.core.sampling import KernelSampler, generic_rollout
    from fedrl_algos.policies import MlpPolicy
    from fedrl_envs import CARTPOLE, stack_params

    params = stack_params(CARTPOLE.train_tasks[:2])
    policy = MlpPolicy(CARTPOLE.observation_space(CARTPOLE.train_tasks[0]), CARTPOLE.action_space(CARTPOLE.train_tasks[0]),
                       dtype=torch.float64)
    theta = policy.theta.detach().expand(2, -1)
    keys = derive_keys(5, torch.arange(2))
    full = generic_rollout(CARTPOLE, params, policy, theta, RandomStreams(keys), 3, 199)
    assert full.rewards.shape[-1] == 200 and bool((full.mask[..., -1] == 0).all())  # no early stop unless asked
    raw = generic_rollout(CARTPOLE, params, policy, theta, RandomStreams(keys), 3, 199, stop_when_done=True)
    assert raw.rewards.shape[-1] < 200 and torch.equal(raw.rewards, full.rewards[..., : raw.rewards.shape[-1]])
    norm = ObservationNormalizer((4,))
    norm.var = torch.full((4,), 1.0 - 1e-8, dtype=torch.float64)  # identity map, as above
    sampler = KernelSampler(CARTPOLE, params, policy, RandomStreams(keys), horizon=199, stop_when_done=True, normalizer=norm,
                            update_normalizer=True)
    traj = sampler(theta, 3)
    assert traj.rewards.shape == raw.rewards.shape and torch.equal(traj.actions, raw.actions)
    assert torch.equal(traj.obs, norm.normalize(raw.obs, torch.float64))
    assert norm._pending[0].item() == raw.mask.sum().item()


def test_score_function_gradient_rejects_a_bad_baseline_and_is_named_after_its_estimator():
    policy, _ = _episodes()
    with pytest.raises(ValueError, match=r"^baseline must be one of \('loo', 'mean', None, 'linear'\), got 'median'$"):
        gp.ScoreFunctionGradient(policy, 0.8, 2, "gpomdp", "median")
    assert gp.ScoreFunctionGradient(policy, 0.8, 2).name == "gpomdp"
    assert gp.ScoreFunctionGradient(policy, 0.8, 2, "reinforce").name == "reinforce"


def test_random_reward_permutes_each_episodes_running_rewards_only():
    _, traj = _episodes(batch=(3,), m=2, steps=6, seed=31)
    assert bool((traj.mask == 0).any()) and bool((traj.mask[..., 0] == 1).all())
    byzantine = torch.tensor([True, False, True])
    streams = _streams((3,))
    u = _copy(streams).uniform((2, 6), dtype=torch.float64)
    out = atk.RandomReward().trajectories(traj, byzantine, streams)
    for b in range(3):
        for j in range(2):
            rewards, alive = traj.rewards[b, j].tolist(), int(traj.mask[b, j].sum())
            order = sorted(range(alive), key=lambda t: u[b, j, t].item()) if byzantine[b] else list(range(alive))
            assert out.rewards[b, j].tolist() == [rewards[t] for t in order] + [0.0] * (6 - alive), (b, j)
    assert torch.equal(out.obs, traj.obs) and torch.equal(out.mask, traj.mask)
    with pytest.raises(ValueError, match=r"^RandomReward needs random streams \(the agents' attack streams\) to shuffle rewards$"):
        atk.RandomReward().trajectories(traj, byzantine)
    forged = atk.ForgedSpread(2.0, atk.RandomReward()).trajectories(traj, byzantine, _streams((3,)))
    assert torch.equal(forged.rewards, out.rewards)
    assert repr(atk.ForgedSpread(2.0, "sign_flip")) == "ForgedSpread(factor=2.0, attack=SignFlip(scale=-2.5))"


def test_fedscspg_and_random_actions_with_two_run_axes_and_a_shared_mask():
    g = torch.Generator().manual_seed(32)
    grad = torch.randn(2, 2, 5, 3, generator=g, dtype=torch.float64)  # [R1, R2, n, d]
    bad = torch.tensor([[[False, True, True, False, False], [True, False, False, True, True]],
                        [[False, False, True, True, True], [False, True, False, False, True]]])
    streams = _streams((2, 2, 5))
    expected = _fedscspg_by_hand(grad.reshape(4, 5, 3), bad.reshape(4, 5), RandomStreams(streams.keys.reshape(4, 5)), 3.0)
    out = atk.FedScsPGAttack().gradient(grad, bad, streams)
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float64).reshape(2, 2, 5, 3), rtol=1e-13, atol=1e-15)
    # one mask over the agents, shared by every run
    shared = torch.tensor([False, True, False, True, True])
    out = atk.FedScsPGAttack().gradient(grad[0], shared, _streams((2, 5)))
    expected = _fedscspg_by_hand(grad[0], shared.expand(2, 5), _streams((2, 5)), 3.0)
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-13, atol=1e-15)
    # random discrete actions come back in the wrapped policy's integer dtype
    policy = _StayPolicy(gym.spaces.Discrete(3), torch.int32)
    acts = atk.RandomActionPolicy(policy, torch.tensor([[True], [False]])).sample(None, torch.zeros(2, 4, 1), _streams((2,)))
    assert acts.dtype == torch.int32 and acts[1].tolist() == [0] * 4


# ---------------------------------------------------------------------------------------------
# federation: seeds and stream ids, agent selection, evaluation and adaptation
# ---------------------------------------------------------------------------------------------
_GRID_PARAMS = stack_params(GRIDWORLD.train_tasks)
_LOW62 = 1 << 62


def _grid_policy() -> TabularPolicy:
    task = GRIDWORLD.train_tasks[0]
    return TabularPolicy(GRIDWORLD.observation_space(task), GRIDWORLD.action_space(task), dtype=torch.float64)


def _grid_fed(seeds=(3,), **kwargs) -> fd.Federation:
    return fd.Federation(GRIDWORLD, _GRID_PARAMS, _grid_policy(), torch.tensor(list(seeds)), **kwargs)


def _grid_theta(runs: int) -> torch.Tensor:
    return torch.randn(runs, 100, generator=torch.Generator().manual_seed(11), dtype=torch.float64)


def test_env_stream_ids_and_combined_seeds_are_the_keys_modulo_two_to_the_62():
    seeds = [0, 7, -5, 2**40 + 3]
    ids = fd.run_env_stream_ids(seeds, 25, offset=9)
    expected = [int(derive_keys(s, i + 9).item()) % _LOW62 for s in seeds for i in range(25)]
    assert ids == expected
    assert fd.run_env_stream_ids(np.array(seeds[:3], dtype=np.int32), 25, offset=9) == expected[:75]
    assert fd.run_env_stream_ids(seeds[:1], 4) == [int(derive_keys(0, i).item()) % _LOW62 for i in range(4)]
    # the top bits are where a wrong mask shows: some keys have bit 62 or 63 set, some are odd/even
    raw = [int(derive_keys(s, i + 9).item()) for s in seeds for i in range(25)]
    assert any(k < 0 for k in raw) and any((k >> 62) & 1 for k in raw) and any(k & 1 for k in ids) and any(not k & 1 for k in ids)
    for seed, salt in [(0, 1), (5, 2**41), (-3, 7), (2**62, 11)] + [(s, 3) for s in range(20)]:
        assert fd.combine_seed(seed, salt) == int(derive_keys(seed, salt).item()) % _LOW62
    assert {fd.combine_seed(s, 3) & 1 for s in range(20)} == {0, 1}
    assert any(int(derive_keys(s, 3).item()) < 0 for s in range(20))


def test_run_keys_of_a_slice_of_agents_are_those_columns_of_the_whole_federation():
    seeds = torch.tensor([4, 9])
    whole = fd.run_keys(seeds, 6, offset=fd._EVAL_STREAM)
    for ids in ([3, 5], np.array([3, 5], dtype=np.int32), torch.tensor([[3], [5]], dtype=torch.int32), (3.0, 5.0)):
        part = fd.run_keys(seeds, 2, offset=fd._EVAL_STREAM, agent_ids=ids)
        assert part.dtype == torch.int64 and torch.equal(part, whole[:, [3, 5]]), ids
    assert torch.equal(fd.run_keys(seeds, 3, offset=2), derive_keys(seeds.reshape(-1, 1), torch.arange(3).reshape(1, -1) + 2))


def test_federation_stores_its_seeds_and_agent_ids_as_int64_and_keys_the_slice_like_the_whole():
    fed = _grid_fed((3, 4), agent_ids=None)
    assert fed.device == torch.device("cpu") and fed.seeds.dtype == torch.int64
    narrow = fd.Federation(GRIDWORLD, stack_params(GRIDWORLD.train_tasks[2:4]), _grid_policy(), np.array([3, 4], dtype=np.int32),
                           agent_ids=np.array([[2], [3]], dtype=np.int32))
    assert narrow.seeds.dtype == torch.int64 and torch.equal(narrow.seeds, torch.tensor([3, 4]))
    assert narrow.agent_ids.dtype == torch.int64 and narrow.agent_ids.tolist() == [2, 3]
    assert torch.equal(narrow.streams.keys, fed.streams.keys[:, 2:4])
    assert torch.equal(narrow.eval_streams.keys, fed.eval_streams.keys[:, 2:4])
    with pytest.raises(ValueError, match=r"^agent_ids must have one index per agent \(2\), got 3$"):
        fd.Federation(GRIDWORLD, stack_params(GRIDWORLD.train_tasks[2:4]), _grid_policy(), [3], agent_ids=[1, 2, 3])


def _grid_env(n_agents: int = 2):
    from fedrl_wrappers import FederatedVecEnv

    return FederatedVecEnv("fedrl/GridWorld-v0", 2, agents=list(range(n_agents)), seed=0)


def test_from_env_passes_every_argument_through():
    env, eval_env, policy = _grid_env(), _grid_env(), _grid_policy()
    fed = fd.Federation.from_env(env, policy, 5, 0.5)
    assert fed.gamma == 0.5 and fed.env_reset_seed == 5 and fed.agent_ids is None and fed.stop_when_done is False
    assert fed.sampler.env is env and fed.eval_sampler.env is env and fed.sampler.stop_when_done is False
    assert fed.sampler.env_seed == 5 and fed.eval_sampler.env_seed == fd.combine_seed(5, fd._EVAL_STREAM)
    norm = ObservationNormalizer((1,))
    fed = fd.Federation.from_env(env, policy, np.array([6], dtype=np.int32), 0.7, horizon=4, eval_env=eval_env, normalizer=norm,
                                 agent_ids=[1, 3], stop_when_done=True)
    assert fed.seeds.dtype == torch.int64 and fed.seeds.tolist() == [6] and fed.env_reset_seed is None
    assert fed.agent_ids.tolist() == [1, 3] and fed.stop_when_done is True and fed.horizon == 4
    assert fed.sampler.env is env and fed.eval_sampler.env is eval_env
    assert fed.sampler.stop_when_done is True and fed.eval_sampler.stop_when_done is True
    assert fed.sampler.normalizer is norm and fed.sampler.update_normalizer is True and fed.eval_sampler.update_normalizer is False
    assert torch.equal(fed.streams.keys, fd.run_keys(torch.tensor([6]), 2, agent_ids=[1, 3]))
    with pytest.raises(ValueError, match=r"^env must hold runs x agents environments: 2 agents for 3 runs$"):
        fd.Federation.from_env(env, policy, [1, 2, 3], 0.9)


def test_sampling_every_agent_draws_nothing_and_returns_no_mask():
    fed = _grid_fed((3, 4))
    before = fed.server_streams.counters.clone()
    assert fed.sample_agents(8) is None and fed.sample_agents(9) is None and fed.sample_agents(None) is None
    assert fed.participation(None) is None and fed.participation(8) is None
    assert torch.equal(fed.server_streams.counters, before)
    mask = fed.participation(3)
    assert mask.shape == (2, 8) and mask.sum(-1).tolist() == [3.0, 3.0] and not torch.equal(fed.server_streams.counters, before)


def test_agent_masks_and_selections_live_on_their_inputs_device():
    fed = _grid_fed((3, 4))
    agents = torch.tensor([[0, 5], [2, 7]])
    assert fed.agent_mask(agents.to("meta")).device.type == "meta"
    assert fed.agent_mask(agents).tolist() == [[1, 0, 0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0, 1]]
    chosen = fed.select(agents)
    x = torch.empty(2, 8, 3, device="meta")
    assert chosen.gather(x).shape == (2, 2, 3) and chosen.gather(x).device.type == "meta"
    assert chosen.scatter(torch.empty(2, 2, 3, device="meta"), x).device.type == "meta"


@pytest.mark.parametrize("agents, error, match", [
    (torch.tensor([[True, False], [False, True]]), TypeError, r"^agents must be an integer tensor \[R, r\], got Tensor of dtype torch\.bool$"),
    (torch.tensor([[0j, 1j], [1j, 2j]]), TypeError, r"^agents must be an integer tensor \[R, r\], got Tensor of dtype torch\.complex64$"),
    ([[0, 1], [1, 2]], TypeError, r"^agents must be an integer tensor \[R, r\], got list$"),
    (torch.tensor([[1, 0, 1], [0, 1, 2]]), ValueError, r"^agents must be distinct within each run, got \[\[1, 0, 1\], \[0, 1, 2\]\]$"),
    (torch.tensor([[0, 1, 1], [0, 1, 2]]), ValueError, "distinct"),
    (torch.tensor([[0, 1, 2], [3, 4, 4]]), ValueError, "distinct"),
    (torch.tensor([[0, 1]]), ValueError, r"^agents must have shape \[2, r\] with r >= 1 \(one row per run\), got \[1, 2\]$"),
])
def test_select_names_what_is_wrong_with_the_indices(agents, error, match):
    with pytest.raises(error, match=match):
        _grid_fed((3, 4)).select(agents)


def test_select_of_an_env_backed_federation_says_why_not():
    fed = fd.Federation.from_env(_grid_env(), _grid_policy(), 0, 0.9)
    assert fed.can_select is False
    with pytest.raises(ValueError, match=r"^select needs a family-backed federation: an env-backed one \(Federation\.from_env\) "
                                         r"steps every agent's environments together$"):
        fed.select(torch.tensor([[0]]))


def test_a_selection_of_one_agent_or_of_int32_indices_in_any_order_matches_the_whole_federation():
    policy = _grid_policy()
    theta = _grid_theta(2)
    for agents in (torch.tensor([[6], [1]]), torch.tensor([[5, 0], [2, 7]], dtype=torch.int32), torch.tensor([[0, 2], [2, 0]])):
        full, part = _grid_fed((3, 4)), _grid_fed((3, 4))
        every = full.sampler(full.broadcast(theta), 3)
        chosen = part.select(agents)
        some = chosen.sampler(chosen.broadcast(theta), 3)
        assert torch.equal(some.rewards, every.rewards[[[0], [1]], agents.long()]) and torch.equal(some.actions, every.actions[[[0], [1]], agents.long()])
        chosen.write_back()
        assert part.streams.counters.dtype == torch.int64
        assert torch.equal(part.streams.counters.gather(1, agents.long()), full.streams.counters.gather(1, agents.long()))
        assert int(part.streams.counters.sum()) == int(full.streams.counters.gather(1, agents.long()).sum())
    del policy


def test_a_selections_sampler_keeps_the_federations_horizon_early_stop_and_normalizer():
    params = stack_params(CARTPOLE.train_tasks[:3])
    task = CARTPOLE.train_tasks[0]
    policy = MlpPolicy(CARTPOLE.observation_space(task), CARTPOLE.action_space(task), dtype=torch.float64)
    norm = ObservationNormalizer((4,))
    fed = fd.Federation(CARTPOLE, params, policy, torch.tensor([2]), horizon_override=30, stop_when_done=True, normalizer=norm)
    chosen = fed.select(torch.tensor([[2, 0]]))
    sampler = chosen.sampler
    assert sampler.horizon == 30 and sampler.stop_when_done is True and sampler.normalizer is norm and sampler.update_normalizer is True
    traj = sampler(chosen.broadcast(policy.theta.detach().unsqueeze(0)), 4)
    assert traj.rewards.shape[-1] <= 31 and norm._pending[0].item() == traj.mask.sum().item() > 0


def test_local_rounds_of_some_agents_compute_only_those_by_default():
    fed = _grid_fed((3,))
    estimator = PolicyGradient(_grid_policy(), 0.9, 2)

    def steps(sampler, start, gather):
        return local_update(estimator, sampler, start, 0.1, 1)

    local, mask = fed.local_round(_grid_theta(1), steps, agents_per_round=3)
    assert int((fed.streams.counters > 0).sum()) == 3 and torch.equal((fed.streams.counters > 0).double(), mask.double())
    assert torch.equal(local[mask == 0], fed.broadcast(_grid_theta(1))[mask == 0])


def test_a_control_variate_round_with_no_local_step_is_refused_by_the_check():
    fed = _grid_fed((3,))
    control = ControlVariates.zeros(1, 8, 100, dtype=torch.float64)
    with pytest.raises(ValueError, match="sum to > 0"):
        per_fedavg_pg_round(fed, _grid_theta(1), PolicyGradient(_grid_policy(), 0.9, 2), 0.1, 0, control=control)


def test_evaluate_is_the_mean_discounted_return_of_each_agent_from_the_evaluation_streams():
    fed, twin = _grid_fed((3, 4)), _grid_fed((3, 4))
    theta = _grid_theta(2)
    value = fed.evaluate(theta, 5)
    traj = twin.eval_sampler(twin.broadcast(theta), 5)
    manual = (traj.rewards * traj.mask * 0.9 ** torch.arange(traj.rewards.shape[-1], dtype=torch.float64)).sum(-1).mean(-1)
    assert value.shape == (2, 8) and torch.allclose(value, manual, rtol=1e-12, atol=0)
    assert torch.equal(fed.evaluate(fed.broadcast(theta), 5), twin.evaluate(theta, 5))


@pytest.mark.parametrize("alpha, m, baseline", [(1.0, 1, None), (0.3, 2, "loo"), (-0.5, 3, "mean")])
def test_adapted_is_one_step_of_the_adaptation_gradient_from_the_evaluation_streams(alpha, m, baseline):
    fed, twin = _grid_fed((3, 4)), _grid_fed((3, 4))
    theta = _grid_theta(2)
    traj = twin.eval_sampler(twin.broadcast(theta), m)
    manual = twin.broadcast(theta) + alpha * adaptation_gradient(twin.policy, twin.broadcast(theta), traj, 0.9, baseline)
    assert not torch.allclose(manual, twin.broadcast(theta))
    if m > 1:  # the baseline matters (with one trajectory the leave-one-out baseline is 0)
        other = None if baseline else "loo"
        assert not torch.allclose(manual, twin.broadcast(theta) + alpha * adaptation_gradient(twin.policy, twin.broadcast(theta), traj, 0.9, other))
    assert torch.allclose(fed.adapted(theta, alpha, m, baseline), manual, rtol=1e-12, atol=1e-15)


def test_adapted_with_no_step_or_no_trajectory_returns_theta_and_draws_nothing():
    fed = _grid_fed((3, 4))
    theta = _grid_theta(2)
    for alpha, m in [(0.0, 4), (0.0, 0), (2.0, 0)]:
        assert torch.equal(fed.adapted(theta, alpha, m), fed.broadcast(theta))
    assert int(fed.eval_streams.counters.abs().sum()) == 0


def test_adapt_with_sampler_defaults_to_one_unit_step_at_gamma_point_nine():
    fed, twin = _grid_fed((3,)), _grid_fed((3,))
    theta = fed.broadcast(_grid_theta(1))
    adapted, used = fd.adapt_with_sampler(fed.eval_sampler, fed.policy, theta, 20)
    traj = twin.eval_sampler(theta, 20)
    assert float(traj.rewards.sum()) > 0 and not torch.allclose(adapted, theta)
    assert len(used) == 1 and torch.equal(used[0].rewards, traj.rewards) and torch.equal(used[0].actions, traj.actions)
    assert torch.allclose(adapted, theta + adaptation_gradient(fed.policy, theta, traj, 0.9, None), rtol=1e-12, atol=1e-15)


def test_a_family_federations_samplers_get_its_horizon_early_stop_and_normalizer():
    params = stack_params(CARTPOLE.train_tasks[:2])
    task = CARTPOLE.train_tasks[0]
    policy = MlpPolicy(CARTPOLE.observation_space(task), CARTPOLE.action_space(task), dtype=torch.float64)
    norm = ObservationNormalizer((4,))
    fed = fd.Federation(CARTPOLE, params, policy, torch.tensor([2, 5]), horizon_override=30, stop_when_done=True, normalizer=norm)
    assert fed.horizon == 30 and fed.row_params is not None
    for sampler, updates in ((fed.sampler, True), (fed.eval_sampler, False)):
        assert sampler.horizon == 30 and sampler.stop_when_done is True and sampler.normalizer is norm
        assert sampler.update_normalizer is updates
    assert fed.sampler.streams is fed.streams and fed.eval_sampler.streams is fed.eval_streams
    plain = fd.Federation(CARTPOLE, params, policy, torch.tensor([2, 5]))
    assert plain.horizon == 499 and plain.sampler.horizon is None and plain.sampler.stop_when_done is False
    assert plain.sampler.normalizer is None and plain.eval_sampler.normalizer is None


def test_an_env_federation_shares_its_normalizer_with_evaluation_and_has_no_row_params():
    norm = ObservationNormalizer((1,))
    fed = fd.Federation.from_env(_grid_env(), _grid_policy(), 1, 0.9, normalizer=norm)
    assert fed.row_params is None and fed.eval_sampler.normalizer is norm and fed.sampler.normalizer is norm
