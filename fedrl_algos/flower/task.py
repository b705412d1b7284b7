"""Models in and out of Flower: bytes for messages and apps, the algorithm class of a file, and
the clients' cache of one-agent workers.

A model travels as the bytes of its safe, data-only file (``model.save``): the simulation hands
them to the ClientApp, a deployment names the file in the run config (``model-path``). Loading
never runs code from the file.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import pathlib
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from fedrl_algos.common.base_class import FederatedAlgorithm
from fedrl_algos.common.model_file import MARKER, ModelFileError, class_path, find_loaded_subclass
from fedrl_algos.common.round_protocol import AgentWorker

__all__ = ["algorithm_classes", "model_to_bytes", "load_model", "agent_worker", "import_env_modules"]

#: workers kept per client process (one per (model, agent) pair it has served)
_WORKER_CACHE_SIZE = 64
_workers: OrderedDict[tuple[str, int, type | None], AgentWorker] = OrderedDict()


def algorithm_classes() -> dict[str, type]:
    """The algorithm classes that run on Flower: every :class:`~fedrl_algos.common.FederatedAlgorithm`
    subclass defined in this process whose ``round_protocol`` is set (a user's subclass or new
    algorithm included, once its module is imported), by class path ``"module:qualname"``."""
    found: dict[str, type] = {}
    todo = [FederatedAlgorithm]
    while todo:
        cls = todo.pop()
        if cls.round_protocol is not None:
            found[class_path(cls)] = cls
        todo.extend(cls.__subclasses__())
    return dict(sorted(found.items()))


def import_env_modules(modules: Sequence[str] | None) -> None:
    """Import the modules that register a user's environments (``gymnasium.register`` at import), as
    the user's script did: a ClientApp runs in another process, which has not.

    :param modules: importable module names
    :raise ValueError: naming a module that cannot be imported
    """
    for name in modules or ():
        if not isinstance(name, str) or not name:
            raise ValueError(f"env_modules must be module names (str), got {name!r}")
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"env_modules: {name!r} cannot be imported here ({err}); it must be importable where the "
                             "ClientApps run (on their PYTHONPATH)") from None


def model_to_bytes(model: Any) -> bytes:
    """The model's file (``model.save``) as bytes."""
    buffer = io.BytesIO()
    model.save(buffer)
    return buffer.getvalue()


def _saved_class(data: bytes, name: str) -> type:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            marker = json.loads(archive.read(MARKER).decode())
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{name}: not a fedrl model file ({type(err).__name__}: {err})") from None
    saved = str(marker.get("class", ""))
    cls = find_loaded_subclass(FederatedAlgorithm, saved)
    if cls is None or cls.round_protocol is None:
        # Only classes already defined in this process are candidates: a file never makes us import code.
        short = saved.rpartition(":")[2] or "an unknown class"
        known = ", ".join(path.rpartition(":")[2] for path in algorithm_classes())
        why = "declares no round_protocol" if cls is not None else "is not defined in this process (import its module first)"
        raise ModelFileError(f"{name}: saved by {short} ({saved}), which {why}; Flower runs {known}")
    return cls


def load_model(source: bytes | str | pathlib.Path, device: str = "cpu", algorithm: type | None = None) -> Any:
    """A model from its file's bytes or path, of whichever class that runs on Flower saved it.

    :param source: the bytes of a model file, or its path
    :param device: torch device of the loaded model
    :param algorithm: the class to load it with (default: the class that saved it, found among the
        classes defined in this process, :func:`algorithm_classes`)
    """
    if isinstance(source, str | pathlib.Path):
        path = pathlib.Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"model-path: no model file at {path}")
        data, name = path.read_bytes(), str(path)
    elif isinstance(source, bytes | bytearray):
        data, name = bytes(source), "<model bytes>"
    else:
        raise TypeError(f"source must be a model file's bytes or path, got {type(source).__name__}")
    cls = _saved_class(data, name) if algorithm is None else algorithm
    return cls.load(io.BytesIO(data), device=device)


def agent_worker(source: bytes | str | pathlib.Path, agent: int, algorithm: type | None = None) -> AgentWorker:
    """The (cached) worker of ``agent`` for the model in ``source`` (loaded as :func:`load_model` does).

    The cache holds only what the file determines (hyperparameters, policy, the agent's task and
    stream keys); everything that changes from round to round arrives with the messages.
    """
    data = pathlib.Path(source).read_bytes() if isinstance(source, str | pathlib.Path) else bytes(source)
    key = (hashlib.sha256(data).hexdigest(), int(agent), algorithm)
    worker = _workers.get(key)
    if worker is None:
        worker = AgentWorker(load_model(data, algorithm=algorithm), int(agent))
        _workers[key] = worker
        while len(_workers) > _WORKER_CACHE_SIZE:
            _workers.popitem(last=False)
    else:
        _workers.move_to_end(key)
    return worker
