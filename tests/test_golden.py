"""Reproduction numbers against golden files saved before the "one algorithm, one place" restructuring.

``tests/golden/<experiment>.json.gz`` holds the ``records`` of ``results.json`` of

* ``fedrl reproduce personalization`` and ``fedrl reproduce alpha`` (full size, 10 seeds), and
* ``fedrl reproduce fewshot|curvature|mfpo|byzantine --quick`` (2 seeds),

as written by the code of commit eee9621. A change that moves code must leave every record equal
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
    "personalization": [],
    "alpha": [],
    "fewshot": ["--quick"],
    "curvature": ["--quick"],
    "mfpo": ["--quick"],
    "byzantine": ["--quick"],
}


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


@pytest.mark.parametrize("experiment", list(RUNS))
def test_reproduction_records_equal_golden(experiment: str, tmp_path: Path) -> None:
    code = main(["reproduce", experiment, *RUNS[experiment], "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    got = json.loads((tmp_path / experiment / "results.json").read_text())["records"]
    with gzip.open(GOLDEN / f"{experiment}.json.gz", "rt") as f:
        want = json.load(f)["records"]
    # Through JSON both ways, so that tuples/lists and ints/floats compare as written.
    got = json.loads(json.dumps(got, default=float))
    assert got == want, f"{experiment}: {_first_difference(got, want)}"
