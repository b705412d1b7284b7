"""FedPG-BR's filter at its thresholds (both sides of each), and the attacks that lie.

Each boundary test puts agents just inside and just outside a threshold, so that an off-by-one
in the majority rule (``> K/2``), the fallback trigger (``< (1 − α)K``) or a wrong radius
(``T_μ``, ``2σ``) changes the decision.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrl_algos import FedPGBR
from fedrl_algos.core import Trajectories
from fedrl_algos.core.attacks import (
    ATTACKS,
    AttackedEstimator,
    FedScsPGAttack,
    ForgedSpread,
    HugeSpread,
    RandomReward,
    SignFlip,
    TinySpread,
    make_attack,
)
from fedrl_algos.fedpg_br import byzantine_filter, filter_threshold
from fedrl_algos.fedpg_br.update import FedPGBRUpdate
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys

SIGMA, DELTA, BATCH, ALPHA = 1.0, 0.6, 16, 0.4
T_MU = float(filter_threshold(SIGMA, DELTA, 10, BATCH))  # ≈ 1.32, below the fallback radius 2σ = 2


def _on_a_line(xs: list[float], d: int = 4) -> torch.Tensor:
    """Agents' gradients ``[1, K, d]`` at positions ``xs`` along the first axis."""
    grads = torch.zeros(1, len(xs), d, dtype=torch.float64)
    grads[0, :, 0] = torch.tensor(xs, dtype=torch.float64)
    return grads


def _filter(xs: list[float], **kwargs):
    result = byzantine_filter(_on_a_line(xs), SIGMA, DELTA, BATCH, ALPHA, **kwargs)
    return result.kept[0].tolist(), bool(result.fallback[0])


def _far(k: int) -> list[float]:
    """``k`` agents far from everything and from each other."""
    return [100.0 * (i + 1) for i in range(k)]


# --- the majority rule: strictly more than K/2 -------------------------------------------------
def test_majority_needs_more_than_half():
    # 5 of 10 agents together (exactly K/2, themselves included): no majority in either pass.
    kept, fallback = _filter([0.0] * 5 + _far(5))
    assert kept == [False] * 10 and fallback
    # 6 of 10: a majority; all six kept in the first pass (6 ≥ (1 − α)K = 6: no fallback).
    kept, fallback = _filter([0.0] * 6 + _far(4))
    assert kept == [True] * 6 + [False] * 4 and not fallback
    # Two halves of 5 (each with exactly K/2 neighbours): nobody is kept.
    kept, _ = _filter([0.0] * 5 + [50.0] * 5)
    assert kept == [False] * 10


def test_majority_counts_only_valid_reports():
    # 12 reports of which 2 are invalid: K = 10 valid. 5 together is not a majority of them ...
    valid = torch.tensor([[True] * 10 + [False] * 2])
    kept, _ = _filter([0.0] * 5 + _far(5) + [0.0, 0.0], valid=valid)
    assert kept == [False] * 12
    # ... 6 together is (6 > 5), and it does not trigger the fallback (6 ≥ 0.6 · 10); invalid rows are never kept.
    kept, fallback = _filter([0.0] * 6 + _far(4) + [0.0, 0.0], valid=valid)
    assert kept == [True] * 6 + [False] * 6 and not fallback


# --- the fallback trigger: fewer than (1 − α)K kept ---------------------------------------------
def test_fallback_when_fewer_than_one_minus_alpha_k_are_kept():
    # First pass keeps exactly (1 − α)K = 6: no fallback, the agent at 1.9 (inside 2σ) stays out.
    kept, fallback = _filter([0.0] * 6 + [1.9] + _far(3))
    assert not fallback and kept == [True] * 6 + [False] * 4
    # First pass keeps... nobody here (5 at 0 and one at 1.9 are within T_μ of no majority): the
    # wide pass decides and adds the agent at 1.9.
    kept, fallback = _filter([0.0] * 5 + [1.9] + _far(4))
    assert fallback and kept == [True] * 6 + [False] * 4


# --- the radii: T_μ = 2σ√(V/B) in the first pass, 2σ in the fallback ----------------------------
def test_first_radius_is_t_mu():
    eps = 1e-6
    assert 1.0 < T_MU < 2.0
    kept, fallback = _filter([0.0] * 6 + [T_MU * (1 - eps), T_MU * (1 + eps)] + _far(2))
    assert not fallback and kept == [True] * 7 + [False] * 3


