"""``normalize_advantage``: step weights divided by their standard deviation over each batch row.

* the normalized weights of every row have standard deviation 1 over its running steps, padded
  steps stay 0, and rows are normalized independently;
* scale invariance: rewards × c give the same weights (so the same MFPO direction);
* MFPO's first direction with the option is the plain one divided by the row's standard deviation
  (exact), and the option defaults to off (the paper's estimator), is validated and persisted.
"""

from __future__ import annotations

import pytest
import torch
from gymnasium.spaces import Discrete

from fedrl_algos import MFPO
from fedrl_algos.core.gpomdp import ScoreFunctionGradient, gpomdp_weights, normalize_step_weights
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.policies import TabularPolicy


def _traj(rows: int = 3, m: int = 5, horizon: int = 6, seed: int = 0) -> Trajectories:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, m, horizon, dtype=torch.float64)
    mask[0, 1, 3:] = 0
    mask[2, :, 4:] = 0
    rewards = torch.randn(rows, m, horizon, dtype=torch.float64, generator=gen) * mask
    rewards[1] *= 100.0  # rows on very different scales
    states = torch.randint(0, 4, (rows, m, horizon), generator=gen)
    actions = torch.randint(0, 2, (rows, m, horizon), generator=gen)
    return Trajectories(states, actions, rewards, mask)


def test_normalized_weights_have_unit_std_per_row_and_keep_padding_zero():
    traj = _traj()
    psi = gpomdp_weights(traj, 0.9)
    out = normalize_step_weights(psi, traj.mask)
    for r in range(3):
        alive = traj.mask[r] > 0
        torch.testing.assert_close(out[r][alive].std(unbiased=False), torch.tensor(1.0, dtype=torch.float64), rtol=1e-6, atol=0)
        torch.testing.assert_close(out[r], psi[r] / psi[r][alive].std(unbiased=False), rtol=1e-6, atol=1e-12)
        assert (out[r][~alive] == 0).all()
    # A row of zeros (no signal) stays zero instead of dividing 0 by 0.
    assert torch.equal(normalize_step_weights(torch.zeros(2, 3, 4), torch.ones(2, 3, 4)), torch.zeros(2, 3, 4))


def test_normalized_weights_do_not_depend_on_the_reward_scale():
    traj = _traj()
    est = ScoreFunctionGradient(TabularPolicy(Discrete(4), Discrete(2)), 0.9, 5, normalize_advantage=True)
    scaled = traj._replace(rewards=traj.rewards * 37.0)
    torch.testing.assert_close(est.weights(scaled), est.weights(traj), rtol=1e-7, atol=1e-9)  # up to the 1e-8 added to s
    plain = ScoreFunctionGradient(TabularPolicy(Discrete(4), Discrete(2)), 0.9, 5)
    torch.testing.assert_close(plain.weights(scaled), 37.0 * plain.weights(traj))
    with pytest.raises(TypeError, match="normalize_advantage"):
        ScoreFunctionGradient(TabularPolicy(Discrete(4), Discrete(2)), 0.9, 5, normalize_advantage=1)


def test_mfpo_first_direction_is_the_plain_one_over_the_batch_std(tmp_path):
    kwargs = dict(step_size=0.5, local_steps=2, n_trajectories=4, seed=3, device="cpu")
    plain = MFPO("TabularPolicy", "fedrl/GridWorld-v0", **kwargs)
    normed = MFPO("TabularPolicy", "fedrl/GridWorld-v0", normalize_advantage=True, **kwargs)
    assert plain.normalize_advantage is False  # the paper's estimator by default
    sampler = plain.federation.sampler
    state = plain.state
    theta = state.theta
    traj = sampler(theta, plain.initial_trajectories)
    psi = plain.update.initial.weights(traj)
    std = torch.stack([psi[0, i][traj.mask[0, i] > 0].std(unbiased=False) for i in range(plain.n_agents)])
    _, d_plain, _ = plain.update.direction(lambda th, m: traj, state)
    _, d_normed, _ = normed.update.direction(lambda th, m: traj, state)
    torch.testing.assert_close(d_normed[0], d_plain[0] / (std.unsqueeze(-1) + 1e-8), rtol=1e-5, atol=1e-7)
    assert d_plain.abs().max() > 0
    normed.learn(total_rounds=1)
    normed.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.normalize_advantage is True and loaded.update.local.normalize_advantage is True
    with pytest.raises(TypeError, match="normalize_advantage"):
        MFPO("TabularPolicy", "fedrl/GridWorld-v0", normalize_advantage="yes", **kwargs)
