"""``discounting="relative"``: GPOMDP's reward-to-go discounted from each step, ``G^h = Σ_{t≥h} γ^(t−h) r_t``.

* :func:`relative_rewards_to_go` against a step-by-step backward recursion and against ``R^h / γ^h``,
  and finite where ``γ^h`` underflows (3000 steps at γ = 0.9);
* the relative GPOMDP weights are the absolute ones divided by ``γ^h`` step by step, the
  leave-one-out baseline included (it is linear in the rewards-to-go), padding stays 0;
* γ = 1 makes both discountings the same; REINFORCE or an unknown value is a ``ValueError``;
* MFPO, FedAvg-PG and FedPG-BR take the option (default ``"absolute"``), use it in their
  directions and keep it through save/load.
"""

from __future__ import annotations

import pytest
import torch
from gymnasium.spaces import Discrete

from fedrl_algos import MFPO, FedAvgPG, FedPGBR
from fedrl_algos.core.estimators import discounted_rewards_to_go, relative_rewards_to_go
from fedrl_algos.core.gpomdp import ScoreFunctionGradient, gpomdp_weights, score_gradient, step_weights
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies import TabularPolicy


def _traj(horizon: int = 7) -> Trajectories:
    """2 rows × 4 trajectories; some end early (padding after their last step)."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([[7, 3, 7, 6], [5, 5, 5, 5]])
    mask = (torch.arange(horizon) < lengths.unsqueeze(-1)).to(torch.float64)
    rewards = torch.randn(mask.shape, dtype=torch.float64, generator=gen) * mask
    return Trajectories(torch.randint(0, 4, mask.shape, generator=gen), torch.randint(0, 2, mask.shape, generator=gen), rewards, mask)


def test_relative_rewards_to_go_match_the_backward_recursion_and_the_rescaled_absolute_ones():
    rewards = torch.randn(3, 5, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    gamma = 0.93
    expected = torch.zeros_like(rewards)
    running = torch.zeros(3, 5, dtype=torch.float64)
    for h in reversed(range(40)):  # G^h = r_h + γ G^(h+1)
        running = rewards[..., h] + gamma * running
        expected[..., h] = running
    torch.testing.assert_close(relative_rewards_to_go(rewards, gamma), expected, rtol=1e-12, atol=1e-12)
    scale = gamma ** torch.arange(40, dtype=torch.float64)
    torch.testing.assert_close(relative_rewards_to_go(rewards, gamma), discounted_rewards_to_go(rewards, gamma) / scale)
    # 0.9^3000 underflows float32 and float64: the quotient R^h / γ^h would be inf or NaN.
    long = relative_rewards_to_go(torch.ones(2, 3000), 0.9)
    assert torch.isfinite(long).all()
    torch.testing.assert_close(long[:, 0], torch.full((2,), 10.0))
    torch.testing.assert_close(long[:, -1], torch.ones(2))


@pytest.mark.parametrize("baseline", ["loo", "mean", None])
def test_relative_weights_are_the_absolute_ones_over_gamma_to_the_h(baseline):
    traj, gamma = _traj(), 0.8
    absolute = gpomdp_weights(traj, gamma, baseline)
    relative = gpomdp_weights(traj, gamma, baseline, "relative")
    scale = gamma ** torch.arange(traj.rewards.shape[-1], dtype=torch.float64)
    torch.testing.assert_close(relative, absolute / scale, rtol=1e-10, atol=1e-12)
    assert (relative[traj.mask == 0] == 0).all()
    assert not torch.allclose(relative, absolute)
    torch.testing.assert_close(gpomdp_weights(traj, 1.0, baseline, "relative"), gpomdp_weights(traj, 1.0, baseline))


def test_bad_discounting_is_a_value_error():
    with pytest.raises(ValueError, match="discounting must be one of"):
        step_weights(_traj(), 0.9, discounting="per-step")
    with pytest.raises(ValueError, match="estimator='gpomdp'"):
        ScoreFunctionGradient(TabularPolicy(Discrete(4), Discrete(2)), 0.9, 4, "reinforce", discounting="relative")
    for cls in (MFPO, FedAvgPG, FedPGBR):
        with pytest.raises(ValueError, match="discounting"):
            cls("TabularPolicy", "fedrl/GridWorld-v0", discounting="undiscounted", seed=0, device="cpu")


def test_mfpo_direction_uses_the_relative_weights_and_saves_the_option(tmp_path):
    kwargs = dict(step_size=0.5, local_steps=2, n_trajectories=4, seed=3, device="cpu")
    plain = MFPO("TabularPolicy", "fedrl/GridWorld-v0", **kwargs)
    relative = MFPO("TabularPolicy", "fedrl/GridWorld-v0", discounting="relative", **kwargs)
    assert plain.discounting == "absolute" and plain.update.local.discounting == "absolute"  # the paper's by default
    state = plain.state
    traj = plain.federation.sampler(state.theta, plain.initial_trajectories)
    _, direction, _ = relative.update.direction(lambda th, m: traj, state)
    psi = gpomdp_weights(traj, relative.gamma, "loo", "relative")
    torch.testing.assert_close(direction, score_gradient(relative.policy, state.theta, traj, psi))
    _, d_plain, _ = plain.update.direction(lambda th, m: traj, state)
    assert not torch.allclose(direction, d_plain)
    relative.learn(total_rounds=1)
    relative.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.discounting == "relative" and loaded.update.local.discounting == "relative"


@pytest.mark.parametrize("cls", [FedAvgPG, FedPGBR])
def test_fedavg_pg_and_fedpg_br_take_the_option_and_keep_it(cls, tmp_path):
    model = cls("TabularPolicy", "fedrl/GridWorld-v0", discounting="relative", baseline="loo", seed=0, device="cpu")
    estimator = model.update.estimator if cls is FedPGBR else model.estimator
    assert estimator.discounting == "relative"
    model.learn(total_rounds=1)
    model.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip", device="cpu")
    assert loaded.discounting == "relative"
    assert cls("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu").discounting == "absolute"


def test_reproduce_method_config_passes_gamma_and_discounting_to_every_method():
    from fedrl_algos.reproduce.mfpo import MethodConfig, Population, _quick_methods, train_fedavg, train_mfpo

    with pytest.raises(ValueError, match="discounting"):
        MethodConfig(discounting="future")
    with pytest.raises(ValueError, match="gamma"):
        MethodConfig(gamma=1.5)
    assert MethodConfig().gamma == 0.99 and MethodConfig().discounting == "absolute"  # the paper's

    def trained_return(train, **changes):
        pop = Population("pendulum", [0], 2, _quick_methods(local_steps=2, initial_trajectories=4, **changes))
        points = train(pop)
        return points[-1]["return"], pop

    for train in (lambda pop: train_mfpo(pop, 0, max_rounds=1), lambda pop: train_fedavg(pop, 0, max_rounds=1)):
        base, pop = trained_return(train)
        assert pop.federation.gamma == 0.99
        relative, _ = trained_return(train, discounting="relative")
        short, pop = trained_return(train, gamma=0.9)
        assert pop.federation.gamma == 0.9
        # Same seeds and batches: only the weights differ, so the trained policies' returns do.
        assert not torch.equal(torch.as_tensor(base), torch.as_tensor(relative))
        assert not torch.equal(torch.as_tensor(base), torch.as_tensor(short))
