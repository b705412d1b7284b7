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
