"""Every argument of every ``fedrl`` sub-command has help text, and ``fedrl <cmd> --help`` shows it."""

from __future__ import annotations

import argparse

import pytest

from fedrl_algos.cli import build_parser, main


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("fedrl",)):
    """Every (command path, parser) of the ``fedrl`` parser tree, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def _commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return list(_walk(build_parser()))


def test_the_walk_reaches_every_command():
    paths = {" ".join(p) for p, _ in _commands()}
    assert {"fedrl", "fedrl envs", "fedrl demo", "fedrl reproduce", "fedrl bench", "fedrl bench envs", "fedrl bench algos"} <= paths


@pytest.mark.parametrize("path,parser", _commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_argument_has_help(path, parser):
    missing = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if action.help is not argparse.SUPPRESS and not (action.help or "").strip()
    ]
    assert not missing, f"{' '.join(path)}: arguments without help text: {missing}"
    # a sub-command says what it does, not just its usage line
    if len(path) > 1:
        assert (parser.description or "").strip(), f"{' '.join(path)} has no description"


def test_envs_and_bench_envs_seed_help_is_shown(capsys):
    with pytest.raises(SystemExit):
        main(["envs", "--help"])
    text = capsys.readouterr().out
    assert "held-out task" in text and "training tasks" in text
    with pytest.raises(SystemExit):
        main(["bench", "envs", "--help"])
    text = capsys.readouterr().out
    seed_line = next(line for line in text.splitlines() if line.strip().startswith("--seed"))
    assert len(seed_line.split()) > 2  # "--seed SEED" followed by its help


# --- the docs say what the code does -------------------------------------------------------------
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_envs_index_lists_every_registered_family():
    import fedrl_envs

    rows = [line for line in (ROOT / "docs" / "envs" / "index.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and "fedrl/" in line]
    ids = [next(cell.strip(" `") for cell in row.split("|") if "fedrl/" in cell) for row in rows]
    assert ids == list(fedrl_envs.FAMILIES)
    for env_id, family in fedrl_envs.FAMILIES.items():
        name = next(n for n in dir(fedrl_envs) if getattr(fedrl_envs, n) is family and n.isupper())
        row = rows[ids.index(env_id)]
        assert f"`fedrl_envs.{name}`" in row and (ROOT / "docs" / "envs" / row.split("(")[-1].split(")")[0]).exists()


def test_readme_names_every_experiment_that_reproduce_all_runs():
    from fedrl_algos.reproduce import EXPERIMENTS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(e.include_in_all for e in EXPERIMENTS.values())  # ``all`` is every experiment
    claim = readme[readme.index("`all` runs every experiment"):].split("\n\n")[0]
    assert all(f"`{name}`" in claim for name in EXPERIMENTS)
    assert "`--out DIR` (default `fedrl-demo/`, ignored by git)" in " ".join(readme.split())
    assert "fedrl-demo/" in (ROOT / ".gitignore").read_text().splitlines()


def _run_console_script(argv, tmp_path, prelude=""):
    """The ``fedrl`` console script (``fedrl_algos.cli:run``) in a fresh interpreter, stdout a pipe."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = f"import sys\n{prelude}\nsys.argv = {['fedrl', *argv]!r}\nfrom fedrl_algos.cli import run\nrun()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})


def test_the_console_script_flushes_its_output_runs_atexit_handlers_and_keeps_the_exit_status(tmp_path):
    prelude = "import atexit\natexit.register(lambda: print('atexit handler ran', flush=True))"
    done = _run_console_script(["envs"], tmp_path, prelude)
    assert done.returncode == 0, done.stderr
    assert "fedrl/GridWorld-v0" in done.stdout and done.stdout.rstrip().endswith("atexit handler ran")
    usage = _run_console_script(["reproduce", "no-such-experiment"], tmp_path)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    assert _run_console_script(["--help"], tmp_path).returncode == 0
    failing = _run_console_script(["envs"], tmp_path, "import fedrl_algos.cli as c\nc.main = lambda: 3")
    assert failing.returncode == 3
