"""Argument checks of schedules, attacks, FedAvgSB3's weights, ArcNavigation's goal and the Atari factories.

Every bad argument raises ``TypeError`` (wrong type; bools are not numbers) or ``ValueError`` (bad value)
naming the argument, before any work; the right kinds of NumPy scalars are accepted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_algos.core import PolicyGradient
from fedrl_algos.core.attacks import AttackedEstimator, FedScsPGAttack, ForgedSpread, RandomNoise, SignFlip
from fedrl_algos.core.schedules import (
    ConstantSchedule,
    ExponentialStepSize,
    LinearStepSize,
    MomentumSchedule,
    as_momentum,
    as_step_size,
)
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import ARC_NAVIGATION
from fedrl_envs.validation import check_real

NAN, INF = float("nan"), float("inf")

# ---------------------------------------------------------------------------------------------
# the helper


@pytest.mark.parametrize(
    "value, kwargs, error, match",
    [
        (True, {}, TypeError, "x must be a real number"),
        (np.bool_(False), {}, TypeError, "x must be a real number"),
        ("1.0", {}, TypeError, "x must be a real number"),
        (None, {}, TypeError, "x must be a real number"),
        (1 + 0j, {}, TypeError, "x must be a real number"),
        (NAN, {}, ValueError, "x must be a finite number"),
        (NAN, {"finite": False}, ValueError, r"x must be a number \(not NaN\)"),
        (INF, {}, ValueError, "x must be a finite number"),
        (10**400, {}, ValueError, "x must be a finite number"),
        (-1e-9, {"low": 0}, ValueError, "x must be a finite number >= 0"),
        (0.0, {"low": 0, "low_inclusive": False}, ValueError, "x must be a finite number > 0"),
        (1.5, {"low": 0, "high": 1}, ValueError, r"x must be a finite number in \[0, 1\]"),
        (1.0, {"high": 1, "high_inclusive": False}, ValueError, "x must be a finite number < 1"),
    ],
)
def test_check_real(value, kwargs, error, match):
    with pytest.raises(error, match=match):
        check_real("x", value, **kwargs)
    for good in (0.5, 1, np.float32(0.5), np.int64(1), np.float64(0.25)):
        out = check_real("x", good, 0, 1)
        assert type(out) is float and out == float(good)
    assert check_real("x", INF, finite=False) == INF


# ---------------------------------------------------------------------------------------------
# schedules

SCHEDULE_CASES = [
    # (constructor, good kwargs, name, bad value, error, message fragment)
    (ExponentialStepSize, {}, "initial", "1e-4", TypeError, "initial must be a real number"),
    (ExponentialStepSize, {}, "initial", True, TypeError, "initial must be a real number"),
    (ExponentialStepSize, {}, "initial", NAN, ValueError, "initial must be a finite number >= 0"),
    (ExponentialStepSize, {}, "initial", INF, ValueError, "initial must be a finite number >= 0"),
    (ExponentialStepSize, {}, "initial", -1e-4, ValueError, "initial must be a finite number >= 0"),
    (ExponentialStepSize, {}, "growth", 0.0, ValueError, "growth must be a finite number > 0"),
    (ExponentialStepSize, {}, "growth", -1.01, ValueError, "growth must be a finite number > 0"),
    (ExponentialStepSize, {}, "growth", INF, ValueError, "growth must be a finite number > 0"),
    (ExponentialStepSize, {}, "growth", False, TypeError, "growth must be a real number"),
    (ExponentialStepSize, {}, "maximum", -1.0, ValueError, "maximum must be a finite number >= 0"),
    (ExponentialStepSize, {}, "maximum", NAN, ValueError, "maximum must be a finite number >= 0"),
    (ExponentialStepSize, {}, "maximum", "1e-3", TypeError, "maximum must be a real number"),
    (MomentumSchedule, {}, "c", NAN, ValueError, "c must be a finite number"),
    (MomentumSchedule, {}, "c", -INF, ValueError, "c must be a finite number"),
    (MomentumSchedule, {}, "c", "3", TypeError, "c must be a real number"),
    (MomentumSchedule, {}, "power", 0.0, ValueError, "power must be a finite number > 0"),
    (MomentumSchedule, {}, "power", -1.0, ValueError, "power must be a finite number > 0"),
    (MomentumSchedule, {}, "power", INF, ValueError, "power must be a finite number > 0"),
    (MomentumSchedule, {}, "power", True, TypeError, "power must be a real number"),
    (ConstantSchedule, {}, "value", -0.1, ValueError, r"value must be a number \(not NaN\) >= 0"),
    (ConstantSchedule, {}, "value", NAN, ValueError, r"value must be a number \(not NaN\) >= 0"),
    (ConstantSchedule, {}, "value", "0.1", TypeError, "value must be a real number"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "initial", INF, ValueError, "initial must be a finite number >= 0"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "initial", "0.1", TypeError, "initial must be a real number"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "steps", 10.0, TypeError, "steps must be an int"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "final", "0.5", TypeError, "final must be a real number"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "final", True, TypeError, "final must be a real number"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "final", 1.5, ValueError, r"final must be a finite number in \[0, 1\]"),
    (LinearStepSize, {"initial": 0.1, "steps": 10}, "final", NAN, ValueError, r"final must be a finite number in \[0, 1\]"),
]

GOOD_NUMPY = {"initial": np.float32(0.25), "growth": np.float64(0.5), "maximum": np.float32(2.0), "c": np.int64(2),
              "power": np.float32(2.0), "value": np.float32(0.5), "steps": np.int64(10), "final": np.float32(0.5)}


@pytest.mark.parametrize("cls, kwargs, name, bad, error, match", SCHEDULE_CASES)
def test_schedule_arguments(cls, kwargs, name, bad, error, match):
    with pytest.raises(error, match=match):
        cls(**{**kwargs, name: bad})
    schedule = cls(**{**kwargs, name: GOOD_NUMPY[name]})  # a NumPy scalar of the right kind
    stored = getattr(schedule, name)
    assert type(stored) is (int if name == "steps" else float) and stored == GOOD_NUMPY[name]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(schedule, name, GOOD_NUMPY[name])  # still frozen


def test_schedule_values_with_numpy_and_none():
    assert ExponentialStepSize(np.float32(1.0), np.float64(2.0), None)(3) == pytest.approx(8.0, rel=1e-12)
    assert ExponentialStepSize(0.0, maximum=0)(5) == 0.0
    assert MomentumSchedule(np.int64(2), np.float32(2.0))(1, 0.5) == pytest.approx(0.5)
    assert MomentumSchedule(c=0.0)(1, 0.5) == 1.0
    assert ConstantSchedule(INF)() == INF and as_step_size(np.float64(INF))(1) == INF  # fault injection (test_algorithms.py)


@pytest.mark.parametrize("value", [np.float32(0.5), np.float64(0.25), np.int64(1), np.int32(0)])
def test_as_step_size_and_as_momentum_accept_numpy_scalars(value):
    step = as_step_size(value)
    nu = as_momentum(value)
    assert isinstance(step, ConstantSchedule) and type(step.value) is float and step(3) == float(value)
    assert isinstance(nu, ConstantSchedule) and type(nu.value) is float and nu(3, 0.1) == float(value)


@pytest.mark.parametrize(
    "fn, bad, error, match",
    [
        (as_step_size, np.bool_(True), TypeError, "step_size must be a number or a callable"),
        (as_step_size, np.float32(-1.0), ValueError, "step_size must be >= 0"),
        (as_step_size, np.float64(NAN), ValueError, "step_size must be >= 0"),
        (as_momentum, np.bool_(False), TypeError, "momentum must be a number in"),
        (as_momentum, np.float32(1.5), ValueError, "momentum must be in"),
    ],
)
def test_as_step_size_and_as_momentum_reject(fn, bad, error, match):
    with pytest.raises(error, match=match):
        fn(bad)


# ---------------------------------------------------------------------------------------------
# attacks

ATTACK_CASES = [
    # (constructor, argument, bad value, error, message fragment, a valid NumPy value)
    (RandomNoise, "scale", "3", TypeError, "scale must be a real number", np.float32(2.0)),
    (RandomNoise, "scale", True, TypeError, "scale must be a real number", np.float32(2.0)),
    (RandomNoise, "scale", NAN, ValueError, "scale must be a finite number > 0", np.int64(3)),
    (RandomNoise, "scale", INF, ValueError, "scale must be a finite number > 0", np.int64(3)),
    (RandomNoise, "scale", 0.0, ValueError, "scale must be a finite number > 0", np.int64(3)),
    (RandomNoise, "scale", -1.0, ValueError, "scale must be a finite number > 0", np.int64(3)),
    (SignFlip, "scale", "-2.5", TypeError, "scale must be a real number", np.float32(-2.5)),
    (SignFlip, "scale", False, TypeError, "scale must be a real number", np.float32(-2.5)),
    (SignFlip, "scale", NAN, ValueError, "scale must be a finite number", np.float32(0.0)),
    (SignFlip, "scale", -INF, ValueError, "scale must be a finite number", np.float64(2.0)),
    (FedScsPGAttack, "scale", "3", TypeError, "scale must be a real number", np.float32(0.0)),
    (FedScsPGAttack, "scale", np.bool_(True), TypeError, "scale must be a real number", np.float32(3.0)),
    (FedScsPGAttack, "scale", NAN, ValueError, "scale must be a finite number >= 0", np.int64(3)),
    (FedScsPGAttack, "scale", INF, ValueError, "scale must be a finite number >= 0", np.int64(3)),
    (FedScsPGAttack, "scale", -0.5, ValueError, "scale must be a finite number >= 0", np.int64(3)),
    (ForgedSpread, "factor", "1e3", TypeError, "factor must be a real number", np.float32(1e3)),
    (ForgedSpread, "factor", True, TypeError, "factor must be a real number", np.float32(1e-3)),
    (ForgedSpread, "factor", 0.0, ValueError, "factor must be a finite number > 0", np.float32(2.0)),
    (ForgedSpread, "factor", NAN, ValueError, "factor must be a finite number > 0", np.float32(2.0)),
    (ForgedSpread, "factor", INF, ValueError, "factor must be a finite number > 0", np.float32(2.0)),
]


@pytest.mark.parametrize("cls, name, bad, error, match, good", ATTACK_CASES)
def test_attack_arguments(cls, name, bad, error, match, good):
    with pytest.raises(error, match=match):
        cls(**{name: bad})
    attack = cls(**{name: good})
    assert type(getattr(attack, name)) is float and getattr(attack, name) == float(good)


def _estimator() -> PolicyGradient:
    return PolicyGradient(TabularPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2), dtype=torch.float64), 0.9, 2)


@pytest.mark.parametrize(
    "byzantine, error, match",
    [
        ([1, 0, 1], TypeError, r"byzantine must be a boolean mask over agents.*mask\[indices\] = True"),
        ([0, 2], TypeError, "byzantine must be a boolean mask over agents"),
        ([True, 1], TypeError, "byzantine must be a boolean mask over agents"),
        (np.array([0, 1, 1]), TypeError, "byzantine must be a boolean mask over agents"),
        (torch.tensor([0, 1, 1]), TypeError, "byzantine must be a boolean mask over agents"),
        (torch.tensor([0.0, 1.0]), TypeError, "byzantine must be a boolean mask over agents"),
        (2, TypeError, "byzantine must be a boolean mask over agents"),
        ("ab", TypeError, "byzantine must be a boolean mask over agents"),
        (None, TypeError, "byzantine must be a boolean mask over agents"),
        ([[True, False], [True]], ValueError, "byzantine must be a rectangular boolean mask"),
    ],
)
def test_attacked_estimator_needs_a_boolean_mask(byzantine, error, match):
    with pytest.raises(error, match=match):
        AttackedEstimator(_estimator(), "sign_flip", byzantine)
    expected = [True, False, True]
    for good in (expected, [np.bool_(True), np.bool_(False), np.bool_(True)], np.array(expected), np.array(expected[::-1])[::-1],
                 torch.tensor(expected)):
        attacked = AttackedEstimator(_estimator(), "sign_flip", good)
        assert attacked.byzantine.dtype == torch.bool and attacked.byzantine.tolist() == expected
    assert AttackedEstimator(_estimator(), "sign_flip", np.bool_(True)).byzantine.tolist() is True


# ---------------------------------------------------------------------------------------------
# FedAvgSB3's ParameterAverage weights


@pytest.mark.parametrize(
    "weights, error, match",
    [
        ("12", TypeError, "weights must be a 1-d list"),
        (["1", "2"], TypeError, r"weights\[0\] must be a real number"),
        ([1.0, True], TypeError, r"weights\[1\] must be a real number"),
        ([1.0, None], TypeError, r"weights\[1\] must be a real number"),
        (torch.tensor([True, False]), TypeError, "weights must be a 1-d list"),
        (np.array([True, False]), TypeError, "weights must be a 1-d list"),
        (np.array(["1", "2"]), TypeError, "weights must be a 1-d list"),
        (3.0, TypeError, "weights must be a 1-d list"),
        ([1.0, NAN], ValueError, r"weights\[1\] must be a finite number >= 0"),
        ([1.0, INF], ValueError, r"weights\[1\] must be a finite number >= 0"),
        ([1.0, -1.0], ValueError, r"weights\[1\] must be a finite number >= 0"),
        ([0.0, 0.0], ValueError, "weights must be a 1-d list .* not all 0"),
        ([], ValueError, "weights must be a 1-d list"),
        ([1e308, 1e308], ValueError, "weights must be a 1-d list"),  # the sum overflows
        (torch.tensor([1.0, float("nan")]), ValueError, "weights must be a 1-d list"),
        (torch.tensor([[1.0, 2.0]]), ValueError, "weights must be a 1-d list"),
        (np.array([1.0, -2.0]), ValueError, "weights must be a 1-d list"),
    ],
)
def test_parameter_average_weights(weights, error, match):
    pytest.importorskip("stable_baselines3")
    from fedrl_algos.fedavg_sb3.aggregation import ParameterAverage

    with pytest.raises(error, match=match):
        ParameterAverage(weights=weights)
    for good in ([np.float32(3.0), 1], (0, np.int64(2)), np.array([3.0, 1.0], dtype=np.float32), torch.tensor([3, 1])):
        average = ParameterAverage(weights=good)
        assert average.weights.dtype == torch.float64 and average.weights.tolist() == [float(w) for w in good]


# ---------------------------------------------------------------------------------------------
# ArcNavigation's goal


@pytest.mark.parametrize(
    "goal, error, match",
    [
        (("0.5", 0.0), TypeError, "goal must be a pair"),
        ((True, 0.0), TypeError, "goal must be a pair"),
        ((0.0, np.bool_(False)), TypeError, "goal must be a pair"),
        ((None, 0.0), TypeError, "goal must be a pair"),
        (torch.tensor([True, False]), TypeError, "goal must be a pair"),
        ("ab", TypeError, "goal must be a pair"),
        (0.5, TypeError, "goal must be a pair"),
        ((0.1, 0.2, 0.3), TypeError, "goal must be a pair"),
        ((NAN, 0.0), ValueError, r"goal must lie in the box .*finite"),
        ((0.0, -INF), ValueError, r"goal must lie in the box .*finite"),
        ((10**400, 0), ValueError, r"goal must lie in the box .*finite"),
        ((1.5, 0.0), ValueError, "goal must lie in the box"),
    ],
)
def test_arc_navigation_goal(goal, error, match):
    with pytest.raises(error, match=match):
        ARC_NAVIGATION.make_params(goal=goal)
    for good in ((np.float32(0.25), np.float64(-0.5)), (0, 1), np.array([0.25, -0.5]), torch.tensor([0.25, -0.5])):
        params = ARC_NAVIGATION.make_params(goal=good)
        assert params.goal.tolist() == [float(v) for v in good]


# ---------------------------------------------------------------------------------------------
# Atari factories (ale_py is needed only to build agent kwargs that pass the checks)

HAS_ALE = importlib.util.find_spec("ale_py") is not None


@pytest.mark.parametrize("flag", ["terminal_on_life_loss", "grayscale_obs", "scale_obs"])
@pytest.mark.parametrize("bad", [1, 0, "yes", None, 1.0])
def test_atari_preprocess_flags(flag, bad):
    from fedrl_wrappers.heterogeneity import AtariPreprocess

    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        AtariPreprocess(**{flag: bad})
    pre = AtariPreprocess(**{flag: np.bool_(True)})
    assert getattr(pre, flag) is True


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"repeat_action_probability": "0.25"}, TypeError, "repeat_action_probability must be a real number"),
        ({"repeat_action_probability": True}, TypeError, "repeat_action_probability must be a real number"),
        ({"repeat_action_probability": 1.5}, ValueError, r"repeat_action_probability must be a finite number in \[0, 1\]"),
        ({"repeat_action_probability": -0.1}, ValueError, r"repeat_action_probability must be a finite number in \[0, 1\]"),
        ({"repeat_action_probability": NAN}, ValueError, r"repeat_action_probability must be a finite number in \[0, 1\]"),
        ({"repeat_action_probability": [0.25, 2.0]}, ValueError, r"repeat_action_probability\[1\] must be"),
        ({"mode": 1.0}, TypeError, "mode must be an int"),
        ({"mode": True}, TypeError, "mode must be an int"),
        ({"mode": "0"}, TypeError, "mode must be an int"),
        ({"mode": -1}, ValueError, "mode must be >= 0"),
        ({"mode": [0, -4]}, ValueError, r"mode\[1\] must be >= 0"),
        ({"difficulty": 0.5}, TypeError, "difficulty must be an int"),
        ({"difficulty": -1}, ValueError, "difficulty must be >= 0"),
    ],
)
def test_atari_agent_kwargs_arguments(kwargs, error, match):
    from fedrl_wrappers.heterogeneity import atari_agent_kwargs

    with pytest.raises(error, match=match):  # checked before ale_py is imported
        atari_agent_kwargs(**kwargs)
    if not HAS_ALE:
        pytest.skip("the Atari extra: pip install 'fedrl[atari]'")
    rows = atari_agent_kwargs(mode=[np.int64(0), None], difficulty=np.int32(1), repeat_action_probability=np.float32(0.5))
    assert [r.get("mode") for r in rows] == [0, None] and all(type(r["difficulty"]) is int for r in rows)
    assert all(type(r["repeat_action_probability"]) is float and r["repeat_action_probability"] == 0.5 for r in rows)
    assert math.isclose(atari_agent_kwargs()[0]["repeat_action_probability"], 0.25)
