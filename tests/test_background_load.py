"""``fedrl bench ... --background-load N``: busy processes beside a benchmark, bounded and always ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fedrl_algos.bench.background_load import background_load
from fedrl_algos.cli import build_parser, main


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_processes_spin_and_are_ended_with_the_block():
    with background_load(2) as procs:
        assert len(procs) == 2
        time.sleep(0.6)
        assert all(p.poll() is None for p in procs)
        assert all(_cpu_seconds(p.pid) > 0.1 for p in procs)  # busy, not sleeping
    assert all(p.poll() is not None for p in procs)


def test_the_processes_are_ended_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"), background_load(1) as procs:
        raise RuntimeError("boom")
    assert procs[0].poll() is not None


def test_they_end_by_themselves_after_max_seconds():
    start = time.monotonic()
    with background_load(1, max_seconds=0.3) as procs:
        procs[0].wait(timeout=20)
    assert time.monotonic() - start < 20


def test_they_end_when_the_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from fedrl_algos.bench.background_load import background_load\n"
        "with background_load(1) as procs:\n"
        "    print(procs[0].pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}") and "Z" not in open(f"/proc/{child}/stat").read().split()[2]:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="n must be an int >= 0"), background_load(-1):
        pass
    with pytest.raises(ValueError, match="max_seconds"), background_load(1, max_seconds=0):
        pass


def test_every_bench_target_takes_the_option(capsys):
    parser = build_parser()
    for target in ("envs", "vector", "training", "algos", "single", "kernels", "memory"):
        assert parser.parse_args(["bench", target, "--background-load", "1"]).background_load == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "envs", "--background-load", "-1"])
    assert main(["bench", "envs", "--quick", "--background-load", "1"]) == 0
    assert "background load: 1 busy process(es)" in capsys.readouterr().out
