"""Intra-op threads fitted to the work (``fedrl_envs.threads``): one below the crossover, the caller's
setting above it, restored afterwards; the env steps, samplers and estimators run inside such blocks."""

from __future__ import annotations

import threading

import pytest
import torch

import fedrl_envs
import fedrl_envs.threads
from fedrl_algos.core.gpomdp import gpomdp_weights, score_gradient
from fedrl_algos.core.sampling import KernelSampler
from fedrl_envs import ARC_NAVIGATION, CARTPOLE, GRIDWORLD, FamilyVectorEnv, RandomStreams, derive_keys
from fedrl_envs.threads import (
    PARALLEL_MIN_ROWS,
    PARALLEL_MIN_WORK,
    fitted_thread_count,
    fitted_threads,
    intra_op_threads,
    requested_threads,
)
from fedrl_wrappers import FederatedVecEnv

CALLER = 2  # the caller's explicit setting in these tests (the suite itself runs at one thread)


def test_the_count_is_one_below_each_crossover_and_the_callers_at_it():
    with intra_op_threads(CALLER):
        assert fitted_thread_count(PARALLEL_MIN_ROWS - 1) == 1
        assert fitted_thread_count(PARALLEL_MIN_ROWS) == CALLER
        rows = 1000
        below, at = (PARALLEL_MIN_WORK - 1) // rows, -(-PARALLEL_MIN_WORK // rows)
        assert fitted_thread_count(rows, below) == 1
        assert fitted_thread_count(rows, at) == CALLER
        assert fitted_thread_count(1, 0) == 1  # a cost below 1 counts as 1
        # Work through a policy keeps one thread over many rows while rows × cost stays below its crossover.
        assert fitted_thread_count(PARALLEL_MIN_ROWS * 4, 2) == 1
        assert fitted_thread_count(PARALLEL_MIN_WORK // 2, 2) == CALLER
    with intra_op_threads(1):
        assert fitted_thread_count(PARALLEL_MIN_ROWS) == 1  # never more than the caller asked for


def test_blocks_restore_the_callers_setting_also_on_errors():
    with intra_op_threads(CALLER):
        with fitted_threads(10):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == CALLER
        with pytest.raises(RuntimeError, match="boom"), fitted_threads(10):
            raise RuntimeError("boom")
        assert torch.get_num_threads() == CALLER
        assert requested_threads() == CALLER
    assert torch.get_num_threads() == 1


def test_a_large_block_inside_a_small_one_gets_the_callers_threads():
    with intra_op_threads(CALLER), fitted_threads(10):
        assert torch.get_num_threads() == 1 and requested_threads() == CALLER
        with fitted_threads(PARALLEL_MIN_ROWS):
            assert torch.get_num_threads() == CALLER
            with fitted_threads(5):
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == CALLER
        assert torch.get_num_threads() == 1


def test_another_device_is_left_alone():
    with intra_op_threads(CALLER), fitted_threads(10, device="cuda"):
        assert torch.get_num_threads() == CALLER


def test_the_callers_setting_is_per_thread():
    seen = {}

    def worker():
        with intra_op_threads(CALLER), fitted_threads(PARALLEL_MIN_ROWS):
            seen["worker"] = torch.get_num_threads()

    with intra_op_threads(1), fitted_threads(10):  # this thread: requested 1
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen["worker"] == CALLER


class _Recording:
    """Wraps a family method to record the intra-op threads it ran with."""

    def __init__(self, monkeypatch, obj, name):
        self.seen: list[int] = []
        inner = getattr(obj, name)

        def record(*args, **kwargs):
            self.seen.append(torch.get_num_threads())
            return inner(*args, **kwargs)

        monkeypatch.setattr(obj, name, record)


@pytest.mark.parametrize("family", [GRIDWORLD, ARC_NAVIGATION])
def test_vector_env_steps_run_single_threaded_below_the_crossover_and_with_the_callers_threads_above(monkeypatch, family):
    small = FamilyVectorEnv(family, family.train_tasks[:2], n_envs=64, seed=0)
    large = FamilyVectorEnv(family, family.train_tasks[:2], n_envs=PARALLEL_MIN_ROWS // 2, seed=0)
    step = _Recording(monkeypatch, family, "step")
    reset = _Recording(monkeypatch, family, "reset")
    with intra_op_threads(CALLER):
        for env in (small, large):
            env.reset()
            env.step(torch.zeros(env.num_envs, dtype=torch.int64))
        assert torch.get_num_threads() == CALLER
    assert step.seen == [1, CALLER]
    assert reset.seen[0] == 1 and reset.seen[-1] == CALLER


def test_the_federated_env_and_the_sampler_fit_their_threads(monkeypatch):
    fed = FederatedVecEnv("fedrl/GridWorld-v0", n_envs=8, seed=0)
    step = _Recording(monkeypatch, GRIDWORLD, "step")
    with intra_op_threads(CALLER):
        fed.reset()
        fed.step(torch.zeros(fed.num_envs, dtype=torch.int64))
    assert step.seen == [1]

    from fedrl_algos.policies import MlpPolicy

    task = CARTPOLE.train_tasks[0]
    policy = MlpPolicy(CARTPOLE.observation_space(task), CARTPOLE.action_space(task))
    params = fedrl_envs.stack_params([task, task])
    sampler = KernelSampler(CARTPOLE, params, policy, RandomStreams(derive_keys(0, torch.arange(2))), horizon=4)
    theta = policy.initial_parameters().expand(2, -1).contiguous()
    sample = _Recording(monkeypatch, policy, "sample")
    with intra_op_threads(CALLER):
        traj = sampler(theta, 3)
    assert sample.seen and set(sample.seen) == {1}
    # The estimate over this batch is small too; one over a batch past the work crossover is not
    # (the crossover lowered here so that the large batch stays small: 2 rows x 6 trajectories x 5 steps).
    grad = _Recording(monkeypatch, policy, "score_gradient")
    monkeypatch.setattr(fedrl_envs.threads, "PARALLEL_MIN_WORK", 2 * 6 * 5 * theta.shape[-1])
    big = traj._replace(**{k: getattr(traj, k).repeat_interleave(2, dim=1) for k in traj._fields})
    with intra_op_threads(CALLER):
        score_gradient(policy, theta, traj, gpomdp_weights(traj, 0.99))
        score_gradient(policy, theta, big, gpomdp_weights(big, 0.99))
    assert grad.seen == [1, CALLER]


@pytest.mark.parametrize("env_id", ["fedrl/GridWorld-v0", "fedrl/CartPole-v0"])
def test_steps_are_bitwise_the_same_whatever_the_callers_threads(env_id):
    def run(threads):
        with intra_op_threads(threads):
            fed = FederatedVecEnv(env_id, n_envs=300, seed=5)
            out = [fed.reset()[0]]
            gen = torch.Generator().manual_seed(1)
            for _ in range(40):
                obs, reward, term, trunc, _ = fed.step(torch.randint(0, 2, (fed.num_envs,), generator=gen))
                out += [obs, reward, term, trunc]
            return out

    for a, b in zip(run(1), run(CALLER), strict=True):
        assert torch.equal(a, b)
