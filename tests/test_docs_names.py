"""Every dotted ``fedrl_envs.*``/``fedrl_wrappers.*``/``wrappers.*``/``fedrl_algos.*`` name quoted in README.md and docs/ exists.

Code moves (issue 11 moved most of ``fedrl_algos``); a page that names a function which is no longer
there misleads the reader, so the names in backticks are resolved here: the longest importable
module prefix, then attributes.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NAME = re.compile(r"`((?:fedrl_algos|fedrl_envs|fedrl_wrappers|wrappers)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # deprecated aliases still count
                for attribute in parts[i:]:
                    obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_names_quoted_in_the_docs_exist(page: Path) -> None:
    # ``wrappers.py`` is a file name (a user's own module), not a dotted name of the library
    names = sorted(n for n in set(NAME.findall(page.read_text())) if not n.endswith(".py"))
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_resolver_can_fail() -> None:
    assert _resolves("fedrl_algos.core.aggregation.aggregate")
    assert not _resolves("fedrl_algos.core.meta.aggregate")
