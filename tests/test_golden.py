"""Reproduction numbers against golden files saved before the "one algorithm, one place" restructuring.

``tests/golden/<experiment>.json.gz`` holds the ``records`` of ``results.json`` of

* ``fedrl reproduce personalization`` and ``fedrl reproduce alpha`` (full size, 10 seeds), and
* ``fedrl reproduce fewshot|curvature|mfpo|byzantine --quick`` (2 seeds),

as written by the code of commit eee9621, and ``fewshot_numba.json.gz``: the full ``fewshot`` run with
the compiled MLP kernels (``--kernels numba``), as written by the commit that added them. A change that moves code must leave every record equal
(bitwise: JSON writes floats with ``repr``, which round-trips exactly). A change that is *meant* to
change a number updates the golden file in the same commit and says why in its message.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from fedrl_algos.cli import main

GOLDEN = Path(__file__).parent / "golden"

RUNS = {
    # The tabular experiments' two rollout loops give the same bits (fedrl_algos.policies.tabular_compiled):
    # personalization runs both at full size; alpha its default (the compiled loop where Numba is installed).
    "personalization": ("personalization", ["--kernels", "torch"]),
    "personalization-numba": ("personalization", ["--kernels", "numba"]),
    "alpha": ("alpha", []),
    "fewshot": ("fewshot", ["--quick", "--kernels", "torch"]),
    "curvature": ("curvature", ["--quick", "--kernels", "torch"]),
    "mfpo": ("mfpo", ["--quick"]),
    "byzantine": ("byzantine", ["--quick"]),
    # The compiled MLP kernels round differently (fedrl_algos.policies.mlp.compiled), but in the
    # quick runs no action flips, so their records are the torch kernels' golden ones ...
    "fewshot-numba": ("fewshot", ["--quick", "--kernels", "numba"]),
    "curvature-numba": ("curvature", ["--quick", "--kernels", "numba"]),
}
#: golden files of the compiled kernels' own numbers (written by the commit that added the kernels):
#: ... and at full size they part from the torch kernels, so the full fewshot run has its own
GOLDEN_FILES = {"fewshot-numba-full": "fewshot_numba"}
RUNS["fewshot-numba-full"] = ("fewshot", ["--kernels", "numba"])
#: ... and those numbers depend on the CPU Numba compiles for (LLVM's host target: its vector width
#: and math routines), so the full run keeps one golden file per host it was written on:
#: ``fewshot_numba`` by the commit that added the kernels on an AMD EPYC (docs/benchmarks.md; its LLVM
#: name was not recorded: the Zen 4/5 names, the AVX-512 EPYCs, are assumed),
#: ``fewshot_numba_rocketlake`` by main at f060b65 on the Intel Xeon (LLVM ``rocketlake``) of
#: 2026-12-04, where the first file's records part at record 108 (one action flips, then the runs
#: diverge). Elsewhere the full run is skipped; the quick numba runs above are checked everywhere.
HOST_GOLDEN_FILES = {"fewshot-numba-full": {"znver4": "fewshot_numba", "znver5": "fewshot_numba",
                                            "rocketlake": "fewshot_numba_rocketlake"}}
NEEDS_NUMBA = {"personalization-numba", "fewshot-numba", "curvature-numba", "fewshot-numba-full"}


def _first_difference(got: list[dict], want: list[dict]) -> str:
    if len(got) != len(want):
        return f"{len(got)} records, golden has {len(want)}"
    worst, where = 0.0, None
    for k, (a, b) in enumerate(zip(got, want)):
        if a.keys() != b.keys():
            return f"record {k} has keys {sorted(a)}, golden {sorted(b)}"
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y):
                if abs(x - y) > worst:
                    worst, where = abs(x - y), (k, key, x, y)
            elif x != y:
                return f"record {k}, field {key!r}: {x!r} != golden {y!r}"
    return f"largest difference {worst:.3g} at record {where[0]} field {where[1]!r}: {where[2]!r} vs golden {where[3]!r}"


@pytest.mark.parametrize("run", list(RUNS))
def test_reproduction_records_equal_golden(run: str, tmp_path: Path) -> None:
    if run in NEEDS_NUMBA:
        pytest.importorskip("numba")
    golden = GOLDEN_FILES.get(run, experiment := RUNS[run][0])
    if run in HOST_GOLDEN_FILES:
        from llvmlite.binding import get_host_cpu_name

        host = get_host_cpu_name()
        if host not in HOST_GOLDEN_FILES[run]:
            pytest.skip(f"{run}'s numbers depend on the CPU Numba compiles for; no golden file for host {host!r}")
        golden = HOST_GOLDEN_FILES[run][host]
    args = RUNS[run][1]
    code = main(["reproduce", experiment, *args, "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    results = json.loads((tmp_path / experiment / "results.json").read_text())
    if "--kernels" in args:
        assert results["settings"]["kernels"] == args[args.index("--kernels") + 1]
    got = results["records"]
    with gzip.open(GOLDEN / f"{golden}.json.gz", "rt") as f:
        want = json.load(f)["records"]
    # Through JSON both ways, so that tuples/lists and ints/floats compare as written.
    got = json.loads(json.dumps(got, default=float))
    assert got == want, f"{run}: {_first_difference(got, want)}"
