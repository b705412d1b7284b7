"""Test-session set-up shared by tests/, the package doctests and the docs' examples."""

import importlib.util
import os

import torch

# The suite checks numbers, not speed: the batched programs it runs are small, and on a 2-core
# machine shared with other jobs a second OpenMP thread spin-waits (measured 5-10x slower), so the
# whole suite runs single-threaded. Benchmarks (`fedrl bench`) choose their own thread count.
torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_under_pytest_tmp(tmp_path_factory: pytest.TempPathFactory):
    """SB3 algorithms that tests train directly make a log folder per ``learn`` (in the system temp
    directory unless ``SB3_LOGDIR`` says otherwise): keep them in pytest's own temporary tree."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3_logs")))
    yield
    mp.undo()


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has made its factory
def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis (tests/test_fuzz.py) caches what it learns about the code under ``./.hypothesis``
    from collection on: keep that in pytest's temporary tree too, so that a run leaves nothing behind."""
    from hypothesis.configuration import set_hypothesis_home_dir

    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        set_hypothesis_home_dir(factory.mktemp("hypothesis"))
        # Flower keeps state under FLWR_HOME (default ~/.flwr) and Ray its sessions under RAY_TMPDIR
        # (default /tmp/ray): both in pytest's temporary tree, set before tests/test_flower.py imports them.
        os.environ.setdefault("FLWR_HOME", str(factory.mktemp("flwr_home")))
        os.environ.setdefault("RAY_TMPDIR", str(factory.mktemp("ray")))
        # TorchRL and skrl (tests/test_compat.py) import torch._inductor, which makes its cache
        # directory (default /tmp/torchinductor_<user>) on import.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(factory.mktemp("torchinductor")))


def _flower_available() -> bool:
    try:
        return importlib.util.find_spec("flwr") is not None
    except ValueError:
        return False


# fedrl_algos.flower needs the flower extra (Python >= 3.11): without it, its modules' doctests are not collected.
collect_ignore_glob = [] if _flower_available() else ["fedrl_algos/flower/*"]
