"""Observation normalization in the reproduction harness (``MethodConfig.normalize_observations``,
``fedrl reproduce mfpo --normalize-observations``): one set of moments per seed, so that seeds
batched in one program stay the runs they would be alone."""

from __future__ import annotations

import json

import pytest
import torch

from fedrl_algos.core.normalization import ObservationNormalizer
from fedrl_algos.reproduce import EXPERIMENTS
from fedrl_algos.reproduce.mfpo import MethodConfig, Population, train_fedpg_br, train_mfpo


def _batch(seed: int, runs: int = 3):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(runs, 2, 4, 5, 2, generator=g, dtype=torch.float64) * torch.tensor([1.0, 3.0], dtype=torch.float64) + 2.0
    mask = (torch.rand(runs, 2, 4, 5, generator=g) > 0.3).double()
    return obs, mask


def test_per_run_moments_are_each_runs_own():
    batched = ObservationNormalizer((2,), runs=3)
    alone = [ObservationNormalizer((2,)) for _ in range(3)]
    for seed in (0, 1):
        obs, mask = _batch(seed)
        mask[2] = 0.0 if seed == 1 else mask[2]  # run 2 samples nothing in the second round: it keeps its moments
        batched.accumulate(obs, mask)
        batched.commit()
        for r, normalizer in enumerate(alone):
            normalizer.accumulate(obs[r], mask[r])
            normalizer.commit()
    for r, normalizer in enumerate(alone):
        torch.testing.assert_close(batched.mean[r], normalizer.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(batched.var[r], normalizer.var, rtol=0, atol=1e-12)
        torch.testing.assert_close(batched.count[r], normalizer.count, rtol=0, atol=0)
    assert not torch.allclose(batched.mean[0], batched.mean[1])  # the runs' moments differ
    obs, _ = _batch(5)
    out = batched.normalize(obs[:, :, 0])  # [runs, agents, envs, *shape]: any batch dimensions after the runs'
    for r, normalizer in enumerate(alone):
        torch.testing.assert_close(out[r], normalizer.normalize(obs[r, :, 0]), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="observations must lead with the normalizer's 3 runs, got shape \\(2, 2\\)"):
        batched.normalize(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="runs must be None or an int >= 1"):
        ObservationNormalizer((2,), runs=0)


def _quick(**changes) -> MethodConfig:
    config = EXPERIMENTS["mfpo"].config(quick=True, env="pendulum")
    return MethodConfig(**{**vars(config.methods), "normalize_observations": True, **changes})


@pytest.mark.parametrize("train", [train_mfpo, lambda pop, budget, max_rounds: train_fedpg_br(pop, budget, max_rounds=max_rounds)[0]])
def test_a_normalized_seed_alone_equals_the_same_seed_batched(train):
    cfg = _quick()
    both = Population("pendulum", [0, 1], 3, cfg)
    one = Population("pendulum", [1], 3, cfg)
    # two rounds (a budget that never ends them): the second normalizes with the first's moments
    batched, alone = train(both, 1e12, max_rounds=2), train(one, 1e12, max_rounds=2)
    assert len(batched) == len(alone) == 2
    for a, b in zip(batched, alone):
        torch.testing.assert_close(a["return"][1:], b["return"], rtol=0, atol=1e-9)
    torch.testing.assert_close(both.normalizer.mean[1], one.normalizer.mean[0], rtol=0, atol=1e-12)
    assert float(one.normalizer.count[0]) > 1  # the rounds' observations were pooled
    plain = Population("pendulum", [1], 3, _quick(normalize_observations=False))
    assert plain.normalizer is None
    assert not torch.allclose(torch.stack([p["return"] for p in train(plain, 1e12, max_rounds=2)]),
                              torch.stack([p["return"] for p in alone]))
    with pytest.raises(TypeError, match="normalize_observations must be a bool"):
        MethodConfig(normalize_observations=1)


def test_fedrl_reproduce_mfpo_normalizes_every_methods_observations(tmp_path):
    from fedrl_algos.cli import main

    code = main(["reproduce", "mfpo", "--env", "cartpole", "--quick", "--seeds", "2", "--no-sweeps", "--normalize-observations",
                 "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    payload = json.loads((tmp_path / "mfpo" / "results.json").read_text())
    assert payload["settings"]["mfpo_methods"]["normalize_observations"] is True
    assert payload["settings"]["methods"]["normalize_observations"] is True
    assert {r["method"] for r in payload["records"]} >= {"MFPO", "FedAvg-PG", "FedPG-BR"}
