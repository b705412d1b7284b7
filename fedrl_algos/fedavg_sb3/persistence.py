"""The file format of a saved :class:`~fedrl_algos.fedavg_sb3.FedAvgSB3` federation.

One zip holds :data:`CONFIG_NAME` (JSON: algorithm and policy as ``module:qualname`` class paths
or a policy alias, environment id, per-agent ``gym.make`` kwargs, ``sync_every``, aggregation mode,
seed, counters and, since format 2, the agents' ``algorithm_kwargs`` as data) and
``agent_<i>.zip`` per agent; with ``save_replay_buffer=True`` also ``agent_<i>_replay_buffer.pt``
(the buffer's arrays as tensors). The per-agent kwargs are stored as a JSON string inside the JSON,
with wrapper factories (MuJoCo, Atari) written by :func:`fedrl_wrappers.heterogeneity.factory_to_json`.

:data:`FORMAT_VERSION` 2: each agent's zip is written by
:func:`fedrl_algos.common.model_file.write_model_file` (SB3's layout, ``data`` without pickles) and
loading never unpickles. Version 1 (the first release) stored SB3's own pickle-based agent zips;
they load only with ``allow_pickle=True`` (unsafe).
"""

from __future__ import annotations

import io
import json
import pathlib
import zipfile
import zlib
from collections.abc import Sequence
from importlib import import_module
from typing import Any

import numpy as np

from fedrl_algos.common.model_file import ModelFileError, atomic_write, find_loaded_subclass, model_path

__all__ = [
    "CONFIG_NAME",
    "FORMAT_VERSION",
    "agent_kwargs_from_json",
    "agent_kwargs_to_json",
    "import_class",
    "read_archive",
    "replay_buffer_member",
    "write_archive",
]


def replay_buffer_member(agent: int) -> str:
    """Name of agent ``agent``'s replay-buffer member (``save_replay_buffer=True``)."""
    return f"agent_{agent}_replay_buffer.pt"

#: name of the federation's JSON config inside the zip
CONFIG_NAME = "fedavg_sb3.json"
#: version of the config's layout, written into it as ``format_version``
FORMAT_VERSION = 2


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


def import_class(path: str, base: type | None = None) -> type:
    """The class a :func:`~fedrl_algos.common.model_file.class_path` names (as the config stores
    algorithm and policy classes).

    With ``base``, only classes already defined in this process are found (a subclass of
    ``base`` or ``base`` itself; nothing is imported, so a file cannot make fedrl import a module);
    without it, the module is imported (trusted paths only).

    :param path: ``"module:qualname"``
    :param base: the class it must derive from
    :raises ValueError: when ``base`` is given and no such class is loaded
    """
    if base is not None:
        cls = find_loaded_subclass(base, path)
        if cls is None:
            raise ValueError(f"{path!r} is not a {base.__name__} class defined in this process; import its module before loading")
        return cls
    module, _, qualname = path.partition(":")
    obj: Any = import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def write_archive(
    path: str | pathlib.Path | io.BufferedIOBase,
    config: dict[str, Any],
    agent_zips: Sequence[bytes],
    extra_members: dict[str, bytes] | None = None,
) -> None:
    """Write a federation: the config and one zip per agent; atomically when ``path`` is a path.

    :param path: a file path (without a suffix it gets ``.zip``; parent folders are created) or a
        writable binary file object
    :param config: the federation's JSON config (``format_version`` included)
    :param agent_zips: each agent's zip, as bytes, in agent order
    :param extra_members: further members (name → bytes), e.g. replay buffers
    """

    def fill(file: Any) -> None:
        with zipfile.ZipFile(file, "w") as archive:
            archive.writestr(CONFIG_NAME, json.dumps(config, indent=2))
            for i, blob in enumerate(agent_zips):
                archive.writestr(f"agent_{i}.zip", blob)
            for name, blob in (extra_members or {}).items():
                archive.writestr(name, blob)

    if isinstance(path, str | pathlib.Path):
        atomic_write(model_path(path), fill)
    else:
        fill(path)


def read_archive(path: str | pathlib.Path | io.BufferedIOBase, with_members: bool = False) -> Any:
    """Read what :func:`write_archive` wrote: the config and each agent's zip.

    :param path: a file path (``.zip`` is tried when the path has no suffix and does not exist)
        or a readable binary file object
    :param with_members: also return the other members (name → bytes)
    :return: the config and the agents' zips as bytes, in agent order (and the other members)
    :raises ValueError: naming the file, when it is truncated, corrupt or of an unknown version
    """
    name = str(path) if isinstance(path, str | pathlib.Path) else f"<{type(path).__name__}>"
    if isinstance(path, str | pathlib.Path):
        path = pathlib.Path(path)
        if not path.exists() and path.suffix == "":
            path = path.with_suffix(".zip")
    try:
        with zipfile.ZipFile(path, "r") as archive:
            if CONFIG_NAME not in archive.namelist():
                raise ModelFileError(f"{name}: no {CONFIG_NAME}: a truncated or corrupt file, or not a FedAvgSB3 federation")
            config = json.loads(archive.read(CONFIG_NAME))
            version = config.get("format_version") if isinstance(config, dict) else None
            if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
                raise ModelFileError(
                    f"{name}: {CONFIG_NAME} has format_version {version!r}; this fedrl reads versions 1 to {FORMAT_VERSION} "
                    "(a newer fedrl saved it?)"
                )
            blobs = [archive.read(f"agent_{i}.zip") for i in range(int(config["n_agents"]))]
            agent_names = {f"agent_{i}.zip" for i in range(len(blobs))}
            members = {m: archive.read(m) for m in archive.namelist() if m != CONFIG_NAME and m not in agent_names}
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFileError(f"{name}: not a readable FedAvgSB3 file (truncated or corrupt: {type(err).__name__}: {err})") from None
    return (config, blobs, members) if with_members else (config, blobs)
