"""CPU against CUDA for whole training rounds (run by ``.ci/gpu-check`` on a GPU machine; skipped elsewhere).

The environments and random streams are bitwise equal on both devices (tests/test_envs.py,
tests/test_federated_env.py). A training round also multiplies and sums floats, which cuBLAS and
CUDA's reductions order differently from the CPU, so parameters after a round agree to float32
rounding, not bitwise.
"""

import pytest
import torch

from fedrl_algos import MFPO, FedPGBR, PerFedAvgPG

CASES = [
    (PerFedAvgPG, {"policy": "TabularPolicy", "env": "fedrl/GridWorld-v0", "variant": "exact"}),
    (PerFedAvgPG, {"policy": "MlpPolicy", "env": "fedrl/ArcNavigation-v0", "variant": "first_order"}),
    (MFPO, {"policy": "MlpPolicy", "env": "fedrl/CartPole-v0"}),
    (FedPGBR, {"policy": "MlpPolicy", "env": "fedrl/CartPole-v0"}),
]
IDS = ["per_fedavg_exact_grid", "per_fedavg_first_order_arc", "mfpo_cartpole", "fedpg_br_cartpole"]


def trained_tensors(cls, kwargs, device):
    """The model's saved parameters after two rounds on ``device``, moved to the CPU, by name."""
    model = cls(device=device, seed=0, **kwargs).learn(total_rounds=2)
    return {
        f"{group}.{name}": tensor.detach().cpu()
        for group, tensors in model.get_parameters().items()
        for name, tensor in tensors.items()
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls, kwargs", CASES, ids=IDS)
def test_two_rounds_on_cuda_match_cpu(cls, kwargs):
    cpu, gpu = trained_tensors(cls, kwargs, "cpu"), trained_tensors(cls, kwargs, "cuda")
    assert cpu.keys() == gpu.keys() and cpu
    for name in cpu:
        torch.testing.assert_close(gpu[name], cpu[name], rtol=1e-4, atol=1e-5, msg=f"{cls.__name__} {name}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_id", ["fedrl/GridWorld-v0", "fedrl/ArcNavigation-v0", "fedrl/CartPole-v0", "fedrl/Pendulum-v0"])
def test_captured_rollouts_on_cuda_match_eager_on_cuda(env_id):
    # The CUDA-graph replay of compiled steps (fedrl_algos.core.capture) against the eager rollout on
    # the same device: identical actions and episode masks, values to float32 rounding, streams alike.
    from fedrl_algos.core.capture import CapturedRollout
    from fedrl_algos.core.sampling import generic_rollout
    from fedrl_algos.policies import MlpPolicy, TabularPolicy
    from fedrl_envs import get_family, params_to, stack_params
    from fedrl_envs.rng import RandomStreams, derive_keys

    family = get_family(env_id)
    params = params_to(stack_params(family.train_tasks), "cuda")
    n, task = len(family.train_tasks), family.train_tasks[0]
    policy = (TabularPolicy if "Grid" in env_id else MlpPolicy)(family.observation_space(task), family.action_space(task)).to("cuda")
    theta = policy.theta.detach().expand(n, -1).clone() + 0.3 * torch.randn(n, policy.theta.numel(), device="cuda")
    horizon = min(family.horizon(params), 100)
    runner = CapturedRollout(family, policy)
    for repeat in range(2):  # the second call replays the recorded graphs
        eager_streams = RandomStreams(derive_keys(repeat, torch.arange(n)), "cuda")
        captured_streams = RandomStreams(derive_keys(repeat, torch.arange(n)), "cuda")
        eager = generic_rollout(family, params, policy, theta, eager_streams, 64, horizon, True)
        captured = runner(params, theta, captured_streams, 64, horizon, True)
        assert torch.equal(eager_streams.counters, captured_streams.counters)
        assert torch.equal(eager.mask, captured.mask)
        if not family.action_space(task).dtype.kind == "f":
            assert torch.equal(eager.actions, captured.actions)
        torch.testing.assert_close(captured.obs, eager.obs, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(captured.rewards, eager.rewards, rtol=1e-3, atol=1e-3)
