"""The file format of a saved :class:`~fedrl_algos.fedavg_sb3.FedAvgSB3` federation.

One zip holds :data:`CONFIG_NAME` (JSON: algorithm and policy as ``module:qualname`` class paths,
environment id, per-agent ``gym.make`` kwargs, ``sync_every``, aggregation mode, seed, counters)
and ``agent_<i>.zip``, each agent's own SB3 zip. The per-agent kwargs are stored as a JSON string
inside the JSON, with wrapper factories (MuJoCo, Atari) written by
:func:`fedrl_wrappers.heterogeneity.factory_to_json`. :data:`FORMAT_VERSION` 1 is the format written
since the first release; files of that version must keep loading.
"""

from __future__ import annotations

import io
import json
import pathlib
import zipfile
from collections.abc import Sequence
from importlib import import_module
from typing import Any

import numpy as np

__all__ = [
    "CONFIG_NAME",
    "FORMAT_VERSION",
    "agent_kwargs_from_json",
    "agent_kwargs_to_json",
    "class_path",
    "import_class",
    "read_archive",
    "write_archive",
]

#: name of the federation's JSON config inside the zip
CONFIG_NAME = "fedavg_sb3.json"
#: version of the config's layout, written into it as ``format_version``
FORMAT_VERSION = 1


def _json_default(obj: Any) -> Any:
    # fedrl_wrappers.heterogeneity is imported here, not at module level: only kwargs that hold
    # something plain JSON cannot write (NumPy scalars, tuples, wrapper factories) need it.
    from fedrl_wrappers.heterogeneity import factory_to_json

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    try:
        return factory_to_json(obj)
    except TypeError:
        raise TypeError(f"{obj!r} is not JSON-serializable") from None


def _json_hook(obj: dict[str, Any]) -> Any:
    if "wrapper_factory" in obj:
        from fedrl_wrappers.heterogeneity import factory_from_json

        return factory_from_json(obj)
    return obj


def agent_kwargs_to_json(agent_kwargs: Sequence[Any]) -> str:
    """The agents' ``gym.make`` kwargs as a JSON string (wrapper factories included).

    :param agent_kwargs: one dict of keyword arguments per agent
    :raises TypeError: when a value is not JSON-serializable
    """
    return json.dumps(agent_kwargs, default=_json_default)


def agent_kwargs_from_json(text: str) -> list[dict[str, Any]]:
    """Inverse of :func:`agent_kwargs_to_json` (wrapper factories rebuilt).

    :param text: the JSON string saved in the config
    """
    return json.loads(text, object_hook=_json_hook)


def class_path(cls: type) -> str:
    """``"module:qualname"`` of a class, as the config stores algorithm and policy classes.

    :param cls: the class
    """
    return f"{cls.__module__}:{cls.__qualname__}"


def import_class(path: str) -> type:
    """The class a :func:`class_path` names (its module is imported).

    :param path: ``"module:qualname"``
    """
    module, _, qualname = path.partition(":")
    obj: Any = import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def write_archive(path: str | pathlib.Path | io.BufferedIOBase, config: dict[str, Any], agent_zips: Sequence[bytes]) -> None:
    """Write a federation: the config and one SB3 zip per agent.

    :param path: a file path (without a suffix it gets ``.zip``; parent folders are created) or a
        writable binary file object
    :param config: the federation's JSON config (``format_version`` included)
    :param agent_zips: each agent's SB3 zip, as bytes, in agent order
    """
    if isinstance(path, str | pathlib.Path):
        path = pathlib.Path(path)
        if path.suffix == "":
            path = path.with_suffix(".zip")
        path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(CONFIG_NAME, json.dumps(config, indent=2))
        for i, blob in enumerate(agent_zips):
            archive.writestr(f"agent_{i}.zip", blob)


def read_archive(path: str | pathlib.Path | io.BufferedIOBase) -> tuple[dict[str, Any], list[bytes]]:
    """Read what :func:`write_archive` wrote: the config and each agent's SB3 zip.

    :param path: a file path (``.zip`` is tried when the path has no suffix and does not exist)
        or a readable binary file object
    :return: the config and the agents' zips as bytes, in agent order
    """
    if isinstance(path, str | pathlib.Path):
        path = pathlib.Path(path)
        if not path.exists() and path.suffix == "":
            path = path.with_suffix(".zip")
    with zipfile.ZipFile(path, "r") as archive:
        config = json.loads(archive.read(CONFIG_NAME))
        version = config.get("format_version")
        if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
            raise ValueError(
                f"{CONFIG_NAME} has format_version {version!r}; this fedrl reads versions 1 to {FORMAT_VERSION} "
                "(a newer fedrl saved it?)"
            )
        blobs = [archive.read(f"agent_{i}.zip") for i in range(config["n_agents"])]
    return config, blobs
