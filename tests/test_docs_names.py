"""Every dotted ``fedrl_envs.*``/``fedrl_wrappers.*``/``wrappers.*``/``fedrl_algos.*`` name quoted in README.md and docs/ exists.

Code moves (issue 11 moved most of ``fedrl_algos``); a page that names a function which is no longer
there misleads the reader, so the names in backticks are resolved here: the longest importable
module prefix, then attributes.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NAME = re.compile(r"`((?:fedrl_algos|fedrl_envs|fedrl_wrappers|wrappers)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _resolve(name: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(name)


def _resolves(name: str) -> bool:
    try:
        _resolve(name)
    except (ImportError, AttributeError):
        return False
    return True


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_names_quoted_in_the_docs_exist(page: Path) -> None:
    # ``wrappers.py`` is a file name (a user's own module), not a dotted name of the library
    names = sorted(n for n in set(NAME.findall(page.read_text())) if not n.endswith(".py"))
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_resolver_can_fail() -> None:
    assert _resolves("fedrl_algos.core.aggregation.aggregate")
    assert not _resolves("fedrl_algos.core.meta.aggregate")


#: the tag a row of the equation table starts with: ``eq. (N)``, ``Algorithm N``, ``section X``
EQUATION_TAG = re.compile(r"^(?:eq\. (\(\d+\))|(Algorithm [\d.]+)|(section [\w-]+))")


def equation_rows() -> list[tuple[str, str, str]]:
    """``(paper, equation, first function)`` of every row of architecture.md's equation table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Paper equation → function"):].split("\n## ")[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 3 and cells[0] not in ("paper", "---"):
            rows.append((cells[0], cells[1], NAME.findall(cells[2])[0]))
    return rows


def test_each_equation_row_lands_on_the_function_that_holds_it() -> None:
    import inspect

    rows = equation_rows()
    assert len(rows) >= 20
    tagged = 0
    for paper, equation, function in rows:
        doc = inspect.getdoc(_resolve(function)) or ""
        match = EQUATION_TAG.match(equation)
        if match:
            tagged += 1
            tag = next(g for g in match.groups() if g)
            assert tag.lower() in doc.lower(), f"{paper} {equation}: {function}'s docstring does not name {tag}"
    assert tagged >= 15  # the rows with an equation or algorithm number are checked, not skipped
