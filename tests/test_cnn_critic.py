"""The Nature-CNN critic (:class:`fedrl_algos.policies.critics.CnnCritic`, ``baseline="critic"`` on images).

* The fit's gradient equals finite differences (float64, 36×36×4 frames, a narrow linear layer).
* Every row of φ computed in one batched call equals that row alone (bitwise with ``"rows"``,
  to rounding with the grouped convolution); channel-last frames give the channel-first values.
* ``critic_for_space`` picks the CNN for image spaces; MFPO with ``CnnPolicy`` and
  ``baseline="critic"`` runs a round on a test-only image env and saves and loads bitwise.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_own_env import Frames

from fedrl_algos import MFPO
from fedrl_algos.core.critic import CriticState, MlpCritic, average_critics
from fedrl_algos.policies.critics import CnnCritic, critic_for_space

#: a test-only image env, registered here (also used by tests/test_flower.py)
IMAGE_ENV = "TestOnlyCriticSquares-v0"


class Squares(Frames):
    """tests/test_own_env.py's image env with 4 stacked frames, as Atari's."""

    def __init__(self, speed: int = 2) -> None:
        super().__init__(speed, channels=4)


if IMAGE_ENV not in gym.registry:
    gym.register(IMAGE_ENV, entry_point=Squares, max_episode_steps=6)

SPACE = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)


def _state(critic: CnnCritic, rows: tuple[int, ...], dtype=torch.float64) -> CriticState:
    """Random critics: the initialisation of different seeds with a random output layer and statistics."""
    gen = torch.Generator().manual_seed(1)
    phi = torch.stack([critic.initial_phi(s, dtype) for s in range(int(np.prod(rows)))]).reshape(*rows, -1)
    phi[..., -critic.head_inputs - 1:] = torch.randn(*rows, critic.head_inputs + 1, generator=gen, dtype=dtype) * 0.3
    state = critic.initial_state(phi)
    return state._replace(mean=torch.randn(rows, generator=gen, dtype=dtype), scale=torch.rand(rows, generator=gen, dtype=dtype) + 0.5)


def _frames(*lead: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (*lead, 4, 36, 36), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_the_fit_gradient_equals_finite_differences():
    critic = CnnCritic(SPACE, features_dim=8)
    state = _state(critic, (2,))
    obs = _frames(2, 2, 3)
    gen = torch.Generator().manual_seed(2)
    targets = torch.randn(2, 2, 3, generator=gen, dtype=torch.float64) * 3
    mask = torch.ones(2, 2, 3, dtype=torch.float64)
    mask[0, 1, 2:] = 0  # an episode that ended: its last step does not count

    def loss(phi: torch.Tensor) -> torch.Tensor:
        return critic.loss(state._replace(phi=phi), obs, targets, mask).sum()

    phi = state.phi.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(phi), phi)
    eps = 1e-6
    with torch.no_grad():
        # random directions over all of φ, and single coordinates of every layer (conv, linear, output)
        directions = [torch.randn(phi.shape, generator=gen, dtype=torch.float64) for _ in range(3)]
        d = critic.n_params
        for k in (0, 8 * 8 * 4 * 32 + 5, 40_000, d - 9 * 2 - 3, d - 2, d - 1):
            e = torch.zeros_like(phi)
            e[k % 2, k] = 1.0
            directions.append(e)
        for v in directions:
            numeric = (loss(state.phi + eps * v) - loss(state.phi - eps * v)) / (2 * eps)
            analytic = (grad * v).sum()
            assert abs(float(numeric - analytic)) <= 1e-6 * max(1.0, abs(float(analytic))), (float(numeric), float(analytic))
    # the fit moves along that gradient: n_epochs Adam steps lower the loss (random frames: slowly)
    fitted = critic.fit(state, obs, targets, mask, n_epochs=20, lr=1e-2)
    normalized = critic.normalized_to(state, targets, mask)
    assert torch.allclose(critic.values(normalized, obs, 3), critic.values(state, obs, 3))  # PopArt keeps V
    assert float(critic.loss(fitted, obs, targets, mask).sum()) < 0.97 * float(critic.loss(normalized, obs, targets, mask).sum())


@pytest.mark.parametrize("batching", ["rows", "grouped"])
def test_batched_values_equal_each_row_alone(batching):
    critic = CnnCritic(SPACE, features_dim=16, conv_batching=batching)
    state = _state(critic, (2, 3), torch.float32)
    obs = _frames(2, 3, 2, 5)
    batched = critic.values(state, obs, 4)
    assert batched.shape == (2, 3, 2, 5)
    for r in range(2):
        for a in range(3):
            one = CriticState(state.phi[r, a:a + 1], None, state.mean[r, a:a + 1], state.scale[r, a:a + 1])
            alone = critic.values(one, obs[r, a:a + 1], 3)[0]
            if batching == "rows":
                assert torch.equal(batched[r, a], alone)
            else:
                assert torch.allclose(batched[r, a], alone, rtol=1e-5, atol=1e-5)
    rows = CnnCritic(SPACE, features_dim=16, conv_batching="rows")
    assert torch.allclose(rows.values(state, obs, 4), batched, rtol=1e-5, atol=1e-5)


def test_channel_last_frames_give_the_channel_first_values():
    first = CnnCritic(SPACE, features_dim=8)
    last = CnnCritic(gym.spaces.Box(0, 255, (36, 36, 4), np.uint8), features_dim=8)
    assert last.channels_last and not first.channels_last and last.n_params == first.n_params
    state = _state(first, (2,), torch.float32)
    obs = _frames(2, 1, 3)
    assert torch.equal(last.values(state, obs.permute(0, 1, 2, 4, 5, 3), 3), first.values(state, obs, 3))


def test_critic_for_space_picks_the_cnn_for_images_and_averages_it():
    critic = critic_for_space(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
    assert isinstance(critic, CnnCritic) and critic.features_dim == 512 and critic.n_params == 1_684_641
    assert critic_for_space(SPACE, [32]).features_dim == 32
    with pytest.raises(ValueError, match="critic_net_arch of image observations"):
        critic_for_space(SPACE, [64, 64])
    float_images = gym.spaces.Box(0.0, 1.0, (4, 36, 36), np.float32)  # not an image space for SB3: the flat MLP
    assert isinstance(critic_for_space(float_images), MlpCritic) and critic_for_space(float_images).net_arch == [64, 64]
    small = CnnCritic(SPACE, features_dim=8)
    phi = torch.stack([small.initial_phi(0), small.initial_phi(1)]).unsqueeze(0)
    assert torch.equal(phi[0, 0, -9:], torch.zeros(9)) and not torch.equal(phi[0, 0], phi[0, 1])
    state = small.initial_state(phi)._replace(mean=torch.tensor([[1.0, 3.0]]), scale=torch.tensor([[1.0, 2.0]]))
    averaged = average_critics(small, state)
    assert torch.equal(averaged.phi[0, 0], averaged.phi[0, 1]) and torch.allclose(averaged.mean, torch.tensor([[2.0, 2.0]]))


def _model() -> MFPO:
    return MFPO("CnnPolicy", IMAGE_ENV, agent_kwargs=[{"speed": 2}, {"speed": 3}], seed=0, device="cpu", step_size=1e-3,
                local_steps=2, n_trajectories=3, initial_trajectories=4, gamma=0.9, baseline="critic", n_critic_epochs=2,
                critic_net_arch=[16], policy_kwargs=dict(features_dim=16), eval_trajectories=0)


def test_mfpo_with_the_cnn_critic_learns_saves_and_loads_bitwise(tmp_path):
    model = _model()
    assert isinstance(model.critic_network, CnnCritic) and model.agent_critic_phi.shape == (2, model.critic_network.n_params)
    start = model.agent_critic_phi.clone()
    model.learn(total_rounds=1)
    assert bool(torch.isfinite(model.agent_critic_phi).all()) and not torch.equal(start, model.agent_critic_phi)
    model.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    assert isinstance(loaded.critic_network, CnnCritic) and loaded.critic_net_arch == [16]
    for name in ("agent_critic_phi", "agent_critic_adam_step", "agent_critic_adam_first", "agent_critic_adam_second",
                 "agent_critic_mean", "agent_critic_scale"):
        assert torch.equal(getattr(model, name), getattr(loaded, name)), name
    assert torch.equal(model.theta, loaded.theta)
    model.learn(total_rounds=1, reset_num_timesteps=False)
    loaded.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(model.theta, loaded.theta) and torch.equal(model.agent_critic_phi, loaded.agent_critic_phi)