def test_fallback_radius_is_two_sigma():
    eps = 1e-6
    two_sigma = 2.0 * SIGMA
    # 5 agents at 0 have no majority within T_μ; within 2σ, agent 5 (just inside) joins them
    # (6 > K/2), agent 6 (just outside 2σ of the median, but close to agent 5) does not.
    xs = [0.0] * 5 + [two_sigma * (1 - eps), two_sigma * (1 + eps)] + _far(3)
    kept, fallback = _filter(xs)
    assert fallback and kept == [True] * 6 + [False] * 4
    # The same geometry scaled by 3: nothing within 2σ of a majority, nobody is kept (a radius
    # of 6σ or more would keep six).
    kept, _ = _filter([x * 3 if x < 50 else x for x in xs])
    assert kept == [False] * 10


def test_threshold_formula_at_its_inputs():
    # V = 2 log(2K/δ) with K the agents, σ and B as given: both sides of each factor.
    for k, sigma, batch in ((10, 1.0, 16), (20, 0.5, 4), (3, 2.0, 100)):
        v = 2 * math.log(2 * k / DELTA)
        assert float(filter_threshold(sigma, DELTA, k, batch)) == pytest.approx(2 * sigma * math.sqrt(v / batch), rel=1e-12)


# --- attacks that lie ---------------------------------------------------------------------------
def _streams(shape: tuple[int, ...], seed: int = 0) -> RandomStreams:
    n = math.prod(shape)
    return RandomStreams(derive_keys(seed, torch.arange(n)).reshape(shape))


def test_random_reward_shuffles_alive_rewards_only():
    rewards = torch.arange(1.0, 13.0).reshape(1, 3, 1, 4).expand(1, 3, 2, 4).clone()  # [R=1, n=3, m=2, T=4]
    mask = torch.ones_like(rewards)
    mask[..., 1, 3] = 0  # second trajectory ended after 3 steps
    rewards = rewards * mask
    traj = Trajectories(torch.zeros_like(rewards), torch.zeros_like(rewards, dtype=torch.long), rewards, mask)
    byzantine = torch.tensor([False, True, False])
    out = RandomReward().trajectories(traj, byzantine, _streams((1, 3)))
    assert torch.equal(out.rewards[:, [0, 2]], rewards[:, [0, 2]])
    bad = out.rewards[0, 1]
    assert not torch.equal(bad, rewards[0, 1])
    for j in range(2):  # the same rewards in another order; the dead step stays 0
        assert torch.equal(bad[j].sort().values, rewards[0, 1, j].sort().values)
    assert bad[1, 3] == 0
    # Constant rewards (CartPole's +1): the attack changes nothing.
    ones = traj._replace(rewards=mask.clone())
    assert torch.equal(RandomReward().trajectories(ones, byzantine, _streams((1, 3))).rewards, mask)
    with pytest.raises(ValueError, match="streams"):
        RandomReward().trajectories(traj, byzantine)


def test_fedscspg_colluders_report_one_vector_three_sigma_away():
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(2, 10, 6, generator=g, dtype=torch.float64)
    byzantine = torch.zeros(10, dtype=torch.bool)
    byzantine[[0, 4, 7]] = True
    out = FedScsPGAttack().gradient(grad, byzantine.expand(2, 10), _streams((2, 10)))
    assert torch.equal(out[:, ~byzantine], grad[:, ~byzantine])
    for r in range(2):
        bad = grad[r, byzantine]
        mean = bad.mean(0)
        two_sigma = torch.cdist(bad, bad).max()
        forged = out[r, byzantine]
        assert torch.equal(forged[0], forged[1]) and torch.equal(forged[0], forged[2])  # they collude
        assert float((forged[0] - mean).norm()) == pytest.approx(1.5 * float(two_sigma), rel=1e-12)
    assert not torch.equal(out[0, 0] - grad[0, byzantine].mean(0), out[1, 0] - grad[1, byzantine].mean(0))  # own direction per run
    # No Byzantine agent: nothing changes.
    assert torch.equal(FedScsPGAttack().gradient(grad, torch.zeros(2, 10, dtype=torch.bool), _streams((2, 10))), grad)


