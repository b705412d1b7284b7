"""The compiled tabular rollout and softmax (``TabularPolicy(kernels="numba")``) against torch's, bit for bit."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

pytest.importorskip("numba")

from fedrl_algos import PerFedAvgPG  # noqa: E402
from fedrl_algos.core.sampling import rollout  # noqa: E402
from fedrl_algos.policies import TabularPolicy, tabular_compiled  # noqa: E402
from fedrl_algos.policies import tabular as tabular_module  # noqa: E402
from fedrl_algos.policies.tabular import tabulate  # noqa: E402
from fedrl_envs.gridworld import GridWorldFamily  # noqa: E402
from fedrl_envs.params import stack_params  # noqa: E402
from fedrl_envs.rng import RandomStreams  # noqa: E402

GRIDWORLD = GridWorldFamily()


class _EndingChain(GridWorldFamily):
    """The gridworld with terminal transitions: entering the last row of the grid ends the episode."""

    def step(self, state, action, params):
        next_state, reward, _ = super().step(state, action, params)
        return next_state, reward, next_state >= params.n_states - params.size


def _spy(monkeypatch, name: str) -> list[int]:
    """A list that grows by one at every call of ``fedrl_algos.policies.tabular.<name>`` (the real function runs)."""
    calls = []
    real = getattr(tabular_module, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tabular_module, name, spy)
    return calls


@pytest.fixture
def walks(monkeypatch):
    """Counts the compiled walks that run (so a test cannot pass on the torch loop alone)."""
    return _spy(monkeypatch, "compiled_walk")


@pytest.fixture
def softmaxes(monkeypatch):
    """Counts the compiled softmax tables computed."""
    return _spy(monkeypatch, "compiled_softmax")


def _policies(family, task):
    spaces = family.observation_space(task), family.action_space(task)
    return TabularPolicy(*spaces, kernels="torch"), TabularPolicy(*spaces, kernels="numba")


def _rollout_pair(family, runs, m, seed):
    tasks = family.train_tasks
    params = stack_params([t for _ in range(runs) for t in tasks])
    torch_policy, numba_policy = _policies(family, tasks[0])
    theta = 2.0 * torch.randn(runs * len(tasks), torch_policy.n_params, generator=torch.Generator().manual_seed(seed))
    out = []
    for policy in (torch_policy, numba_policy):
        streams = RandomStreams.from_seed(seed, runs * len(tasks))
        streams.advance(seed)  # counters away from zero
        out.append((rollout(family, params, policy, theta, streams, m), streams))
    return out


@pytest.mark.parametrize("family", [GRIDWORLD, _EndingChain()], ids=["gridworld", "terminal"])
@pytest.mark.parametrize("runs,m,seed", [(1, 1, 0), (3, 10, 1), (7, 33, 2)])
def test_compiled_walk_gives_the_torch_loops_trajectories_and_counters(family, runs, m, seed, walks):
    (a, streams_a), (b, streams_b) = _rollout_pair(family, runs, m, seed)
    assert len(walks) == 1
    for field in ("obs", "actions", "rewards", "mask"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.shape == y.shape, field
        assert torch.equal(x, y), field
    assert torch.equal(streams_a.counters, streams_b.counters)
    if isinstance(family, _EndingChain):
        assert bool((a.mask == 0).any()), "the terminal case should end some episodes early"
        model = tabulate(family, stack_params(family.train_tasks), 25, 4)
        assert model is not None and model.any_terminal


def test_training_with_the_compiled_walk_is_bitwise_the_torch_loops_and_saves_its_kernels(tmp_path, walks, softmaxes):
    def train(kernels):
        model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=3, local_steps=2, policy_kwargs={"kernels": kernels})
        return model.learn(total_rounds=3)

    reference = train("torch")
    assert not walks
    assert not softmaxes
    compiled = train("numba")
    assert walks
    assert bool(softmaxes) == tabular_compiled._matches_torch_softmax()  # torch's softmax where the bits would differ
    assert torch.equal(reference.theta, compiled.theta)
    compiled.save(tmp_path / "m.zip")
    loaded = PerFedAvgPG.load(tmp_path / "m.zip")
    assert loaded.policy.kernels == "numba"
    assert torch.equal(loaded.learn(total_rounds=1).theta, reference.learn(total_rounds=1).theta)


def test_the_torch_loop_runs_where_the_compiled_walk_does_not_apply(walks):
    torch_policy, numba_policy = _policies(GRIDWORLD, GRIDWORLD.train_tasks[0])
    params = stack_params(GRIDWORLD.train_tasks)
    theta = torch.randn(len(GRIDWORLD.train_tasks), torch_policy.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    trajectories = [rollout(GRIDWORLD, params, p, theta, RandomStreams.from_seed(0, theta.shape[0]), 4) for p in (torch_policy, numba_policy)]
    assert torch.equal(trajectories[0].actions, trajectories[1].actions)
    assert not walks  # float64 parameters: both ran the torch loop


def test_bad_kernels_are_refused():
    with pytest.raises(ValueError, match="kernels"):
        TabularPolicy(GRIDWORLD.observation_space(GRIDWORLD.train_tasks[0]), GRIDWORLD.action_space(GRIDWORLD.train_tasks[0]), kernels="fast")


# torch's softmax over a short last dimension uses SLEEF's exp with fused multiply-adds on x86 with
# AVX2 or AVX-512; the compiled softmax reproduces that path (elsewhere the policy keeps torch's).
needs_sleef_softmax = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                                         reason="torch's short-row softmax is SLEEF's on x86 with AVX2/AVX-512 only")


def _short_rows(n_actions: int, seed: int) -> torch.Tensor:
    """Random rows over eight decades of scale, and edge rows: ties, ±inf, huge and subnormal
    spreads, exponentials that underflow to subnormals and to zero, a NaN."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-4, 4, 400).repeat_interleave(25).unsqueeze(-1)
    rows = torch.randn(scale.shape[0], n_actions, generator=generator) * scale
    inf, nan = float("inf"), float("nan")
    edges = [[0.0], [-inf], [inf], [1e30, -1e30], [-87.5, 0.0, -100.0], [-103.9, 0.0], [-104.5, 0.0, -3e38], [1e-45, -1e-45], [nan]]
    edge_rows = torch.tensor([(row * n_actions)[:n_actions] if len(row) == 1 else (row + [0.0] * n_actions)[:n_actions] for row in edges])
    return torch.cat([rows, edge_rows]).float()


