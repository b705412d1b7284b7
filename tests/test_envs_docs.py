"""The family pages in ``docs/envs/`` are the class docstrings, word for word.

Regenerate the pages after editing a docstring with ``python tests/test_envs_docs.py``.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from fedrl_envs import ArcNavigationEnv, FamilyEnv, GridWorldEnv

DOCS = Path(__file__).resolve().parent.parent / "docs" / "envs"
SECTIONS = [
    "Description",
    "Action Space",
    "Observation Space",
    "Rewards",
    "Starting State",
    "Episode End",
    "Arguments",
    "Version History",
]
PAGES = {"gridworld.md": GridWorldEnv, "arc_navigation.md": ArcNavigationEnv}


def render_page(env_cls: type[FamilyEnv]) -> str:
    """The markdown page of a family: a title, then the class docstring unchanged."""
    title = f"# {env_cls.__name__} (`{env_cls.family.env_id}`)"
    note = (
        f"<!-- Generated from the docstring of {env_cls.__module__}.{env_cls.__qualname__} "
        "by `python tests/test_envs_docs.py`; edit the docstring, not this page. -->"
    )
    return f"{title}\n\n{note}\n\n{inspect.cleandoc(env_cls.__doc__)}\n"


@pytest.mark.parametrize(("page", "env_cls"), PAGES.items())
def test_docstring_has_every_gymnasium_section_in_order(page, env_cls):
    headings = re.findall(r"^## (.+)$", inspect.cleandoc(env_cls.__doc__), flags=re.MULTILINE)
    assert headings == SECTIONS


@pytest.mark.parametrize(("page", "env_cls"), PAGES.items())
def test_family_page_is_the_class_docstring(page, env_cls):
    text = (DOCS / page).read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f"\n## {section}\n" in text, section
    assert text == render_page(env_cls), f"docs/envs/{page} is stale: run `python tests/test_envs_docs.py`"


def test_index_links_every_family_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert f"({page})" in index


if __name__ == "__main__":
    for page, env_cls in PAGES.items():
        (DOCS / page).write_text(render_page(env_cls), encoding="utf-8")
        print(f"wrote {DOCS / page}")
