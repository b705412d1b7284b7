"""Test-session set-up shared by tests/, the package doctests and the docs' examples."""

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
