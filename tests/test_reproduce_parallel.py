"""Parts of a reproduction program run at the same time: the results are bitwise the serial ones.

``fedrl_algos.reproduce.parallel`` runs independent parts of a program in forked children
(``run_forked``) or threads (``run_threaded``); the experiments use it with their config's
``workers`` (default 2). Every test here compares ``workers=2`` against ``workers=1`` with
``torch.equal`` / ``==`` on the records, so a change that made a part compute anything differently
(another batch layout, another order of a reduction) fails here.
"""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch

from fedrl_algos.reproduce import EXPERIMENTS
from fedrl_algos.reproduce.neural import FewShotConfig, MetaSweep, arc_policy, few_shot
from fedrl_algos.reproduce.parallel import balanced_groups, can_fork, check_workers, run_forked, run_threaded
from fedrl_algos.reproduce.tabular import ALPHAS, METHODS, TabularConfig, train_tabular

needs_fork = pytest.mark.skipif(not can_fork(), reason="forking needs the main thread and the 'fork' start method")


# --- the helpers ---------------------------------------------------------------------------------------
@needs_fork
def test_run_forked_runs_the_parts_in_other_processes_and_returns_them_in_order():
    parent = os.getpid()
    results = run_forked([lambda: (os.getpid(), torch.arange(3)), lambda: (os.getpid(), torch.ones(2, 2))], workers=2)
    (pid0, first), (pid1, second) = results
    assert pid0 == parent and pid1 != parent  # the first part here, the second in a child
    assert torch.equal(first, torch.arange(3)) and torch.equal(second, torch.ones(2, 2))


def test_run_forked_with_one_worker_runs_everything_here_in_order():
    parent = os.getpid()
    calls: list[int] = []
    results = run_forked([lambda: calls.append(0) or os.getpid(), lambda: calls.append(1) or os.getpid()], workers=1)
    assert results == [parent, parent] and calls == [0, 1]


@needs_fork
def test_a_failing_forked_part_raises_in_the_parent_with_its_message():
    def fail() -> None:
        raise ValueError("broken part")

    with pytest.raises(RuntimeError, match="broken part"):
        run_forked([lambda: 1, fail], workers=2)


@needs_fork
def test_run_forked_refuses_more_parts_than_workers():
    with pytest.raises(ValueError, match="at most workers=2"):
        run_forked([lambda: 0] * 3, workers=2)


def test_run_forked_does_not_fork_off_the_main_thread():
    out: list = []
    thread = threading.Thread(target=lambda: out.append((can_fork(), run_forked([os.getpid, os.getpid], workers=2))))
    thread.start()
    thread.join()
    allowed, pids = out[0]
    assert allowed is False and pids == [os.getpid(), os.getpid()]
    assert can_fork("meta") is False  # only CPU programs are forked


def test_run_threaded_keeps_order_and_the_callers_intra_op_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = run_threaded([lambda k=k: (k, torch.get_num_threads(), threading.get_ident()) for k in range(3)], workers=2)
    finally:
        torch.set_num_threads(before)
    assert [k for k, _, _ in results] == [0, 1, 2]
    assert {n for _, n, _ in results} == {1}


def test_check_workers_and_balanced_groups():
    with pytest.raises(ValueError, match="workers"):
        check_workers(0)
    with pytest.raises(ValueError, match="workers"):
        check_workers(True)
    groups = balanced_groups(["a", "b", "c", "d"], {"a": 5.0, "b": 4.0, "c": 3.0, "d": 2.0}.__getitem__, 2)
    assert groups == [["a", "d"], ["b", "c"]]  # loads 7 and 7, heaviest first, items in their order
    assert balanced_groups([3, 1, 2], float, 1) == [[3, 1, 2]]
    assert balanced_groups([1], float, 4) == [[1]]
    with pytest.raises(ValueError, match="workers"):
        EXPERIMENTS["alpha"].config(workers=0)


# --- the experiments: workers=2 is bitwise workers=1 ---------------------------------------------------
@needs_fork
def test_tabular_training_and_evaluation_in_parts_equal_the_serial_program():
    cfg = dataclasses.replace(TabularConfig(), rounds=3, tau=2)
    alphas = ALPHAS[:5]  # an odd number: unequal α chunks
    serial = train_tabular(range(3), alphas, cfg, workers=1)
    parts = train_tabular(range(3), alphas, cfg, workers=2)
    for method in METHODS:
        assert torch.equal(serial[method].theta, parts[method].theta), method
        assert torch.equal(serial[method].F, parts[method].F), method
        assert torch.equal(serial[method].f, parts[method].f), method


def test_curvature_local_steps_with_threads_equal_the_serial_steps():
    policy = arc_policy()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        thetas = {}
        for workers in (1, 2):
            sweep = MetaSweep(policy, range(2), [10, 40, 25, None], tau=2, workers=workers)
            for _ in range(2):
                sweep.round()
            thetas[workers] = sweep.thetas()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(thetas[1], thetas[2])


@pytest.mark.parametrize("kernels", ["torch", "numba"])
def test_curvature_evaluation_in_row_parts_equals_one_batch(kernels):
    """``MetaSweep.evaluate`` splits its rows across the workers: the numbers of one batch, the streams left alike."""
    from fedrl_algos.core.estimators import policy_gradient
    from fedrl_algos.reproduce.neural import evaluate_rows

    if kernels == "numba":
        pytest.importorskip("numba")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {}
        for workers in (1, 2, 3):
            sweep = MetaSweep(arc_policy(kernels=kernels), range(2), [20, None], workers=workers)
            sweep.round()
            first, second = sweep.evaluate(32, 40), sweep.evaluate(8, 8)
            runs[workers] = (first, second, sweep.federation.eval_streams.counters.clone())
        # the batch as one: the adaptation rollout, its gradient and both evaluations over every row
        sweep = MetaSweep(arc_policy(kernels=kernels), range(2), [20, None], workers=1)
        sweep.round()
        fed = sweep.federation
        pre = fed.broadcast(sweep.theta)
        post = pre + sweep.alpha * policy_gradient(sweep.policy, pre, sweep.eval_sampler(pre, 32), sweep.gamma)
        want = [evaluate_rows(sweep.family, fed.row_params, sweep.policy, th, fed.eval_streams, 40) for th in (pre, post)]
    finally:
        torch.set_num_threads(before)
    shape = (2, 2, 6)
    assert torch.equal(runs[1][0]["return_pre"], want[0][0].reshape(shape))
    assert torch.equal(runs[1][0]["success_post"], want[1][1].reshape(shape))
    for workers in (2, 3):
        for a, b in zip(runs[1][:2], runs[workers][:2], strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert torch.equal(runs[1][2], runs[workers][2])


@needs_fork
@pytest.mark.parametrize("kernels", ["torch", "numba"])
def test_fewshot_with_the_seeds_split_across_processes_equals_the_serial_run(kernels):
    if kernels == "numba":
        pytest.importorskip("numba")
    cfg = dataclasses.replace(FewShotConfig().quick(), kernels=kernels)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = few_shot(dataclasses.replace(cfg, workers=1), 3, "cpu", progress=False)  # 3 seeds: parts of 2 and 1
        parts = few_shot(dataclasses.replace(cfg, workers=2), 3, "cpu", progress=False)
    finally:
        torch.set_num_threads(before)
    assert serial["records"] == parts["records"]
    assert torch.equal(serial["theta_meta"], parts["theta_meta"])
