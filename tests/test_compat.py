"""fedrl's envs from the RL libraries users pick (issue 16): TorchRL, skrl, a CleanRL-style loop, SB3.

Each library gets a short rollout (or a few hundred training steps) on the envs as a user makes
them, without adapters of fedrl's. TorchRL and skrl come with the ``compat`` extra (part of
``test``); without them their tests are skipped.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import fedrl_envs  # noqa: F401  (registers the ids)
from fedrl_wrappers import FederatedVecEnv

ARC = "fedrl/ArcNavigation-v0"
STEP = 0.15  # arc navigation: every action moves at most this far (clipped to the box)


# --- TorchRL ----------------------------------------------------------------------------------
def test_torchrl_gym_env_on_the_single_env():
    torchrl_envs = pytest.importorskip("torchrl.envs")
    from torchrl.envs.utils import check_env_specs

    env = torchrl_envs.GymEnv(ARC, agent=1)
    check_env_specs(env)
    td = env.rollout(25, break_when_any_done=False)
    assert td.batch_size == (25,)
    # one episode is 21 steps (H = 20): truncated then, and the rollout goes on in a fresh one
    assert td["next", "truncated"].squeeze(-1).nonzero().flatten().tolist() == [20]


@pytest.mark.parametrize("array_type", ["torch", "numpy"])
def test_torchrl_gym_wrapper_on_make_vec(array_type):
    torchrl_envs = pytest.importorskip("torchrl.envs")
    from torchrl.envs.utils import check_env_specs

    venv = gym.make_vec(ARC, 64, vectorization_mode="vector_entry_point", array_type=array_type)
    env = torchrl_envs.GymWrapper(venv)
    check_env_specs(env)
    td = env.rollout(30, break_when_any_done=False)
    assert td.batch_size == (64, 30)
    obs, next_obs = td["observation"], td["next", "observation"]
    done = td["next", "done"].squeeze(-1)
    assert done[:, 20].all() and done.sum() == 64
    # TorchRL reads the SAME_STEP autoreset right: the done step's next observation is the finished
    # episode's last one (one move away), the following step starts from the reset observation
    assert ((next_obs - obs).norm(dim=-1) <= STEP + 1e-6).all()
    assert torch.equal(obs[:, 1:20], next_obs[:, :19]) and torch.equal(obs[:, 22:], next_obs[:, 21:-1])
    assert not torch.equal(obs[:, 21], next_obs[:, 20])


def test_torchrl_gym_wrapper_on_a_federation():
    torchrl_envs = pytest.importorskip("torchrl.envs")
    from torchrl.envs.utils import check_env_specs

    env = torchrl_envs.GymWrapper(FederatedVecEnv(ARC, 4, seed=0))  # 6 agents x 4 envs
    check_env_specs(env)
    assert env.rollout(5).batch_size == (24, 5)


# --- skrl -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "num_envs"),
    [
        (lambda: gym.make(ARC, agent=2), 1),
        (lambda: gym.make_vec(ARC, 4, vectorization_mode="vector_entry_point"), 4),
        (lambda: FederatedVecEnv(ARC, 2, seed=0), 12),
        (lambda: FederatedVecEnv(ARC, 2, seed=0, array_type="numpy"), 12),
        (lambda: FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {"sutton_barto_reward": True}], seed=0), 4),
    ],
    ids=["single", "native-vector", "federation", "federation-numpy", "federation-generic"],
)
# skrl's wrapper copies the returned torch tensors with torch.tensor(...), which torch warns about
@pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")
def test_skrl_wrap_env_detects_gymnasium(make, num_envs):
    skrl_wrappers = pytest.importorskip("skrl.envs.wrappers.torch")
    from skrl.envs.wrappers.torch.gymnasium_envs import GymnasiumWrapper

    env = skrl_wrappers.wrap_env(make(), verbose=False)  # wrapper="auto": no wrapper= needed
    assert isinstance(env, GymnasiumWrapper) and env.num_envs == num_envs
    obs, _ = env.reset()
    assert obs.shape[0] == num_envs and isinstance(obs, torch.Tensor)
    n = env.action_space.n
    for k in range(30):
        obs, reward, terminated, truncated, _ = env.step(torch.full((num_envs, 1), k % n, dtype=torch.int64))
    assert obs.shape[0] == reward.shape[0] == terminated.shape[0] == truncated.shape[0] == num_envs
    assert reward.dtype == torch.float32


# --- a CleanRL-style NumPy loop ---------------------------------------------------------------
def _reinforce_loop(envs: gym.vector.VectorEnv, n_steps: int) -> list[float]:
    """CleanRL's shape of loop: NumPy in and out, a torch policy, episode stats from Gymnasium's wrapper."""
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    n_obs, n_act = envs.single_observation_space.shape[0], envs.single_action_space.n
    policy = torch.nn.Sequential(torch.nn.Linear(n_obs, 16), torch.nn.Tanh(), torch.nn.Linear(16, n_act))
    optim = torch.optim.Adam(policy.parameters(), lr=1e-2)
    obs, _ = envs.reset(seed=0)
    returns: list[float] = []
    log_probs, rewards = [], []
    for step in range(n_steps):
        dist = torch.distributions.Categorical(logits=policy(torch.as_tensor(obs, dtype=torch.float32)))
        action = dist.sample()
        obs, reward, terminated, truncated, info = envs.step(action.numpy())
        assert isinstance(obs, np.ndarray) and isinstance(reward, np.ndarray)
        log_probs.append(dist.log_prob(action))
        rewards.append(torch.as_tensor(reward, dtype=torch.float32))
        if "episode" in info:
            returns += info["episode"]["r"][info["_episode"]].tolist()
            assert (info["episode"]["l"][info["_episode"]] == 21).all()
        if (step + 1) % 21 == 0:  # one update per episode block
            ret = torch.stack(rewards).flip(0).cumsum(0).flip(0)
            loss = -(torch.stack(log_probs) * (ret - ret.mean())).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            log_probs, rewards = [], []
    return returns


def test_cleanrl_style_loop_on_a_sync_vector_env_of_six_agents():
    envs = gym.vector.SyncVectorEnv([lambda k=k: gym.make(ARC, agent=k) for k in range(6)])
    returns = _reinforce_loop(envs, 22 * 10)
    assert len(returns) >= 6 * 9 and all(0 <= r <= 21 for r in returns)


def test_cleanrl_style_loop_on_the_native_vector_env_in_numpy_mode():
    envs = FederatedVecEnv(ARC, 4, seed=0, array_type="numpy")  # 6 agents x 4 envs, one batched program
    returns = _reinforce_loop(envs, 21 * 10)
    assert len(returns) == 24 * 10 and all(0 <= r <= 21 for r in returns)


# --- Stable-Baselines3 ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [lambda: gym.make("fedrl/CartPole-v0"), lambda: FederatedVecEnv("fedrl/CartPole-v0", 2, seed=0).to_sb3(agent=2)],
    ids=["gym.make", "to_sb3"],
)
def test_sb3_ppo_trains(make):
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", make(), n_steps=128, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(256)
    assert model.num_timesteps == 256
    action, _ = model.predict(np.zeros(4, dtype=np.float32), deterministic=True)
    assert model.action_space.contains(int(action))


# --- the snippets of docs/interop.md ----------------------------------------------------------
def _doc_snippets() -> list[str]:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "interop.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")
@pytest.mark.parametrize("snippet", _doc_snippets(), ids=["torchrl", "skrl", "cleanrl", "sb3"])
def test_docs_interop_snippets_run(snippet):
    for module in ("torchrl", "skrl"):
        if f"from {module}" in snippet:
            pytest.importorskip(module)
    namespace: dict = {}
    exec(compile(snippet, "docs/interop.md", "exec"), namespace)  # noqa: S102
    if "episode_returns" in namespace:
        assert namespace["episode_returns"].shape == (1024,)
    if "rollout" in namespace:
        assert namespace["rollout"].batch_size == (64, 30)
    if "obs" in namespace and "env" in namespace and "skrl" in snippet:
        assert namespace["obs"].shape == (96, 2)
