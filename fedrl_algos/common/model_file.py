"""Model files that load without running code from the file, and saves that are atomic.

SB3's zip format stores a model's attributes in a JSON member ``data``, and every attribute that
plain JSON cannot hold (spaces, classes, dataclasses, tensors inside dicts) as a base64 cloudpickle
payload that ``load`` unpickles — so a model file can run arbitrary code when it is loaded. fedrl
keeps SB3's zip layout (``data``, ``policy.pth``, ``pytorch_variables.pth``,
``_stable_baselines3_version``, ``system_info.txt``) but writes and reads ``data`` as *data only*:

* plain JSON scalars, lists and dicts with string keys;
* tagged values from a closed list (:func:`encode`): tuples, tensors and NumPy arrays (as
  references into the member :data:`DATA_TENSORS`), torch dtypes and devices, Gymnasium spaces
  (described by their fields), a fedrl policy class (by its alias or the name of an already
  imported :class:`~fedrl_algos.policies.FlatPolicy` subclass), a ``torch.nn`` activation class
  (by name), a task family (by its registered id), a family's task parameters, the step-size and
  momentum schedules of :mod:`fedrl_algos.core.schedules`, attacks of
  :data:`fedrl_algos.core.attacks.ATTACKS`, and the wrapper factories of
  :mod:`wrappers.heterogeneity`, and deques (SB3's episode-info buffers);
* anything else callable is saved as a *reference* (its name) and must be handed back on load
  with ``custom_objects={attribute: obj}``; anything else is refused when saving.

Every tensor member is read with ``torch.load(weights_only=True)`` (tensors and plain containers
only). Names are only ever looked up among objects already imported or registered: loading never
imports a module named by the file. The member :data:`MARKER` records the format version and the
class that saved the file. Files written by fedrl before this format (SB3's pickle-based
``data``) are refused unless the caller passes ``allow_pickle=True`` (unsafe: it unpickles, as
SB3 does; load such a file once and save it again to convert it).

Writes to a path are atomic (:func:`atomic_write`): the zip goes to a temporary file in the same
folder, is flushed and fsynced, and replaces the path with ``os.replace``, so a process killed
while saving leaves the previous file (or none) at the path, never a half-written one.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import io
import json
import os
import pathlib
import pickle
import tempfile
import typing
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import stable_baselines3 as sb3
import torch
from gymnasium import spaces
from stable_baselines3.common.save_util import get_system_info

__all__ = [
    "DATA_TENSORS",
    "FORMAT_VERSION",
    "LEGACY_MODULES",
    "MARKER",
    "ModelFileError",
    "atomic_write",
    "class_path",
    "collect_save_data",
    "decode",
    "encode",
    "find_loaded_subclass",
    "load_tensor_file",
    "model_path",
    "read_model_file",
    "unpickle_legacy_data",
    "write_model_file",
]

#: member recording ``{"format_version", "class"}`` of a file written in this format
MARKER = "fedrl_model.json"
#: member holding the tensors and arrays referenced from ``data`` (``torch.save`` of a flat dict)
DATA_TENSORS = "data_tensors.pt"
#: version of the layout of ``data`` (1: SB3's pickle-based ``data``, written by fedrl before)
FORMAT_VERSION = 2

PathLike = str | pathlib.Path | io.BufferedIOBase


class ModelFileError(ValueError):
    """A model file that cannot be loaded: truncated, corrupt, of another class, or holding code."""


# --------------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------------
def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def model_path(path: str | pathlib.Path) -> pathlib.Path:
    """The file a save to ``path`` writes: ``.zip`` appended when ``path`` has no suffix (as SB3)."""
    path = pathlib.Path(path)
    return path.with_name(path.name + ".zip") if path.suffix == "" else path


def atomic_write(path: str | pathlib.Path, write: Callable[[io.BufferedIOBase], None]) -> pathlib.Path:
    """Write a file so that ``path`` only ever holds the old or the complete new content.

    ``write`` fills a temporary file in the same folder (same file system, so the rename is
    atomic); it is flushed and fsynced, then ``os.replace`` puts it at ``path`` and the folder is
    fsynced. If ``write`` raises, the temporary file is removed and ``path`` is untouched. (A
    process killed mid-write can leave the temporary ``.<name>.<random>.tmp`` behind, never a
    partial ``path``.)

    :param path: the destination (parent folders are created)
    :param write: fills the binary file object it is given
    :return: the destination path
    """
    path = pathlib.Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    with contextlib.suppress(OSError):  # not every platform can open a folder to fsync it
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


# --------------------------------------------------------------------------------------------------
# Names, resolved among what is already imported
# --------------------------------------------------------------------------------------------------
def class_path(cls: type) -> str:
    """``"module:qualname"`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def find_loaded_subclass(base: type, path: str) -> type | None:
    """The subclass of ``base`` (or ``base`` itself) named ``"module:qualname"``, among the classes
    already defined in this process (nothing is imported), or ``None``."""
    seen: set[type] = set()
    todo = [base]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if class_path(cls) == path:
            return cls
        todo.extend(cls.__subclasses__())
    return None


def _policy_base() -> type:
    from fedrl_algos.policies import FlatPolicy

    return FlatPolicy


def _known_params_types() -> dict[str, type]:
    """The task-parameter dataclass of every registered family (:data:`fedrl_envs.FAMILIES` and
    ids registered with a family's vector entry point), by ``module:qualname``."""
    import gymnasium as gym

    import fedrl_envs
    from fedrl_envs.family import TaskFamily

    families = {id(f): f for f in fedrl_envs.FAMILIES.values()}
    for env_id in list(gym.registry):
        family = fedrl_envs.family_of(env_id)
        if family is not None:
            families[id(family)] = family
    found: dict[str, type] = {}
    for family in families.values():
        for klass in type(family).__mro__:
            for base in getattr(klass, "__orig_bases__", ()):
                if typing.get_origin(base) is TaskFamily:
                    (arg,) = typing.get_args(base)
                    if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                        found[class_path(arg)] = arg
    return found


def _schedule_types() -> dict[str, type]:
    from fedrl_algos.core import schedules

    return {cls.__name__: cls for cls in (schedules.ExponentialStepSize, schedules.LinearStepSize, schedules.MomentumSchedule,
                                                  schedules.ConstantSchedule)}


def _attack_types() -> dict[str, type]:
    from fedrl_algos.core.attacks import ATTACKS

    return dict(ATTACKS)


# --------------------------------------------------------------------------------------------------
# Encoding: Python values -> JSON + tensors
# --------------------------------------------------------------------------------------------------
_TAGS = (
    ":tuple:", ":dict:", ":tensor:", ":ndarray:", ":dtype:", ":device:", ":space:", ":policy_class:",
    ":torch_module:", ":family:", ":params:", ":schedule:", ":attack:", ":wrapper_factory:", ":deque:", ":custom:",
)


class _Encoder:
    def __init__(self, policy_aliases: Mapping[str, type]) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.aliases = {cls: name for name, cls in policy_aliases.items()}
        self.custom: list[str] = []

    def _store(self, value: torch.Tensor, where: str) -> str:
        key = f"{len(self.tensors)}:{where}"
        self.tensors[key] = value.detach().cpu().clone()
        return key

    def __call__(self, value: Any, where: str) -> Any:  # noqa: C901  (one branch per allowed type)
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int | float) and type(value) in (int, float):
            return value
        if isinstance(value, np.generic) and not isinstance(value, np.object_):
            return value.item()
        if isinstance(value, list):
            return [self(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return {":tuple:": [self(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not (k.startswith(":") and k.endswith(":")) for k in value):
                return {k: self(v, f"{where}.{k}") for k, v in value.items()}
            return {":dict:": [[self(k, f"{where}<key>"), self(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        if isinstance(value, collections.deque):  # SB3's episode-info buffers
            return {":deque:": [self(v, f"{where}[{i}]") for i, v in enumerate(value)], "maxlen": value.maxlen}
        if isinstance(value, torch.Tensor):
            return {":tensor:": self._store(value, where)}
        if isinstance(value, np.ndarray):
            if value.dtype == np.object_:
                raise TypeError(f"{where}: NumPy arrays of Python objects cannot be saved as data")
            return {":ndarray:": self._store(torch.from_numpy(np.ascontiguousarray(value)), where)}
        if isinstance(value, torch.dtype):
            return {":dtype:": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {":device:": str(value)}
        if isinstance(value, spaces.Space):
            return {":space:": self._space(value, where)}
        if isinstance(value, type):
            if value in self.aliases:
                return {":policy_class:": self.aliases[value]}
            if issubclass(value, _policy_base()):
                return {":policy_class:": class_path(value)}
            if issubclass(value, torch.nn.Module) and getattr(torch.nn, value.__name__, None) is value:
                return {":torch_module:": value.__name__}
            return self._custom(value, where)
        return self._object(value, where)

    def _object(self, value: Any, where: str) -> Any:
        from fedrl_envs.family import TaskFamily

        if isinstance(value, TaskFamily):
            return {":family:": value.env_id}
        if dataclasses.is_dataclass(value):
            kind = type(value)
            if class_path(kind) in _known_params_types():
                return {":params:": class_path(kind), "fields": self._fields(value, where)}
            if _schedule_types().get(kind.__name__) is kind:
                return {":schedule:": kind.__name__, "fields": self._fields(value, where)}
        attacks = _attack_types()
        if getattr(type(value), "name", None) in attacks and attacks[type(value).name] is type(value):
            return {":attack:": type(value).name, "state": {k: self(v, f"{where}.{k}") for k, v in vars(value).items()}}
        from fedrl_wrappers.heterogeneity import factory_to_json

        try:
            return {":wrapper_factory:": self(factory_to_json(value), where)}
        except TypeError:
            pass
        if callable(value):
            return self._custom(value, where)
        raise TypeError(
            f"{where}: a {type(value).__name__} cannot be saved as data (fedrl model files hold no pickled objects); "
            "exclude it from save(exclude=[...]) or keep it as plain numbers, lists, dicts or tensors"
        )

    def _fields(self, value: Any, where: str) -> dict[str, Any]:
        return {f.name: self(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}

    def _custom(self, value: Any, where: str) -> dict[str, Any]:
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        module = getattr(value, "__module__", None) or type(value).__module__
        self.custom.append(where)
        return {":custom:": f"{module}:{name}"}

    def _space(self, space: spaces.Space, where: str) -> dict[str, Any]:
        if type(space) is spaces.Discrete:
            return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
        if type(space) is spaces.Box:
            return {"type": "Box", "low": self(space.low, f"{where}.low"), "high": self(space.high, f"{where}.high"),
                    "dtype": np.dtype(space.dtype).name}
        if type(space) is spaces.MultiDiscrete:
            return {"type": "MultiDiscrete", "nvec": self(space.nvec, f"{where}.nvec"), "start": self(space.start, f"{where}.start"),
                    "dtype": np.dtype(space.dtype).name}
        if type(space) is spaces.MultiBinary:
            return {"type": "MultiBinary", "n": self(space.n if isinstance(space.n, int) else tuple(int(k) for k in space.n), where)}
        if type(space) is spaces.Tuple:
            return {"type": "Tuple", "spaces": [self._space(s, f"{where}[{i}]") for i, s in enumerate(space.spaces)]}
        if type(space) is spaces.Dict:
            return {"type": "Dict", "spaces": [[k, self._space(s, f"{where}.{k}")] for k, s in space.spaces.items()]}
        raise TypeError(f"{where}: the space {space} ({type(space).__name__}) cannot be saved as data")


def encode(data: Mapping[str, Any], policy_aliases: Mapping[str, type] | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor], list[str]]:
    """``data`` as plain JSON plus the tensors it references.

    :param data: attribute name → value
    :param policy_aliases: policy classes saved by their alias (``{"MlpPolicy": MlpPolicy, ...}``)
    :return: the JSON-able dict, the tensors by reference key, and the attributes saved as mere
        references (callables outside the known types: ``load`` needs them in ``custom_objects``)
    :raises TypeError: naming the attribute, for a value that is neither data nor callable
    """
    encoder = _Encoder(policy_aliases or {})
    out = {key: encoder(value, key) for key, value in data.items()}
    return out, encoder.tensors, encoder.custom


# --------------------------------------------------------------------------------------------------
# Decoding: JSON + tensors -> Python values, nothing else
# --------------------------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, name: str, tensors: Mapping[str, torch.Tensor], policy_aliases: Mapping[str, type]) -> None:
        self.name = name
        self.tensors = tensors
        self.aliases = policy_aliases

    def fail(self, where: str, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.name}: {where}: {problem}")

    def tensor(self, key: Any, where: str) -> torch.Tensor:
        if not isinstance(key, str) or key not in self.tensors:
            raise self.fail(where, f"references tensor {key!r}, which {DATA_TENSORS} does not hold (corrupt file?)")
        return self.tensors[key].clone()

    def __call__(self, value: Any, where: str) -> Any:  # noqa: C901
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, list):
            return [self(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, dict):
            raise self.fail(where, f"unexpected JSON value of type {type(value).__name__}")
        if ":serialized:" in value:
            raise self.fail(where, "holds a pickled (cloudpickle) object; fedrl never unpickles model files")
        tags = [k for k in value if k in _TAGS]
        if not tags:
            if any(k.startswith(":") and k.endswith(":") for k in value):
                raise self.fail(where, f"unknown tag among {sorted(value)}")
            return {k: self(v, f"{where}.{k}") for k, v in value.items()}
        tag, arg = tags[0], value[tags[0]]
        if tag == ":tuple:":
            return tuple(self(arg, where))
        if tag == ":dict:":
            return {self(k, f"{where}<key>"): self(v, f"{where}[{k!r}]") for k, v in arg}
        if tag == ":deque:":
            maxlen = value.get("maxlen")
            if not (maxlen is None or (isinstance(maxlen, int) and maxlen >= 0)):
                raise self.fail(where, f"bad deque maxlen {maxlen!r}")
            return collections.deque(self(arg, where), maxlen=maxlen)
        if tag == ":tensor:":
            return self.tensor(arg, where)
        if tag == ":ndarray:":
            return self.tensor(arg, where).numpy()
        if tag == ":dtype:":
            dtype = getattr(torch, str(arg), None)
            if not isinstance(dtype, torch.dtype):
                raise self.fail(where, f"unknown torch dtype {arg!r}")
            return dtype
        if tag == ":device:":
            return torch.device(str(arg))
        if tag == ":space:":
            return self.space(arg, where)
        if tag == ":policy_class:":
            return self.policy_class(arg, where)
        if tag == ":torch_module:":
            cls = getattr(torch.nn, str(arg), None)
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise self.fail(where, f"names no torch.nn module class: {arg!r}")
            return cls
        if tag == ":family:":
            import fedrl_envs

            family = fedrl_envs.family_of(str(arg))
            if family is None:
                raise self.fail(where, f"environment family {arg!r} is not registered in this process (register it before loading)")
            return family
        if tag == ":params:":
            return self.dataclass(_known_params_types().get(str(arg)), arg, value.get("fields"), where, "task parameters")
        if tag == ":schedule:":
            return self.dataclass(_schedule_types().get(str(arg)), arg, value.get("fields"), where, "schedule")
        if tag == ":attack:":
            cls = _attack_types().get(str(arg))
            if cls is None:
                raise self.fail(where, f"unknown attack {arg!r}; known: {sorted(_attack_types())}")
            obj = cls.__new__(cls)
            obj.__dict__.update(self(value.get("state", {}), where))
            return obj
        if tag == ":wrapper_factory:":
            from fedrl_wrappers.heterogeneity import factory_from_json

            try:
                return factory_from_json(self(arg, where))
            except (TypeError, ValueError) as err:
                raise self.fail(where, f"bad wrapper factory: {err}") from None
        assert tag == ":custom:"
        raise self.fail(
            where.split(".")[0].split("[")[0],
            f"was saved as a reference to {arg!r} (not data); pass it to load(..., custom_objects={{{where.split('.')[0]!r}: ...}})",
        )

    def dataclass(self, cls: type | None, name: Any, fields: Any, where: str, what: str) -> Any:
        if cls is None:
            raise self.fail(where, f"unknown {what} class {name!r} (its family or module is not loaded)")
        expected = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(fields, dict) or set(fields) != expected:
            raise self.fail(where, f"{what} {name!r} must have the fields {sorted(expected)}, got {sorted(fields) if isinstance(fields, dict) else fields!r}")
        obj = cls.__new__(cls)
        for key, raw in fields.items():  # restored as saved; frozen dataclasses need object.__setattr__
            object.__setattr__(obj, key, self(raw, f"{where}.{key}"))
        return obj

    def policy_class(self, name: Any, where: str) -> type:
        if isinstance(name, str) and name in self.aliases:
            return self.aliases[name]
        cls = find_loaded_subclass(_policy_base(), str(name))
        if cls is None:
            raise self.fail(
                where,
                f"policy class {name!r} is neither an alias ({sorted(self.aliases)}) nor a FlatPolicy subclass defined in this "
                "process; import the module that defines it before loading, or pass custom_objects={'policy_class': cls}",
            )
        return cls

    def space(self, desc: Any, where: str) -> spaces.Space:
        if not isinstance(desc, dict):
            raise self.fail(where, "bad space description")
        kind = desc.get("type")
        try:
            if kind == "Discrete":
                return spaces.Discrete(int(desc["n"]), start=int(desc["start"]))
            if kind == "Box":
                low, high = self(desc["low"], where), self(desc["high"], where)
                return spaces.Box(low=low, high=high, shape=np.shape(low), dtype=np.dtype(str(desc["dtype"])))
            if kind == "MultiDiscrete":
                return spaces.MultiDiscrete(self(desc["nvec"], where), dtype=np.dtype(str(desc["dtype"])), start=self(desc["start"], where))
            if kind == "MultiBinary":
                n = self(desc["n"], where)
                return spaces.MultiBinary(list(n) if isinstance(n, tuple) else int(n))
            if kind == "Tuple":
                return spaces.Tuple([self.space(s, f"{where}[{i}]") for i, s in enumerate(desc["spaces"])])
            if kind == "Dict":
                return spaces.Dict({str(k): self.space(s, f"{where}.{k}") for k, s in desc["spaces"]})
        except (KeyError, TypeError, ValueError) as err:
            raise self.fail(where, f"bad {kind} space description: {err}") from None
        raise self.fail(where, f"unknown space type {kind!r}")


def decode(
    data: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    name: str = "model file",
    policy_aliases: Mapping[str, type] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Inverse of :func:`encode`; entries of ``custom_objects`` replace saved ones undecoded (as SB3).

    :raises ModelFileError: naming the file and the attribute, for a pickle payload, an unknown
        tag, a missing tensor, or a reference not given in ``custom_objects``
    """
    decoder = _Decoder(name, tensors, policy_aliases or {})
    custom_objects = custom_objects or {}
    return {key: custom_objects[key] if key in custom_objects else decoder(value, key) for key, value in data.items()}


# --------------------------------------------------------------------------------------------------
# Zip files
# --------------------------------------------------------------------------------------------------
def collect_save_data(model: Any, exclude: Iterable[str] | None, include: Iterable[str] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """What SB3's ``BaseAlgorithm.save`` collects: the attributes, the state dicts of
    ``get_parameters()`` and the torch variables (same exclusion rules).

    :return: ``(data, params, pytorch_variables)``
    """
    from stable_baselines3.common.save_util import recursive_getattr

    data = model.__dict__.copy()
    excluded = set(exclude or []).union(model._excluded_save_params())
    if include is not None:
        excluded = excluded.difference(include)
    state_dict_names, variable_names = model._get_torch_save_params()
    for name in [*state_dict_names, *variable_names]:
        excluded.add(name.split(".")[0])
    for name in excluded:
        data.pop(name, None)
    variables = {name: recursive_getattr(model, name) for name in variable_names}
    return data, model.get_parameters(), variables


def write_model_file(
    path: PathLike,
    model_class: type,
    data: Mapping[str, Any],
    params: Mapping[str, Any],
    pytorch_variables: Mapping[str, Any] | None,
    policy_aliases: Mapping[str, type] | None = None,
    extra_members: Mapping[str, bytes] | None = None,
) -> list[str]:
    """Write a model in fedrl's safe format (atomically when ``path`` is a path).

    :param path: a file path (``.zip`` appended without a suffix) or a writable binary file object
    :param model_class: the class recorded in :data:`MARKER` (checked by :func:`read_model_file`)
    :param data: the attributes (see :func:`encode` for what they may hold)
    :param params: state dicts by name (``policy`` ...), each written as ``<name>.pth``
    :param pytorch_variables: tensors set back by name on load, written as ``pytorch_variables.pth``
    :param policy_aliases: policy classes saved by their alias
    :param extra_members: further members (name → bytes)
    :return: the attributes saved as references only (see :func:`encode`)
    """
    is_path = isinstance(path, str | os.PathLike)
    if not is_path and not callable(getattr(path, "write", None)):
        raise TypeError(f"path must be a file path (str or os.PathLike) or a writable binary file object, got {type(path).__name__} {path!r}")
    encoded, tensors, custom = encode(data, policy_aliases)
    data_json = json.dumps(encoded)

    def fill(file: Any) -> None:
        with zipfile.ZipFile(file, mode="w") as archive:
            archive.writestr(MARKER, json.dumps({"format_version": FORMAT_VERSION, "class": class_path(model_class)}))
            archive.writestr("data", data_json)
            with archive.open(DATA_TENSORS, mode="w", force_zip64=True) as member:
                torch.save(tensors, member)
            if pytorch_variables is not None:
                with archive.open("pytorch_variables.pth", mode="w", force_zip64=True) as member:
                    torch.save(dict(pytorch_variables), member)
            for name, state in params.items():
                with archive.open(f"{name}.pth", mode="w", force_zip64=True) as member:
                    torch.save(state, member)
            for name, blob in (extra_members or {}).items():
                archive.writestr(name, blob)
            archive.writestr("_stable_baselines3_version", sb3.__version__)
            archive.writestr("system_info.txt", get_system_info(print_info=False)[1])

    if is_path:
        atomic_write(model_path(pathlib.Path(path)), fill)
    else:
        fill(path)
    return custom


def _display(path: PathLike) -> str:
    return str(path) if isinstance(path, str | pathlib.Path) else f"<{type(path).__name__}>"


def _open_for_reading(path: PathLike) -> tuple[Any, str]:
    if isinstance(path, str | pathlib.Path):
        path = pathlib.Path(path)
        if not path.exists() and path.suffix == "":
            path = model_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no model file at {path}")
        return path, str(path)
    return path, _display(path)


def load_tensor_file(archive: zipfile.ZipFile, member: str, name: str, device: Any) -> Any:
    """A tensor member read with ``torch.load(weights_only=True)`` (ModelFileError on anything else)."""
    try:
        with archive.open(member) as file:
            blob = file.read()
        return torch.load(io.BytesIO(blob), map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ModelFileError(f"{name}: member {member} holds objects other than tensors and plain containers; refused ({err})".splitlines()[0]) from None
    except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, OSError) as err:
        raise ModelFileError(f"{name}: member {member} is corrupt or truncated ({type(err).__name__}: {err})".splitlines()[0]) from None


def _read_member(archive: zipfile.ZipFile, member: str, name: str) -> bytes:
    try:
        return archive.read(member)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
        raise ModelFileError(f"{name}: member {member} is corrupt or truncated ({type(err).__name__}: {err})") from None


def _tensor_dict(value: Any, member: str, name: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ModelFileError(f"{name}: member {member} must hold a dict with string keys, got {type(value).__name__}")
    return value


def read_model_file(
    path: PathLike,
    model_class: type,
    device: Any = "cpu",
    custom_objects: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
    policy_aliases: Mapping[str, type] | None = None,
    print_system_info: bool = False,
    name: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Read a model file: its attributes, state dicts and torch variables.

    :param path: a file path (``.zip`` tried when it has no suffix and does not exist) or a file object
    :param model_class: the class loading it; a file saved by a class that is neither it nor one of
        its (imported) subclasses is refused
    :param device: where the state dicts and torch variables go (attribute tensors stay on CPU)
    :param custom_objects: attribute → object used instead of the saved value (as SB3's)
    :param allow_pickle: also read files of SB3's pickle-based format (fedrl's before
        :data:`FORMAT_VERSION` 2) by unpickling their ``data`` — **this runs code from the file**;
        only for files you trust
    :param policy_aliases: policy classes saved by their alias
    :param print_system_info: print the saved ``system_info.txt``
    :param name: how errors name the file (default: the path, or the file object's type)
    :return: ``(data, params, pytorch_variables)`` as SB3's ``load_from_zip_file``
    :raises ModelFileError: (a ``ValueError``) naming the file and the problem
    """
    source, shown = _open_for_reading(path)
    name = name or shown
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise ModelFileError(f"{name}: not a readable model file (truncated or corrupt zip: {err})") from None
    with archive:
        members = set(archive.namelist())
        if "data" not in members:
            # (A truncated model file can still look like a zip: the end of a tensor member, itself a
            # zip written by torch.save, is then found instead of the model's own directory.)
            raise ModelFileError(f"{name}: no 'data' member: a truncated or corrupt file, or not a model file written by fedrl or SB3")
        if print_system_info and "system_info.txt" in members:
            print("== SAVED MODEL SYSTEM INFO ==")
            print(_read_member(archive, "system_info.txt", name).decode(errors="replace"))
        try:
            raw = json.loads(_read_member(archive, "data", name).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ModelFileError(f"{name}: member data is not valid JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ModelFileError(f"{name}: member data must be a JSON object")
        pickled = sorted(k for k, v in raw.items() if _holds_pickle(v))
        if MARKER in members:
            try:
                marker = json.loads(_read_member(archive, MARKER, name).decode())
                version, saved_class = marker["format_version"], marker["class"]
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
                raise ModelFileError(f"{name}: member {MARKER} is corrupt ({err})") from None
            if not isinstance(version, int) or not 2 <= version <= FORMAT_VERSION:
                raise ModelFileError(f"{name}: format_version {version!r}; this fedrl reads versions 2 to {FORMAT_VERSION} (saved by a newer fedrl?)")
            if find_loaded_subclass(model_class, str(saved_class)) is None:
                short = str(saved_class).rpartition(":")[2]
                raise ModelFileError(f"{name}: saved by {short} ({saved_class}), not by {model_class.__name__}; load it with {short}.load")
            if pickled and not allow_pickle:
                raise ModelFileError(
                    f"{name}: attributes {pickled} hold pickled (cloudpickle) payloads, which a fedrl model file never contains; "
                    "refusing to unpickle them (they could run code)"
                )
        elif not allow_pickle:
            what = f"its attributes {pickled} are pickled (cloudpickle) objects" if pickled else "it has no fedrl format marker"
            raise ModelFileError(
                f"{name}: this file is in SB3's pickle-based format (written by SB3 or by fedrl before format {FORMAT_VERSION}): "
                f"{what}, and unpickling can run code from the file. If you trust the file, load it with allow_pickle=True "
                "and save it again to convert it to the safe format."
            )
        params: dict[str, Any] = {}
        variables = None
        for member in sorted(m for m in members if m.endswith(".pth")):
            value = _tensor_dict(load_tensor_file(archive, member, name, device), member, name)
            if member in ("pytorch_variables.pth", "tensors.pth"):
                variables = value
            else:
                params[member[: -len(".pth")]] = value
        tensors = _tensor_dict(load_tensor_file(archive, DATA_TENSORS, name, "cpu"), DATA_TENSORS, name) if DATA_TENSORS in members else {}
        if any(not isinstance(t, torch.Tensor) for t in tensors.values()):
            raise ModelFileError(f"{name}: member {DATA_TENSORS} must hold only tensors")
    if pickled and allow_pickle:
        # Opt-in, unsafe path for old files: unpickled as SB3 does, old module paths mapped to today's.
        legacy = unpickle_legacy_data({k: raw[k] for k in pickled}, custom_objects)
        rest = decode({k: v for k, v in raw.items() if k not in pickled}, tensors, name, policy_aliases, custom_objects)
        data = {k: legacy[k] if k in pickled else rest[k] for k in raw if k in legacy or k in rest}
    else:
        data = decode(raw, tensors, name, policy_aliases, custom_objects)
    return data, params, variables


#: modules of fedrl before its 0.1.0 layout, as files of SB3's pickle-based format name them → where
#: their objects live now (the modules themselves are gone)
LEGACY_MODULES: dict[str, str] = {
    "fedrl_algos.attacks": "fedrl_algos.core.attacks",
    "fedrl_algos.base": "fedrl_algos.common",
    "fedrl_algos.per_fedavg": "fedrl_algos",
    "fedrl_algos.fed_sb3": "fedrl_algos.fedavg_sb3",
}


class _LegacyUnpickler(pickle.Unpickler):
    """Cloudpickle payloads (plain pickle streams) whose globals may name a module of :data:`LEGACY_MODULES`."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(LEGACY_MODULES.get(module, module), name)


def unpickle_legacy_data(raw: Mapping[str, Any], custom_objects: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The attributes of SB3's pickle-based ``data`` (as SB3's ``json_to_data``: a ``custom_objects``
    entry replaces the saved value; a payload that fails to unpickle is left out with a warning).
    **Unpickling runs code from the file**: only for files the caller trusts (``allow_pickle=True``).

    :param raw: attribute → its JSON value, ``{":serialized:": base64 cloudpickle}`` for a pickled one
    :param custom_objects: attribute → object used instead of the saved value
    """
    custom = dict(custom_objects or {})
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in custom:
            out[key] = custom[key]
        elif isinstance(value, dict) and ":serialized:" in value:
            try:
                out[key] = _LegacyUnpickler(io.BytesIO(base64.b64decode(value[":serialized:"].encode()))).load()
            except (RuntimeError, TypeError, AttributeError, ImportError, pickle.UnpicklingError) as err:
                warnings.warn(f"could not unpickle the saved attribute {key!r}; pass it in custom_objects ({err})", stacklevel=3)
        else:
            out[key] = value
    return out


def _holds_pickle(value: Any) -> bool:
    if isinstance(value, dict):
        return ":serialized:" in value or any(_holds_pickle(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_pickle(v) for v in value)
    return False