def test_forged_spreads_and_sigma_auto():
    spread = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]], dtype=torch.float64)
    byzantine = torch.zeros(1, 10, dtype=torch.bool)
    byzantine[0, 7:] = True  # the three largest honest reports belong to the attackers
    streams = _streams((1, 10))
    huge = HugeSpread().spread(spread, byzantine, streams)
    tiny = TinySpread().spread(spread, byzantine, streams)
    assert torch.equal(huge[0, :7], spread[0, :7]) and torch.equal(huge[0, 7:], spread[0, 7:] * 1e3)
    assert torch.allclose(tiny[0, 7:], spread[0, 7:] * 1e-3)
    assert isinstance(HugeSpread().attack, SignFlip)
    task = GRIDWORLD.train_tasks[0]
    update = FedPGBRUpdate(TabularPolicy(GRIDWORLD.observation_space(task), GRIDWORLD.action_space(task)), 0.9, (6, 8), 3, 0.5,
                           "auto", DELTA, ALPHA)
    # σ is the (1 − α)-quantile ("lower", index ⌊0.6·9⌋ = 5): never above the largest honest
    # report however large the forged ones, but forged small ones pull it down.
    assert float(update.estimate_sigma(spread)) == 6.0
    assert float(update.estimate_sigma(huge)) == 6.0
    assert float(update.estimate_sigma(tiny)) == 3.0
    # Over valid reports only: k = 8 valid, index ⌊0.6·7⌋ = 4 of the sorted valid ones.
    valid = torch.ones(1, 10, dtype=torch.bool)
    valid[0, [0, 1]] = False
    assert float(update.estimate_sigma(spread, valid)) == 7.0
    assert float(update.estimate_sigma(spread, torch.ones_like(valid))) == float(update.estimate_sigma(spread))
    with pytest.raises(ValueError, match="factor"):
        ForgedSpread(0.0)
    assert make_attack("huge_spread").name == "huge_spread" and set(ATTACKS) >= {"random_reward", "fedscspg", "tiny_spread"}


def test_forged_spread_reaches_the_filter():
    """What an agent reports about its spread is part of the attack: tiny forged spreads shrink σ."""
    kwargs = dict(step_size=0.5, batch_range=(6, 8), inner_batch_size=3, gamma=0.9, seed=0, device="cpu", byzantine_agents=[0, 1, 2])
    honest_spread = FedPGBR("TabularPolicy", "fedrl/GridWorld-v0", attack="sign_flip", **kwargs).learn(total_rounds=1)._last_info["sigma"]
    forged = FedPGBR("TabularPolicy", "fedrl/GridWorld-v0", attack="tiny_spread", **kwargs).learn(total_rounds=1)._last_info["sigma"]
    assert float(forged) < float(honest_spread)


@pytest.mark.parametrize("attack", ["random_reward", "fedscspg", "huge_spread", "tiny_spread"])
def test_new_attacks_run_in_both_algorithms(attack):
    from fedrl_algos import FedAvgPG

    model = FedPGBR("TabularPolicy", "fedrl/GridWorld-v0", step_size=0.5, batch_range=(6, 8), inner_batch_size=3, gamma=0.9,
                    seed=0, device="cpu", attack=attack, byzantine_agents=[0, 1, 2])
    model.learn(total_rounds=2)
    assert torch.isfinite(model.theta).all() and len(model.filter_history) == 2
    fed = FedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", local_steps=1, n_trajectories=4, seed=0, device="cpu", attack=attack,
                   byzantine_agents=[0, 1, 2])
    assert isinstance(fed.estimator, AttackedEstimator)
    fed.learn(total_rounds=1)
    assert torch.isfinite(fed.theta).all()


def test_a_report_exactly_at_the_radius_counts_as_inside():
    # ‖μ_k − μ_k'‖ ≤ radius (as in Algorithm 1.1): an agent exactly 2σ away joins the majority and is kept.
    kept, fallback = _filter([0.0] * 5 + [2.0 * SIGMA] + _far(4))
    assert fallback and kept == [True] * 6 + [False] * 4
