"""Server-side Adam as a pure batched function, checked against torch.optim.Adam."""

from __future__ import annotations

import pytest
import torch

from fedrl_algos.core.optim import AdamState, adam_ascent, check_server_optimizer


@pytest.mark.parametrize("betas, eps", [((0.9, 0.999), 1e-8), ((0.5, 0.9), 1e-3)])
def test_adam_ascent_equals_torch_adam_on_the_negated_objective(betas, eps):
    gen = torch.Generator().manual_seed(0)
    theta0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    directions = torch.randn(6, 3, 5, generator=gen, dtype=torch.float64)
    reference = [torch.nn.Parameter(row.clone()) for row in theta0]  # one optimizer per run
    optimizers = [torch.optim.Adam([p], lr=0.01, betas=betas, eps=eps) for p in reference]
    theta, state = theta0.clone(), AdamState.zeros_like(theta0)
    for direction in directions:
        theta, state = adam_ascent(theta, direction, state, 0.01, betas, eps)
        for p, opt, row in zip(reference, optimizers, direction):
            opt.zero_grad()
            p.grad = -row.clone()  # Adam minimizes -J
            opt.step()
    assert torch.allclose(theta, torch.stack([p.detach() for p in reference]), atol=1e-14, rtol=0)
    assert state.step.tolist() == [6.0, 6.0, 6.0]


def test_inactive_rows_keep_parameters_and_state():
    theta = torch.ones(2, 4)
    state = AdamState.zeros_like(theta)
    theta, state = adam_ascent(theta, torch.ones(2, 4), state, 0.1)
    active = torch.tensor([True, False])
    new_theta, new_state = adam_ascent(theta, torch.full((2, 4), 3.0), state, 0.1, active=active)
    assert torch.equal(new_theta[1], theta[1]) and torch.equal(new_state.first[1], state.first[1])
    assert torch.equal(new_state.second[1], state.second[1]) and new_state.step.tolist() == [2.0, 1.0]
    assert not torch.equal(new_theta[0], theta[0])
    # the first step moves every coordinate by lr (bias-corrected m/√v = ±1), in the ascent direction
    assert torch.allclose(theta, torch.full((2, 4), 1.1), atol=1e-6)


def test_check_server_optimizer():
    assert check_server_optimizer("server_optimizer", "adam") == "adam"
    with pytest.raises(ValueError, match="server_optimizer"):
        check_server_optimizer("server_optimizer", "rmsprop")


def test_mismatched_shapes_raise():
    theta = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="moments"):
        adam_ascent(theta, torch.ones(3, 4), AdamState.zeros_like(torch.zeros(1, 4)), 0.1)
    with pytest.raises(ValueError, match="state.step"):
        adam_ascent(theta, torch.ones(3, 4), AdamState(torch.zeros(1), torch.zeros(3, 4), torch.zeros(3, 4)), 0.1)
    with pytest.raises(ValueError, match="direction"):
        adam_ascent(theta, torch.ones(3, 5), AdamState.zeros_like(theta), 0.1)
