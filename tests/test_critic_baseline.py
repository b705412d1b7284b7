"""baseline="critic": a learned value function per agent with GAE(λ) advantages (fedrl_algos.core.critic).

GAE against a hand computation, the batched critic against a loop over agents, unbiasedness of
GPOMDP and MFPO's direction with a frozen critic and λ = 1 against exact dynamic programming on
the gridworld (z-scores over many batches; the variance against "loo" is printed), the fit, the
federated rules, save/load and resume, and the refused arguments.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrl_algos import MFPO
from fedrl_algos.core import rollout
from fedrl_algos.core.critic import MlpCritic, critic_step_weights, gae
from fedrl_algos.core.estimators import discounted_rewards_to_go, relative_rewards_to_go
from fedrl_algos.core.gpomdp import gpomdp, paired_gradients, score_gradient
from fedrl_algos.mfpo.update import momentum_direction
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, index_params, stack_params

GAMMA = 0.9
GRID = "fedrl/GridWorld-v0"
AGENTS = (0, 3)


def z_scores(samples: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    se = samples.std(0) / math.sqrt(samples.shape[0])
    return (samples.mean(0) - reference) / se.clamp(min=1e-12)


def _theta(seed: int = 0, scale: float = 0.3) -> torch.Tensor:
    return torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def _grid_batches(tabular, theta: torch.Tensor, n_batches: int, m: int, seed: int):
    params = index_params(stack_params(GRIDWORLD.train_tasks), torch.tensor(AGENTS).repeat(n_batches))
    rows = theta.repeat(n_batches, 1)
    streams = RandomStreams(derive_keys(seed, torch.arange(len(AGENTS) * n_batches)))
    return rows, rollout(GRIDWORLD, params, tabular, rows, streams, m)


def _exact(evaluator, theta: torch.Tensor) -> torch.Tensor:
    return torch.stack([evaluator.grads(theta[i])[a] for i, a in enumerate(AGENTS)]).reshape(len(AGENTS), -1)


def _per_batch(x: torch.Tensor, n_batches: int) -> torch.Tensor:
    return x.reshape(n_batches, len(AGENTS), -1)


# ---------------------------------------------------------------------------------------------
# GAE


def _gae_by_hand(rewards, values, mask, gamma, lam):
    """One trajectory, plain Python: δ with V = 0 after termination and after the last step."""
    n = len(rewards)
    adv = [0.0] * n
    for h in range(n):
        if not mask[h]:
            continue
        total = 0.0
        for k in range(h, n):
            if not mask[k]:
                break
            nxt = values[k + 1] if k + 1 < n and mask[k + 1] else 0.0
            total += (gamma * lam) ** (k - h) * (rewards[k] + gamma * nxt - values[k])
        adv[h] = total
    return adv


def test_gae_against_a_hand_computation():
    rewards = torch.tensor([[1.0, 0.5, -2.0, 3.0, 0.0], [0.3, 1.0, 2.0, 0.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, -1.0, 0.7, 1.5, 9.0], [1.0, 0.5, -0.3, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.float64)  # row 1 terminates at step 2
    for gamma, lam in ((0.9, 0.95), (0.5, 0.0), (0.99, 1.0)):
        got = gae(rewards, values, mask, gamma, lam)
        for j in range(2):
            expected = _gae_by_hand(rewards[j].tolist(), values[j].tolist(), mask[j].tolist(), gamma, lam)
            assert torch.allclose(got[j], torch.tensor(expected, dtype=torch.float64), atol=1e-12), (gamma, lam, j)
    # λ = 1 telescopes: A_h = G^h − V(s_h); the step weights are R^h − γ^h V(s_h), the targets G^h
    psi, targets = critic_step_weights(values, rewards, mask, 0.9, 1.0)
    discount = 0.9 ** torch.arange(5, dtype=torch.float64)
    assert torch.allclose(psi, (discounted_rewards_to_go(rewards, 0.9) - discount * values) * mask, atol=1e-12)
    assert torch.allclose(targets, relative_rewards_to_go(rewards, 0.9) * mask, atol=1e-12)
    rel, _ = critic_step_weights(values, rewards, mask, 0.9, 1.0, "relative")
    assert torch.allclose(rel, (relative_rewards_to_go(rewards, 0.9) - values) * mask, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# batching over agents, the fit


def _vector_batch(rows=(2, 3), m=4, steps=7, obs_dim=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(*rows, m, steps, obs_dim, generator=gen, dtype=torch.float64)
    targets = torch.randn(*rows, m, steps, generator=gen, dtype=torch.float64) * 50 - 200
    mask = (torch.rand(*rows, m, 1, generator=gen) * steps > torch.arange(steps)).to(torch.float64)
    mask[..., 0] = 1.0
    return obs, targets, mask


def test_batched_over_agents_equals_each_agent_alone():
    critic = MlpCritic(3, [8, 5])
    obs, targets, mask = _vector_batch()
    gen = torch.Generator().manual_seed(1)
    phi = critic.initial_phi(0, torch.float64) + 0.1 * torch.randn(2, 3, critic.n_params, generator=gen, dtype=torch.float64)
    state = critic.initial_state(phi)
    values = critic.values(state, obs, 4)
    fitted = critic.fit(state, obs, targets, mask, 4, 1e-2)
    for r in range(2):
        for a in range(3):
            one = critic.initial_state(phi[r, a])
            assert torch.allclose(critic.values(one, obs[r, a], 2), values[r, a], atol=1e-12)
            alone = critic.fit(one, obs[r, a], targets[r, a], mask[r, a], 4, 1e-2)
            for x, y in zip(alone, fitted, strict=True):
                if isinstance(x, torch.Tensor):
                    assert torch.allclose(x, y[r, a], atol=1e-10)
            assert torch.allclose(alone.moments.first, fitted.moments.first[r, a], atol=1e-10)


def test_the_fit_lowers_the_regression_loss_and_keeps_values_through_renormalization():
    critic = MlpCritic(3, [16])
    obs, targets, mask = _vector_batch(seed=3)
    state = critic.initial_state(critic.initial_phi(0, torch.float64).expand(2, 3, -1).clone())
    renormed = critic.fit(state, obs, targets, mask, 0, 1e-2)  # statistics only: V unchanged (zero output layer: V = μ)
    before = critic.loss(renormed, obs, targets, mask)
    after_state = critic.fit(renormed, obs, targets, mask, 50, 1e-2)
    after = critic.loss(after_state, obs, targets, mask)
    assert (after < 0.9 * before).all(), (before, after)
    # PopArt: new statistics leave V unchanged
    moved = critic._renormalize(after_state, after_state.mean + 17.0, after_state.scale * 3.0)
    assert torch.allclose(critic.values(moved, obs, 4), critic.values(after_state, obs, 4), atol=1e-9)


# ---------------------------------------------------------------------------------------------
# unbiasedness with a frozen critic and λ = 1 against exact dynamic programming


def _frozen_table(tabular, theta):
    """A tabular critic (one-hot states, no hidden layer) fitted on a batch of its own, then frozen."""
    critic = MlpCritic(25, [], discrete=True)
    _, traj = _grid_batches(tabular, theta, 1, 200, seed=99)
    _, targets = critic_step_weights(torch.zeros_like(traj.rewards), traj.rewards, traj.mask, GAMMA, 1.0)
    state = critic.initial_state(critic.initial_phi(0, torch.float64).expand(len(AGENTS), -1).clone())
    return critic, critic.fit(state, traj.obs, targets, traj.mask, 300, 0.05)


def _critic_psi(critic, state, traj, n_batches):
    phi = state.phi.repeat(n_batches, 1)
    mean, scale = state.mean.repeat(n_batches), state.scale.repeat(n_batches)
    big = critic.initial_state(phi)._replace(mean=mean, scale=scale)
    values = critic.values(big, traj.obs, traj.rewards.dim())
    return critic_step_weights(values, traj.rewards, traj.mask, GAMMA, 1.0)[0]


def test_gpomdp_with_a_frozen_critic_is_unbiased_and_reduces_variance(tabular, evaluator):
    n_batches, m = 2000, 10
    theta = _theta(0)
    critic, state = _frozen_table(tabular, theta)
    rows, traj = _grid_batches(tabular, theta, n_batches, m, seed=31)
    psi = _critic_psi(critic, state, traj, n_batches)
    samples = _per_batch(score_gradient(tabular, rows, traj, psi), n_batches)
    z = z_scores(samples, _exact(evaluator, theta))
    assert z.abs().max() < 4.5, float(z.abs().max())
    loo = _per_batch(gpomdp(tabular, rows, traj, GAMMA, "loo"), n_batches)
    ratio = samples.var(0).sum(-1) / loo.var(0).sum(-1)
    print(f"trace cov ratio critic(frozen, λ=1)/loo per agent at m={m}: {[round(float(r), 3) for r in ratio]}")
    assert (ratio < 1.0).all()


def test_mfpo_direction_with_a_frozen_critic_is_unbiased(tabular, evaluator):
    """g and the importance-weighted g_prev share the same critic values (the same ψ)."""
    n_batches, m, nu = 2000, 6, 0.7
    theta = _theta(1)
    theta_prev = theta + _theta(2, scale=0.05)
    critic, state = _frozen_table(tabular, theta)
    rows, traj = _grid_batches(tabular, theta, n_batches, m, seed=32)
    u = torch.randn(len(AGENTS), 100, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 0.1
    psi = _critic_psi(critic, state, traj, n_batches)
    g, g_prev, _, _ = paired_gradients(tabular, rows, theta_prev.repeat(n_batches, 1), traj, psi)
    direction = _per_batch(momentum_direction(g, g_prev, u.repeat(n_batches, 1), nu), n_batches)
    expected = nu * (u - _exact(evaluator, theta_prev)) + _exact(evaluator, theta)
    assert z_scores(direction, expected).abs().max() < 4.5
    assert z_scores(_per_batch(g_prev, n_batches), _exact(evaluator, theta_prev)).abs().max() < 4.5


# ---------------------------------------------------------------------------------------------
# the algorithm class: federated rules, save/load, resume, arguments


def _model(**kwargs):
    base = dict(step_size=0.5, local_steps=2, n_trajectories=4, seed=0, device="cpu", baseline="critic", critic_net_arch=[8])
    return MFPO("TabularPolicy", GRID, **{**base, **kwargs})


def test_critic_rules_local_and_average():
    local = _model().learn(total_rounds=2)
    assert local.agent_critic_phi.shape[0] == local.n_agents
    assert local.agent_critic_phi.std(0).max() > 0  # heterogeneous agents keep their own critics
    avg = _model(critic_aggregation="average").learn(total_rounds=2)
    assert torch.equal(avg.agent_critic_phi, avg.agent_critic_phi[:1].expand_as(avg.agent_critic_phi))
    assert not torch.equal(local.policy.theta, _model(baseline="loo").learn(total_rounds=2).policy.theta)


def test_save_load_and_resume_bitwise(tmp_path):
    straight = _model().learn(total_rounds=2)
    half = _model().learn(total_rounds=1)
    half.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.baseline == "critic" and loaded.critic_net_arch == [8]
    assert torch.equal(loaded.agent_critic_phi, half.agent_critic_phi)
    resumed = loaded.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(resumed.policy.theta, straight.policy.theta)
    for name in ("agent_critic_phi", "agent_critic_adam_first", "agent_critic_adam_second", "agent_critic_mean", "agent_critic_scale"):
        assert torch.equal(getattr(resumed, name), getattr(straight, name)), name


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"gae_lambda": 1.5}, "gae_lambda"),
    ({"n_critic_epochs": -1}, "n_critic_epochs"),
    ({"critic_learning_rate": 0.0}, "critic_learning_rate"),
    ({"critic_aggregation": "median"}, "critic_aggregation"),
    ({"critic_net_arch": "64"}, "critic_net_arch"),
    ({"critic_activation": "gelu"}, "critic_activation"),
    ({"estimator": "reinforce"}, "estimator"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        _model(**kwargs)


def test_reproduce_configs_refuse_the_critic_where_no_critic_is_kept():
    """The adaptation baselines of the paper experiments' configs take no critic (only a model holds one)."""
    from fedrl_algos.core.adaptation import check_adaptation_baseline

    with pytest.raises(ValueError, match="inner_baseline must be one of .*got 'critic'"):
        check_adaptation_baseline("critic", "inner_baseline")
    assert check_adaptation_baseline("critic", "inner_baseline", allow_critic=True) == "critic"
