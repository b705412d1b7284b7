"""Every policy-gradient federation on a Gymnasium environment that fedrl has never seen.

``TestOnlyReach-v0`` is registered here, in the test, and nowhere else: a point on a line starts
near 0 and moves left or right by 0.05 (or by a continuous step in its ``continuous`` version);
each step at or beyond the agent's own ``target`` earns 1. The agents differ in their target
(``agent_kwargs``), so the federation is heterogeneous. The five algorithms train on it, save and
load, predict and adapt, through an id with ``agent_kwargs`` and through a ``FederatedVecEnv``; the
simple learners improve the return with their default settings.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG
from fedrl_algos.common.env_util import envs_per_agent
from fedrl_algos.core import KernelSampler, autograd_score_gradient, policy_gradient, reward_to_go_weights
from fedrl_algos.core.env_sampling import EnvSampler
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.policies import MlpPolicy, TabularPolicy
from fedrl_envs import GRIDWORLD, RandomStreams, derive_keys, stack_params
from fedrl_wrappers import FederatedVecEnv

ENV_ID = "TestOnlyReach-v0"
GRID_ID = "fedrl/GridWorld-v0"
TARGETS = [{"target": 0.4}, {"target": 0.5}, {"target": 0.6}]
STEP = 0.05


class Reach(gym.Env):
    """A point on [-1, 1] that should reach its ``target`` (a test-only environment)."""

    def __init__(self, target: float = 0.5, continuous: bool = False) -> None:
        self.target = float(target)
        self.continuous = continuous
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.x = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-0.2, 0.2))
        return np.array([self.x], np.float32), {}

    def step(self, action):
        move = STEP * float(np.clip(np.asarray(action).reshape(-1)[0], -1, 1)) if self.continuous else (STEP if int(action) == 1 else -STEP)
        self.x = float(np.clip(self.x + move, -1.0, 1.0))
        reward = 1.0 if self.x >= self.target else 0.0
        return np.array([self.x], np.float32), reward, False, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=Reach, max_episode_steps=20)
    gym.register("TestOnlyReachNoLimit-v0", entry_point=Reach)
    gym.register("TestOnlyReachDict-v0", entry_point=lambda: gym.wrappers.TransformObservation(
        Reach(), lambda o: {"x": o}, gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)})), max_episode_steps=20)


def _mc_return(model, n: int = 64) -> float:
    return float(model.federation.evaluate(model.policy.theta.detach().unsqueeze(0), n).mean())


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        # Per-FedAvg-PG's exact variant with its default curvature batch m_h = 10 collapses on this
        # env for some seeds (2 of 3 measured; m_h = 200 trains), the paper's own finding (its
        # section 7: the curvature batch must be ~100x the others); the first-order variant is the
        # one that trains with the default batches.
        (PerFedAvgPG, dict(variant="first_order")),
        (FedAvgPG, {}),
        (IndependentPG, {}),
    ],
    ids=["PerFedAvgPG-first_order", "FedAvgPG", "IndependentPG"],
)
def test_simple_learners_improve_with_default_settings(cls, kwargs):
    model = cls("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, seed=0, device="cpu", **kwargs)
    assert model.is_generic and model.n_agents == 3 and model.steps_per_trajectory == 20
    before = _mc_return(model)
    model.learn(total_rounds=8)
    if cls is IndependentPG:
        after = float(model.federation.evaluate(model.agent_theta.unsqueeze(0), 64).mean())
    else:
        after = _mc_return(model)
    assert after > before + 0.5, (before, after)


@pytest.mark.parametrize(
    "make",
    [
        lambda env: PerFedAvgPG("MlpPolicy", env, local_steps=1, m_in=4, m_h=4, m_out=4, seed=1, device="cpu"),
        lambda env: FedAvgPG("MlpPolicy", env, local_steps=2, n_trajectories=6, seed=1, device="cpu"),
        lambda env: IndependentPG("MlpPolicy", env, n_trajectories=6, seed=1, device="cpu"),
        lambda env: MFPO("MlpPolicy", env, step_size=0.05, local_steps=2, n_trajectories=6, gamma=0.9, seed=1, device="cpu"),
        lambda env: FedPGBR("MlpPolicy", env, step_size=0.05, batch_range=(4, 6), inner_batch_size=2, gamma=0.9, seed=1, device="cpu"),
    ],
    ids=["PerFedAvgPG", "FedAvgPG", "IndependentPG", "MFPO", "FedPGBR"],
)
def test_every_algorithm_trains_saves_loads_and_predicts(make, tmp_path):
    env = FederatedVecEnv(ENV_ID, 4, agent_kwargs=TARGETS, autoreset=False, seed=3)
    model = make(env)
    assert model.get_env() is env
    model.learn(total_rounds=2)
    assert torch.isfinite(model.theta).all()
    model.save(tmp_path / "model.zip")
    loaded = type(model).load(tmp_path / "model.zip", device="cpu")  # the env is rebuilt from the agents' kwargs
    assert torch.equal(loaded.theta, model.theta) and loaded.env_id == ENV_ID and loaded.n_agents == 3
    assert loaded.agent_kwargs == TARGETS
    loaded.learn(total_rounds=1, reset_num_timesteps=False)
    # predict: one observation or a batch, NumPy or torch, as SB3's
    action, _ = loaded.predict(np.array([0.1], np.float32), deterministic=True)
    assert int(action) in (0, 1)
    actions, _ = loaded.predict(torch.tensor([[0.1], [-0.3], [0.6]]), deterministic=True)
    assert actions.shape == (3,)
    # adapt to a new task: that agent's gym.make kwargs
    adapted = loaded.adapt({"target": 0.1}, n_trajectories=16, step_size=0.5)
    assert adapted.theta.shape == model.theta.shape and not torch.equal(adapted.theta.detach(), loaded.theta)
    env.close()


def test_same_seed_same_training_through_an_id_and_through_an_env():
    by_id = FedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, local_steps=2, n_trajectories=6, seed=4, device="cpu").learn(total_rounds=2)
    again = FedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, local_steps=2, n_trajectories=6, seed=4, device="cpu").learn(total_rounds=2)
    assert torch.equal(by_id.theta, again.theta)
    # an id builds as many environments per agent as a local step samples episodes (6)
    assert by_id.get_env().n_envs == 6
    env = FederatedVecEnv(ENV_ID, 6, agent_kwargs=TARGETS, autoreset=False, seed=4)
    by_env = FedAvgPG("MlpPolicy", env, local_steps=2, n_trajectories=6, seed=4, device="cpu").learn(total_rounds=2)
    assert torch.equal(by_id.theta, by_env.theta)
    identical = FedAvgPG("MlpPolicy", ENV_ID, n_agents=2, seed=4, device="cpu")
    assert identical.agent_kwargs == [{}, {}]


@pytest.mark.parametrize(
    "batch, expected", [(None, 16), (1, 1), (4, 4), (16, 16), (17, 9), (20, 10), (32, 16), (33, 11), (100, 15)]
)
def test_envs_per_agent_makes_the_fewest_passes_and_steps_no_environment_for_nothing(batch, expected):
    n_envs = envs_per_agent(batch)
    assert n_envs == expected
    if batch is not None:
        passes = -(-batch // n_envs)
        assert passes == -(-batch // 16) and passes * n_envs - batch < passes  # under one env idle per pass


def test_envs_per_agent_refuses_a_batch_that_is_not_a_positive_int():
    for bad in (0, -3):
        with pytest.raises(ValueError, match="batch"):
            envs_per_agent(bad)
    with pytest.raises(TypeError, match="batch"):
        envs_per_agent(2.5)


@pytest.mark.parametrize("make, batch", [
    (lambda: MFPO("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, n_trajectories=4, eval_trajectories=6, device="cpu"), 4),
    (lambda: FedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, n_trajectories=20, eval_trajectories=6, device="cpu"), 10),
    (lambda: IndependentPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, n_trajectories=3, eval_trajectories=6, device="cpu"), 3),
    (lambda: FedPGBR("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, batch_range=(4, 7), eval_trajectories=6, device="cpu"), 7),
    (lambda: PerFedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, m_in=5, m_out=5, eval_trajectories=6, device="cpu"), 5),
])
def test_a_gymnasium_id_gets_as_many_environments_per_agent_as_a_step_samples(make, batch):
    """A generic env steps every environment on each pass; the one an id builds holds the model's
    batch (at most 16), and the evaluation env its evaluation episodes."""
    model = make()
    try:
        assert model.get_env().n_envs == batch
        assert model.federation.eval_sampler.env.n_envs == 6
        before = [venv.num_envs for venv in model.get_env().agent_envs]
        assert before == [batch] * len(TARGETS)
    finally:
        model.get_env().close()


def test_continuous_actions_through_the_gaussian_policy():
    model = MFPO("MlpPolicy", ENV_ID, agent_kwargs=[{**t, "continuous": True} for t in TARGETS], step_size=0.05,
                 local_steps=2, n_trajectories=4, gamma=0.9, seed=0, device="cpu").learn(total_rounds=2)
    assert model.policy.gaussian and torch.isfinite(model.theta).all()


def test_trajectory_accounting_and_masks_of_an_env_that_resets_itself():
    """An autoreset env contributes its first episode only: the mask ends at the first done flag."""
    env = FederatedVecEnv("CartPole-v1", 3, agent_kwargs=[{}, {}], autoreset=True, seed=0)
    cart = MlpPolicy(env.single_observation_space, env.single_action_space)
    sampler = EnvSampler(env, cart, RandomStreams(derive_keys(0, torch.arange(2))), horizon=60)
    traj = sampler(cart.theta.detach().expand(2, -1), 5)  # 2 passes of 3 envs, the first 5 kept
    assert traj.obs.shape == (2, 5, 61, 4) and traj.mask.shape == (2, 5, 61)
    ended = traj.mask[..., -1] == 0
    assert bool(ended.any())  # a random CartPole policy falls within 60 steps
    assert bool((traj.rewards <= traj.mask).all()) and bool((traj.mask[..., 0] == 1).all())
    lengths = traj.mask.sum(-1)
    assert bool((torch.diff(traj.mask, dim=-1) <= 0).all())  # alive, then dead: never alive again after a reset
    assert float(lengths.min()) >= 1
    env.close()


def test_fixed_horizon_sampling_stops_when_every_episode_ended_and_changes_nothing(monkeypatch):
    """Once all episodes of a pass have terminated, the sampler stops stepping and pads; the
    trajectories, an estimate from them, the streams and the next call are bitwise the same."""
    from fedrl_algos.core import gpomdp

    def sample(stop: bool):
        env = FederatedVecEnv("CartPole-v1", 3, agent_kwargs=[{}, {"sutton_barto_reward": True}], autoreset=False, seed=0)
        if not stop:
            full = env.rollout
            monkeypatch.setattr(env, "rollout", lambda fn, n_steps=None, seed=None, stop_when_done=False: full(fn, n_steps, seed))
        calls = []
        cart = MlpPolicy(env.single_observation_space, env.single_action_space)
        inner = cart.sample

        def counted(theta, obs, streams):
            calls.append(1)
            return inner(theta, obs, streams)

        cart.sample = counted
        streams = RandomStreams(derive_keys(0, torch.arange(2)))
        sampler = EnvSampler(env, cart, streams, horizon=199)
        theta = cart.theta.detach().expand(2, -1)
        out = [sampler(theta, 5), sampler(theta, 5)]  # two passes of 3 envs per call, the first 5 kept
        return cart, theta, out, streams.counters.clone(), len(calls)

    cart, theta, stopped, counters, n_calls = sample(True)
    _, _, full, full_counters, full_calls = sample(False)
    assert n_calls < full_calls == 2 * 2 * 200  # a random policy topples every pole long before 200 steps
    assert torch.equal(counters, full_counters)
    for a, b in zip(stopped, full, strict=True):
        assert a.obs.shape == b.obs.shape == (2, 5, 200, 4) and bool((b.mask[..., -1] == 0).all())
        assert torch.equal(a.rewards, b.rewards) and torch.equal(a.mask, b.mask) and torch.equal(a.obs, b.obs)
        alive = a.mask > 0
        assert torch.equal(a.actions[alive], b.actions[alive])  # padded steps' actions are masked everywhere
        assert torch.equal(gpomdp.gpomdp(cart, theta, a, 0.99), gpomdp.gpomdp(cart, theta, b, 0.99))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="horizon must be given"):
        FedAvgPG("MlpPolicy", "TestOnlyReachNoLimit-v0", agent_kwargs=TARGETS, device="cpu")
    model = FedAvgPG("MlpPolicy", "TestOnlyReachNoLimit-v0", agent_kwargs=TARGETS, horizon=9, device="cpu")
    assert model.steps_per_trajectory == 10
    with pytest.raises(ValueError, match="agent_kwargs must give every agent the same spaces"):
        FedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=[{"continuous": True}, {"continuous": False}], device="cpu")
    with pytest.raises(ValueError, match="env.*Dict"):
        FedAvgPG("MlpPolicy", "TestOnlyReachDict-v0", n_agents=2, device="cpu")
    with pytest.raises(ValueError, match="policy TabularPolicy does not fit"):
        FedAvgPG("TabularPolicy", ENV_ID, agent_kwargs=TARGETS, device="cpu")
    with pytest.raises(ValueError, match="agent_kwargs .* or n_agents"):
        FedAvgPG("MlpPolicy", ENV_ID, device="cpu")
    with pytest.raises(ValueError, match="either agent_kwargs .* or n_agents"):
        FedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, n_agents=3, device="cpu")
    with pytest.raises(ValueError, match="env must be a registered"):
        FedAvgPG("MlpPolicy", "NoSuchEnv-v9", n_agents=2, device="cpu")


def test_a_native_family_through_the_generic_path_estimates_the_same_gradient():
    """The gridworld's own gym.Env under FederatedVecEnv's generic backend (Gymnasium's reset noise,
    not fedrl's streams): the policy gradient estimated from it agrees with the exact gradient (DP),
    as the kernel sampler's does."""
    import fedrl_envs  # noqa: F401  (registers the ids)

    tasks = [{"agent": 0}, {"agent": 3}]
    policy = TabularPolicy(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)
    theta = (torch.randn(2, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5)
    exact = TabularEvaluator("fedrl/GridWorld-v0", gamma=0.9, agents=[0, 3]).grads(theta.unsqueeze(0))[0].diagonal(dim1=0, dim2=1).T
    m = 6000
    # The generic backend is chosen for ids outside fedrl's families: the same env under another id.
    if "TestOnlyGridWorld-v0" not in gym.registry:
        gym.register("TestOnlyGridWorld-v0", entry_point=gym.spec("fedrl/GridWorld-v0").entry_point, max_episode_steps=16)
    venv = FederatedVecEnv("TestOnlyGridWorld-v0", 1000, agent_kwargs=tasks, autoreset=False, seed=0)
    assert venv.backend == "generic"
    sampler = EnvSampler(venv, policy, RandomStreams(derive_keys(1, torch.arange(2))), horizon=15)
    kernel = KernelSampler(GRIDWORLD, stack_params([GRIDWORLD.train_tasks[0], GRIDWORLD.train_tasks[3]]), policy,
                           RandomStreams(derive_keys(1, torch.arange(2))))
    for draw in (sampler, kernel):
        traj = draw(theta, m)
        estimate = policy_gradient(policy, theta, traj, 0.9)
        # z-scores of the m-trajectory means against the exact gradient: ~N(0, 1) if unbiased
        per = autograd_score_gradient(policy, theta, traj, reward_to_go_weights(traj, 0.9), per_trajectory=True)
        stderr = per.std(dim=-2) / m**0.5
        informative = stderr > 1e-9  # coordinates of states never visited have no noise and no gradient
        z = (estimate - exact)[informative] / stderr[informative]
        assert float(z.pow(2).mean()) < 1.5 and float(z.abs().max()) < 5.5, (type(draw).__name__, float(z.pow(2).mean()))
    venv.close()


class Frames(gym.Env):
    """A test-only image env: ``channels`` × 36 × 36 ``uint8`` frames of a bright square left or right of
    centre; action 1 moves it right; reward 1 near the right edge (also tests/test_cnn_critic.py's)."""

    def __init__(self, speed: int = 2, channels: int = 2) -> None:
        self.speed = int(speed)
        self.observation_space = gym.spaces.Box(0, 255, (channels, 36, 36), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 18

    def _obs(self) -> np.ndarray:
        frame = np.zeros(self.observation_space.shape, np.uint8)
        frame[:, 14:22, max(0, self.pos - 4) : self.pos + 4] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(10, 26))
        return self._obs(), {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (self.speed if int(action) == 1 else -self.speed), 4, 32))
        return self._obs(), float(self.pos >= 28), False, False, {}


if "TestOnlyFrames-v0" not in gym.registry:
    gym.register("TestOnlyFrames-v0", entry_point=Frames, max_episode_steps=8)


def test_cnn_policy_on_image_observations():
    """MFPO and FedAvg-PG with CnnPolicy (SB3's Nature CNN) on uint8 frames of a test-only env."""
    for cls, kwargs in ((MFPO, dict(step_size=1e-3, local_steps=2, n_trajectories=4, gamma=0.9)),
                        (FedAvgPG, dict(step_size=1e-3, local_steps=1, n_trajectories=4))):
        model = cls("CnnPolicy", "TestOnlyFrames-v0", agent_kwargs=[{"speed": 2}, {"speed": 3}], seed=0, device="cpu",
                    policy_kwargs=dict(features_dim=32), **kwargs)
        before = model.theta
        model.learn(total_rounds=1)
        assert torch.isfinite(model.theta).all() and not torch.equal(before, model.theta)
        action, _ = model.predict(Frames().reset(seed=0)[0], deterministic=True)
        assert int(action) in (0, 1)


def test_async_agent_envs_give_the_sync_result():
    """vectorization_mode="async" steps every agent's envs in its own processes: same training, bitwise."""
    thetas = []
    for mode in ("async", "sync"):
        env = FederatedVecEnv(ENV_ID, 4, agent_kwargs=TARGETS, autoreset=False, seed=3, vectorization_mode=mode)
        thetas.append(FedAvgPG("MlpPolicy", env, local_steps=1, n_trajectories=4, seed=1, device="cpu").learn(total_rounds=2).theta)
        env.close()
    assert torch.equal(thetas[0], thetas[1])


def test_observation_normalization_is_the_servers_pooled_vecnormalize():
    """``normalize_observations=True``: SB3 VecNormalize's map with moments pooled over agents once
    per round: the trajectories of a round are normalized with the statistics of the rounds before,
    the statistics after a round are the count-weighted moments of every observation sampled so far
    (as one stream of updates), predict applies them, and save/load keeps them."""
    model = FedAvgPG("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, local_steps=2, n_trajectories=6, normalize_observations=True,
                     eval_trajectories=0, seed=2, device="cpu")
    normalizer = model.obs_normalizer
    seen = []
    original = normalizer.accumulate

    def spy(obs, mask):
        seen.append(obs[mask > 0].reshape(-1, 1).double())
        original(obs, mask)

    normalizer.accumulate = spy
    model.learn(total_rounds=1)
    first = torch.cat(seen)
    assert first.shape[0] == 3 * 2 * 6 * 20  # every step of every agent's trajectories of the round
    # one SB3-style update from mean 0, var 1, count 1e-4 with the pooled batch
    n, mean, var = first.shape[0], first.mean(0), first.var(0, unbiased=False)
    expected_mean = mean * n / (n + 1e-4)
    assert torch.allclose(normalizer.mean, expected_mean, atol=1e-9)
    m2 = 1e-4 * 1.0 + var * n + mean * mean * 1e-4 * n / (n + 1e-4)
    assert torch.allclose(normalizer.var, m2 / (n + 1e-4), atol=1e-9)
    # the trajectories of round 2 are normalized with the statistics committed after round 1
    frozen = normalizer.state_dict()
    traj = model.federation.sampler(model.federation.broadcast(model.policy.theta.detach().unsqueeze(0)), 4)
    assert bool((traj.obs.abs() <= 10).all())
    assert torch.equal(normalizer.mean, frozen["mean"])  # nothing commits before the round ends
    raw = torch.tensor([[0.3]])
    action, _ = model.predict(raw.numpy(), deterministic=True)
    expected, _ = model.policy.predict(normalizer.normalize(raw).numpy(), deterministic=True)
    assert np.array_equal(action, expected)


def test_normalization_statistics_survive_save_and_load(tmp_path):
    model = MFPO("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, step_size=0.05, local_steps=2, n_trajectories=4, gamma=0.9,
                 normalize_observations=True, seed=0, device="cpu").learn(total_rounds=2)
    model.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    for key, value in model.obs_normalizer.state_dict().items():
        assert torch.equal(loaded.obs_normalizer.state_dict()[key], value)
    with pytest.raises(ValueError, match="normalize_observations needs Box"):
        FedAvgPG("TabularPolicy", GRID_ID, normalize_observations=True, device="cpu")


def test_set_env_and_load_with_env_keep_the_normalization_statistics_the_policy_learned_with(tmp_path):
    model = MFPO("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, step_size=0.05, local_steps=2, n_trajectories=4, gamma=0.9,
                 normalize_observations=True, seed=0, device="cpu").learn(total_rounds=2)
    learned = model.obs_normalizer.state_dict()
    assert float(learned["count"]) > 1  # moments of two rounds, not the initial ones
    model.save(tmp_path / "m.zip")
    model.set_env(MFPO("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, n_trajectories=4, seed=1, device="cpu").get_env())
    loaded = MFPO.load(tmp_path / "m.zip", env=MFPO("MlpPolicy", ENV_ID, agent_kwargs=TARGETS, n_trajectories=4, seed=1, device="cpu").get_env(),
                       device="cpu")
    for rebound in (model, loaded):
        for key, value in learned.items():
            assert torch.equal(rebound.obs_normalizer.state_dict()[key], value)
        assert rebound._obs_normalizer_state is None  # only a save holds the moments there


def test_runs_batched_in_one_env_equal_each_run_alone():
    """Seeds as a batch over one Gymnasium env: ``R · n`` agents run-major, each seeded by its own
    stream id (``run_env_stream_ids``), so a run's trajectories are the same alone or batched."""
    from fedrl_algos.core.federation import Federation, run_env_stream_ids
    from fedrl_algos.policies import MlpPolicy as Mlp

    seeds = [3, 5]
    policy = Mlp(gym.spaces.Box(-1.0, 1.0, (1,), np.float32), gym.spaces.Discrete(2))
    both = FederatedVecEnv(ENV_ID, 4, agent_kwargs=TARGETS * 2, autoreset=False, seed=0, stream_ids=run_env_stream_ids(seeds, 3))
    batched = Federation.from_env(both, policy, seeds, 0.9)
    assert batched.n_runs == 2 and batched.n_agents == 3
    theta = policy.theta.detach().expand(2, 3, -1) + torch.randn(2, 3, policy.n_params, generator=torch.Generator().manual_seed(0)) * 0.1
    together = [batched.sampler(theta, 6) for _ in range(2)]
    for r, seed in enumerate(seeds):
        alone_env = FederatedVecEnv(ENV_ID, 4, agent_kwargs=TARGETS, autoreset=False, seed=0, stream_ids=run_env_stream_ids([seed], 3))
        alone = Federation.from_env(alone_env, policy, [seed], 0.9)
        for call in range(2):
            mine = alone.sampler(theta[r : r + 1], 6)
            for x, y in zip(mine, together[call]):
                assert torch.equal(x[0], y[r])
        alone_env.close()
    both.close()


def test_mlp_policy_one_hot_encodes_discrete_observations():
    """SB3's MlpPolicy one-hot encodes Discrete observations; so does fedrl's (FrozenLake, Taxi, ...)."""
    model = FedAvgPG("MlpPolicy", "FrozenLake-v1", agent_kwargs=[{"is_slippery": False}, {"is_slippery": True}],
                     local_steps=1, n_trajectories=8, seed=0, device="cpu")
    policy = model.policy
    assert policy.one_hot_observations and policy.sizes[0] == 16 and not policy.is_softmax_mlp
    theta = policy.theta.detach().unsqueeze(0)
    logits = policy.head(theta, torch.tensor([[0, 5, 15]]))  # [1, 3, 4]
    w1 = theta[0, : 16 * 32].reshape(16, 32)  # row s of the first layer is what state s's one-hot selects
    hidden = torch.tanh(w1[[0, 5, 15]] + theta[0, 16 * 32 : 16 * 32 + 32])
    w2 = theta[0, 16 * 32 + 32 : 16 * 32 + 32 + 32 * 4].reshape(32, 4)
    assert torch.allclose(logits[0], hidden @ w2 + theta[0, -4:], atol=1e-6)
    model.learn(total_rounds=1)
    assert torch.isfinite(model.theta).all()
    action, _ = model.predict(np.array(6), deterministic=True)
    assert int(action) in range(4)


def test_env_sampler_stop_when_done_returns_the_prefix_up_to_the_last_running_step():
    from fedrl_algos.core import gpomdp

    def make(stop: bool):
        env = FederatedVecEnv("CartPole-v1", 3, agent_kwargs=[{}, {}], autoreset=False, seed=0)
        cart = MlpPolicy(env.single_observation_space, env.single_action_space)
        return cart, EnvSampler(env, cart, RandomStreams(derive_keys(0, torch.arange(2))), horizon=199, stop_when_done=stop)

    cart, short_sampler = make(True)
    _, full_sampler = make(False)
    theta = cart.theta.detach().expand(2, -1)
    for _ in range(2):
        short, full = short_sampler(theta, 5), full_sampler(theta, 5)
        steps = short.rewards.shape[-1]
        assert steps == int(full.mask.sum(-1).max()) < 200  # the longest episode's length
        assert bool((full.mask[..., steps:] == 0).all())
        for name in ("obs", "rewards", "mask"):
            assert torch.equal(getattr(short, name), getattr(full, name)[..., :steps, :] if name == "obs" else getattr(full, name)[..., :steps])
        assert torch.equal(short.actions[short.mask > 0], full.actions[..., :steps][short.mask > 0])
        assert torch.allclose(gpomdp.gpomdp(cart, theta, short, 0.99), gpomdp.gpomdp(cart, theta, full, 0.99), rtol=1e-5, atol=1e-5)  # float32 sums
    assert torch.equal(short_sampler.streams.counters, full_sampler.streams.counters)


def test_env_sampler_seeds_its_first_reset_only_and_checks_its_batch():
    from fedrl_algos.core.normalization import ObservationNormalizer

    def make(env_seed, dtype=torch.float64, normalizer=None):
        env = FederatedVecEnv("CartPole-v1", 2, agent_kwargs=[{}, {}], autoreset=False, seed=0)
        cart = MlpPolicy(env.single_observation_space, env.single_action_space, dtype=dtype)
        seen = []
        inner = cart.sample

        def recording(theta, obs, streams):
            seen.append(obs.dtype)
            return inner(theta, obs, streams)

        cart.sample = recording
        sampler = EnvSampler(env, cart, RandomStreams(derive_keys(0, torch.arange(2))), horizon=30, env_seed=env_seed,
                             normalizer=normalizer)
        return sampler, cart.theta.detach().expand(2, -1), seen

    a, theta, _ = make(7)
    b, _, _ = make(7)
    first, second = a(theta, 2), a(theta, 2)
    assert torch.equal(b(theta, 2).obs, first.obs)  # the same env_seed: the same first episodes
    assert not torch.equal(second.obs[..., 0, :], first.obs[..., 0, :])  # later calls continue the envs' generators
    assert not torch.equal(make(8)[0](theta, 2).obs[..., 0, :], first.obs[..., 0, :])
    other = MlpPolicy(a.env.single_observation_space, a.env.single_action_space)
    assert a.with_policy(other).policy is other and a.with_policy(other).streams is a.streams
    for bad in (theta[0], theta.reshape(1, 2, -1)[:, :1], torch.zeros(3, theta.shape[-1], dtype=theta.dtype)):
        with pytest.raises(ValueError, match=r"^theta must have one batch row per agent of the federated env \(2, e\.g\. "
                                             r"\[2, d\] or \[runs, agents, d\]\), got shape"):
            a(bad, 2)
    # with a normalizer the policy sees normalized observations in its own dtype
    for dtype in (torch.float32, torch.float64):
        sampler, th, seen = make(7, dtype, ObservationNormalizer((4,)))
        assert sampler(th, 2).obs.dtype == dtype and set(seen) == {dtype}


def test_env_sampler_horizon_errors_say_what_to_do():
    from fedrl_algos.core.env_sampling import episode_horizon

    no_limit = FederatedVecEnv("TestOnlyReachNoLimit-v0", 1, agent_kwargs=TARGETS[:1], autoreset=False, seed=0)
    with pytest.raises(ValueError, match=r"^horizon must be given: TestOnlyReachNoLimit-v0 has no max_episode_steps \(register it "
                                         r"with one, wrap it in gymnasium\.wrappers\.TimeLimit, or pass horizon=H to collect H \+ 1 "
                                         r"steps per episode\)$"):
        episode_horizon(no_limit)
    assert episode_horizon(no_limit, 0) == 0 and episode_horizon(no_limit, 7) == 7
    with pytest.raises(ValueError, match=r"^horizon must be >= 0, got -1$"):
        episode_horizon(no_limit, -1)
    cart = FederatedVecEnv("CartPole-v1", 1, agent_kwargs=[{}], autoreset=False, seed=0)
    policy = MlpPolicy(cart.single_observation_space, cart.single_action_space)
    assert EnvSampler(cart, policy, RandomStreams(derive_keys(0, torch.arange(1))), horizon=499).horizon == 499  # 500 steps fit
    with pytest.raises(ValueError, match=r"^horizon must be < max_episode_steps = 500 of CartPole-v1 in its fixed-horizon mode, "
                                         r"got 500$"):
        EnvSampler(cart, policy, RandomStreams(derive_keys(0, torch.arange(1))), horizon=500)
    looping = FederatedVecEnv("CartPole-v1", 1, agent_kwargs=[{}], autoreset=True, seed=0)
    assert EnvSampler(looping, policy, RandomStreams(derive_keys(0, torch.arange(1))), horizon=600).horizon == 600
