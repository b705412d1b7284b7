"""A user's own module named ``wrappers`` does not break fedrl (issue 16).

``fedrl_envs``/``fedrl_algos`` import the implementation package ``fedrl_wrappers``; the public
name ``wrappers`` is an alias of it (the same module objects). Each check runs in a fresh
interpreter whose working directory holds a user's ``wrappers.py``, as an RL project often does;
the working directory comes first on ``sys.path`` there, as for ``python script.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    # -c puts the working directory first on sys.path, ahead of PYTHONPATH: the user's file wins.
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "wrappers.py").write_text("def my_wrapper(env):\n    return env\n")
    return tmp_path


def test_fedrl_works_beside_a_users_own_wrappers_module(project: Path) -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"  # no warning other than the one expected below
        "warnings.filterwarnings('ignore', message=\"the module name 'wrappers'\")\n"
        "from fedrl_algos import PerFedAvgPG\n"
        "from fedrl_wrappers import FederatedVecEnv\n"
        "import wrappers\n"
        "assert hasattr(wrappers, 'my_wrapper'), wrappers.__file__\n"  # the user's module is untouched
        "venv = FederatedVecEnv('fedrl/GridWorld-v0', 2, agents=[0, 1], seed=0)\n"
        "obs, _ = venv.reset()\n"
        "obs, reward, *_ = venv.step([0, 1, 2, 3])\n"
        "print(tuple(obs.shape), PerFedAvgPG.__name__)\n"
    )
    result = _run(code, project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["(4,)", "PerFedAvgPG"]


def test_a_shadowed_wrappers_is_reported_with_the_file_that_shadows_it(project: Path) -> None:
    result = _run("import fedrl_algos", project)
    assert result.returncode == 0, result.stderr
    assert "WrappersShadowedWarning" in result.stderr
    assert str(project / "wrappers.py") in result.stderr
    assert "from fedrl_wrappers import FederatedVecEnv" in result.stderr
    # the error the user then meets also names the file (Python's own message)
    result = _run("import fedrl_wrappers\nfrom wrappers import FederatedVecEnv", project)
    assert result.returncode != 0
    assert "cannot import name 'FederatedVecEnv'" in result.stderr and str(project / "wrappers.py") in result.stderr


def test_no_warning_without_a_clash(tmp_path: Path) -> None:
    result = _run("import warnings\nwarnings.simplefilter('error')\nimport wrappers, fedrl_algos\nprint(wrappers.FederatedVecEnv.__module__)", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fedrl_wrappers.federated"


def test_wrappers_is_an_alias_of_the_same_objects() -> None:
    import fedrl_wrappers
    import wrappers

    for name in ("federated", "sb3", "heterogeneity"):
        assert importlib.import_module(f"wrappers.{name}") is importlib.import_module(f"fedrl_wrappers.{name}")
    for name in wrappers.__all__:
        assert getattr(wrappers, name) is getattr(fedrl_wrappers, name)
    from wrappers.heterogeneity import MuJoCoDynamics
    from wrappers.sb3 import SB3VecEnv

    assert SB3VecEnv is fedrl_wrappers.sb3.SB3VecEnv
    assert MuJoCoDynamics is fedrl_wrappers.heterogeneity.MuJoCoDynamics


def test_the_shadow_check_reads_the_import_system(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import wrappers
    from fedrl_wrappers import _shadow

    assert not _shadow.warn_if_wrappers_shadowed()  # fedrl's own alias package
    foreign = type(sys)("wrappers")
    foreign.__file__ = str(tmp_path / "wrappers.py")
    foreign.__spec__ = importlib.util.spec_from_file_location("wrappers", foreign.__file__)
    monkeypatch.setitem(sys.modules, "wrappers", foreign)
    with pytest.warns(_shadow.WrappersShadowedWarning, match=str(tmp_path / "wrappers.py")):
        assert _shadow.warn_if_wrappers_shadowed()
    monkeypatch.setitem(sys.modules, "wrappers", wrappers)
    assert _shadow.wrappers_location() == wrappers.__spec__.origin
