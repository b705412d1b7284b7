"""Models in and out of Flower: bytes for messages and apps, the algorithm class of a file, and
the clients' cache of one-agent workers.

A model travels as the bytes of its safe, data-only file (``model.save``): the simulation hands
them to the ClientApp, a deployment names the file in the run config (``model-path``). Loading
never runs code from the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import zipfile
from collections import OrderedDict
from typing import Any

from fedrl_algos.common.model_file import MARKER, ModelFileError
from fedrl_algos.flower.protocol import SUPPORTED_ALGORITHMS, AgentWorker

__all__ = ["algorithm_classes", "model_to_bytes", "load_model", "agent_worker"]

#: workers kept per client process (one per (model, agent) pair it has served)
_WORKER_CACHE_SIZE = 64
_workers: OrderedDict[tuple[str, int], AgentWorker] = OrderedDict()


def algorithm_classes() -> dict[str, type]:
    """The fedrl algorithm classes that run on Flower, by class name."""
    from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG

    classes = {c.__name__: c for c in (PerFedAvgPG, FedAvgPG, IndependentPG, MFPO, FedPGBR)}
    return {name: classes[name] for name in SUPPORTED_ALGORITHMS}


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
    short = str(marker.get("class", "")).rpartition(":")[2].rpartition(".")[2]
    classes = algorithm_classes()
    if short not in classes:
        raise ModelFileError(f"{name}: saved by {short or 'an unknown class'}; Flower runs {', '.join(classes)}")
    return classes[short]


def load_model(source: bytes | str | pathlib.Path, device: str = "cpu") -> Any:
    """A model from its file's bytes or path, of whichever supported class saved it.

    :param source: the bytes of a model file, or its path
    :param device: torch device of the loaded model
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
    return _saved_class(data, name).load(io.BytesIO(data), device=device)


def agent_worker(source: bytes | str | pathlib.Path, agent: int) -> AgentWorker:
    """The (cached) worker of ``agent`` for the model in ``source``.

    The cache holds only what the file determines (hyperparameters, policy, the agent's task and
    stream keys); everything that changes from round to round arrives with the messages.
    """
    data = pathlib.Path(source).read_bytes() if isinstance(source, str | pathlib.Path) else bytes(source)
    key = (hashlib.sha256(data).hexdigest(), int(agent))
    worker = _workers.get(key)
    if worker is None:
        worker = AgentWorker(load_model(data), int(agent))
        _workers[key] = worker
        while len(_workers) > _WORKER_CACHE_SIZE:
            _workers.popitem(last=False)
    else:
        _workers.move_to_end(key)
    return worker