@needs_sleef_softmax
@pytest.mark.parametrize("n_actions", range(2, 8))
def test_compiled_softmax_is_torchs_bit_for_bit(n_actions):
    x = _short_rows(n_actions, n_actions)
    got, want = tabular_compiled.compiled_softmax(x), torch.softmax(x, dim=-1)
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    assert finite.float().mean() > 0.99
    assert torch.equal(got[finite].view(torch.int32), want[finite].view(torch.int32))  # bits, signed zeros included
    assert tabular_compiled._matches_torch_softmax()


@needs_sleef_softmax
def test_probability_tables_come_from_the_compiled_softmax_with_torchs_bits(softmaxes):
    task = GRIDWORLD.train_tasks[0]
    torch_policy, numba_policy = _policies(GRIDWORLD, task)
    theta = 3.0 * torch.randn(2, 3, torch_policy.n_params, generator=torch.Generator().manual_seed(5))
    reference = torch_policy.probs_table(theta)
    assert not softmaxes
    compiled = numba_policy.probs_table(theta)
    assert len(softmaxes) == 1 and compiled.shape == reference.shape == (2, 3, 25, 4)
    assert torch.equal(compiled, reference)


def test_probability_tables_keep_torchs_softmax_where_the_compiled_one_does_not_apply(softmaxes, monkeypatch):
    task = GRIDWORLD.train_tasks[0]
    torch_policy, numba_policy = _policies(GRIDWORLD, task)
    theta = torch.randn(3, torch_policy.n_params, generator=torch.Generator().manual_seed(6))
    torch_policy.probs_table(theta)  # kernels="torch"
    numba_policy.probs_table(theta.double())  # float64
    numba_policy.probs_table(theta.clone().requires_grad_())  # gradients through θ
    wide = TabularPolicy(GRIDWORLD.observation_space(task), spaces.Discrete(8), kernels="numba")
    wide.probs_table(torch.randn(3, wide.n_params))  # a row as long as an AVX2 register: torch's other path
    monkeypatch.setattr(tabular_compiled, "_matches_torch_softmax", lambda: False)  # a platform whose bits differ
    table = numba_policy.probs_table(theta)
    assert not softmaxes
    assert torch.equal(table, torch.softmax(theta.reshape(3, 25, 4), dim=-1))
