"""``fedrl_algos.reproduce.gradient_snr``: noise, signal and disjoint-batch cosines of per-episode gradient terms.

* on synthetic terms ``μ + σ ε`` the trace, the signal and the cosines match their closed forms;
* pure noise has (near-)zero signal and no unit-SNR batch size; bad shapes are ``ValueError``s;
* the Atari measurement runs end to end on a tiny batch and is deterministic for a seed.
"""

from __future__ import annotations

import pytest
import torch

from fedrl_algos.reproduce.gradient_snr import atari_gradient_snr, batch_snr


def test_batch_snr_matches_the_closed_forms_on_synthetic_terms():
    gen = torch.Generator().manual_seed(0)
    n, d, sigma = 4000, 50, 2.0
    mu = torch.zeros(d, dtype=torch.float64)
    mu[:5] = 1.0  # ‖μ‖² = 5, tr Σ = d σ² = 200: 40 episodes for unit SNR
    terms = mu + sigma * torch.randn(n, d, dtype=torch.float64, generator=gen)
    out = batch_snr(terms, batch_sizes=(10, 40, 400, 3000))
    assert out["trace"] == pytest.approx(200.0, rel=0.03)
    assert out["signal_sq"] == pytest.approx(5.0, abs=0.3)
    assert out["episodes_for_unit_snr"] == pytest.approx(40.0, rel=0.1)
    for k in (10, 40, 400):
        assert out["cosine"][k] == pytest.approx(5.0 / (5.0 + 200.0 / k), abs=0.03)
    assert 3000 not in out["cosine"]  # fewer than two disjoint batches of 3000


def test_batch_snr_of_pure_noise_and_bad_input():
    terms = torch.randn(400, 30, generator=torch.Generator().manual_seed(1))
    out = batch_snr(terms)
    # ‖ḡ‖² of pure unit noise is χ²_30 / 400: the signal estimate has standard deviation √60 / 400
    assert abs(out["signal_sq"]) < 4 * 60**0.5 / 400
    assert abs(out["cosine"][10]) < 0.05
    if out["signal_sq"] <= 0:
        assert out["episodes_for_unit_snr"] is None
    with pytest.raises(ValueError, match="per_episode"):
        batch_snr(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="per_episode"):
        batch_snr(torch.zeros(5))


def test_atari_gradient_snr_runs_and_repeats():
    pytest.importorskip("ale_py")
    first = atari_gradient_snr("pong", episodes=2, seed=0, batch_sizes=(1,))
    again = atari_gradient_snr("pong", episodes=2, seed=0, batch_sizes=(1,))
    assert len(first["agents"]) == 2 and first["agents"][0]["trace"] > 0
    assert [a["trace"] for a in first["agents"]] == [a["trace"] for a in again["agents"]]
    assert set(first["agents"][0]["cosine"]) == {1}
    with pytest.raises(ValueError, match="game"):
        atari_gradient_snr("tetris")
