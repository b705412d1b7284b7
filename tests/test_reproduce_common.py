"""The seed statistics of the reports' tables (:mod:`fedrl_algos.reproduce.common`): one definition
for every experiment, so each table's "± (seeds)" column means the same thing."""

from __future__ import annotations

import statistics

import pytest
import torch

from fedrl_algos.reproduce.common import mean_std, median


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mean_std_is_the_float64_mean_and_population_std_of_a_tensor(dtype):
    x = torch.randn(10, generator=torch.Generator().manual_seed(0), dtype=dtype)
    wide = x.to(torch.float64)
    assert mean_std(x) == (float(wide.mean()), float(wide.std(unbiased=False)))
    assert mean_std(x)[1] != float(wide.std())  # not the sample std (ddof 1)


def test_mean_std_of_a_list_equals_that_of_its_tensor():
    values = [0.1, 0.7, 0.25, 1.5]
    assert mean_std(values) == mean_std(torch.tensor(values, dtype=torch.float64))
    assert mean_std(tuple(values)) == mean_std(values)
    assert mean_std(values)[1] == pytest.approx(statistics.pstdev(values), rel=1e-15)


def test_mean_std_of_one_value_and_of_none():
    assert mean_std([0.3]) == (0.3, 0.0)
    assert mean_std(torch.tensor([2.0])) == (2.0, 0.0)
    assert mean_std([]) == (None, None)
    assert mean_std(torch.empty(0)) == (None, None)


@pytest.mark.parametrize("values", [[3.0], [2.0, 1.0], [5.0, 1.0, 4.0], [0.3, 0.1, 0.7, 0.2]])
def test_median_is_the_middle_value_or_the_mean_of_the_two_middle_ones(values):
    assert median(values) == statistics.median(values)
