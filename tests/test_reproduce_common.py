"""The seed statistics of the reports' tables (:mod:`fedrl_algos.reproduce.common`): one definition
for every experiment, so each table's "± (seeds)" column means the same thing; and the label of a
quick run's report (issue 36: a smoke run's numbers beside the paper's must say what they are)."""

from __future__ import annotations

import statistics

import pytest
import torch

from fedrl_algos.reproduce import EXPERIMENTS
from fedrl_algos.reproduce.common import (
    ExperimentOutput,
    TableRow,
    is_quick_config,
    mean_std,
    median,
    quick_run_label,
    write_report,
)


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


def test_quick_run_label_names_the_rounds_and_seeds():
    assert quick_run_label({"rounds": 4}, 2) == "QUICK SMOKE RUN: 4 rounds, 2 seeds, not comparable with the paper"
    assert quick_run_label({"rounds": 1}, 1) == "QUICK SMOKE RUN: 1 round, 1 seed, not comparable with the paper"
    assert quick_run_label({}) == "QUICK SMOKE RUN, not comparable with the paper"


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_quick_config_is_recognised_and_no_paper_config_is(name):
    experiment = EXPERIMENTS[name]
    assert is_quick_config(experiment.config(quick=True)) and not is_quick_config(experiment.config())
    assert isinstance(experiment.config(quick=True).rounds, int)  # the label names them


@pytest.mark.parametrize("quick", [True, False])
def test_the_report_of_a_quick_run_says_it_is_a_smoke_run(tmp_path, quick):
    experiment = EXPERIMENTS["personalization"]
    output = ExperimentOutput(records=[], table=[TableRow("F, exact variant", 0.79, 0.31, 0.02, "")], settings={"rounds": 4})
    text = write_report(experiment, output, 1.0, [], tmp_path, quick=quick, seeds=2).read_text()
    label = "QUICK SMOKE RUN: 4 rounds, 2 seeds, not comparable with the paper"
    assert (label in text) is quick and ("this run (quick smoke)" in text) is quick
    if quick:  # above the table, where the numbers are read
        assert text.index(label) < text.index("| quantity | paper |")
    else:
        assert "| quantity | paper | this run | ± (seeds) | note |" in text and "QUICK" not in text
