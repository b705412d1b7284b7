"""The settings of a ``fedrl train`` run: read from a YAML/TOML file and the command line, checked, resolved.

A run's settings are one :class:`TrainConfig`. :func:`resolve_config` builds it from a mapping of
the keys a config file holds (the command line's flags with ``_`` for ``-``: ``agent_kwargs``,
``checkpoint_every``, ...) and checks every value before any work starts, with errors that name the
flag (``--budget: ...``). :func:`merge_settings` layers the defaults, a config file and the flags
given on the command line, the later winning.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fedrl_algos.common.evaluation import DEFAULT_EVAL_TRAJECTORIES

__all__ = [
    "CONFIG_KEYS",
    "SB3_ALGORITHM_CLASSES",
    "TrainConfig",
    "TrainConfigError",
    "load_config_file",
    "merge_settings",
    "resolve_config",
]


class TrainConfigError(ValueError):
    """A setting of ``fedrl train`` is not usable; the message names its flag (``--budget: ...``)."""


#: what a config file may hold, with each key's flag (the same name with ``-``) and meaning
CONFIG_KEYS: dict[str, str] = {
    "algo": "algorithm: a key of fedrl_algos.ALGORITHMS",
    "env": "a registered Gymnasium or fedrl id, or 'module:EnvId'",
    "env_module": "module(s) to import first, which register the user's envs (a name or a list)",
    "agent_kwargs": "one dict of gym.make arguments per agent: a list, a JSON text, or the path of a JSON/YAML/TOML file",
    "n_agents": "that many identical agents of a Gymnasium id (instead of agent_kwargs)",
    "algo_kwargs": "constructor arguments of the algorithm: a mapping, a JSON text or a file path",
    "policy": "the policy (MlpPolicy, TabularPolicy, CnnPolicy)",
    "policy_kwargs": "keyword arguments of the policy: a mapping, a JSON text or a file path",
    "seeds": "number of seeds (seed, seed + 1, ...)",
    "seed": "the first seed",
    "seed_list": "explicit seeds (a list, or a comma-separated text); replaces seeds and seed",
    "budget": "total environment steps summed over agents, learn(total_timesteps=budget)",
    "rounds": "communication rounds, instead of budget",
    "eval_trajectories": "evaluation episodes per agent at each log",
    "log_interval": "rounds between two logs (and evaluations)",
    "checkpoint_every": "rounds between two checkpoints (0: none)",
    "tensorboard": "also log to TensorBoard (true/false)",
    "per_agent": "per-agent lines in the learning-curve figure (true/false)",
    "device": "torch device (cpu, cuda, auto)",
    "progress": "progress bars (true/false)",
    "verbose": "1: the logger's table on stdout at each log",
    "out": "the run directory",
}

#: ``algorithm_class`` names that ``--algo fedavg_sb3`` takes in ``algo_kwargs``
SB3_ALGORITHM_CLASSES = ("A2C", "DDPG", "DQN", "PPO", "SAC", "TD3")

#: constructor arguments that ``fedrl train`` sets itself, with the flag that sets them
_RESERVED_KWARGS = {
    "seed": "--seed/--seed-list",
    "device": "--device",
    "env": "--env",
    "agent_kwargs": "--agent-kwargs",
    "n_agents": "--n-agents",
    "policy": "--policy",
    "policy_kwargs": "--policy-kwargs",
    "eval_trajectories": "--eval-trajectories",
    "tensorboard_log": "--tensorboard",
    "verbose": "--verbose",
}

#: the settings of a run that identify it: rerunning with other values on an existing run
#: directory is refused (the budget, the seeds, logging and checkpointing may change)
IDENTITY_KEYS = ("algo", "env", "agent_kwargs", "n_agents", "algo_kwargs", "policy", "policy_kwargs", "eval_trajectories")

_DEFAULTS: dict[str, Any] = {
    "policy": "MlpPolicy",
    "seeds": 1,
    "seed": 0,
    "eval_trajectories": DEFAULT_EVAL_TRAJECTORIES,
    "log_interval": 1,
    "checkpoint_every": 10,
    "tensorboard": False,
    "per_agent": False,
    "device": "auto",
    "progress": True,
    "verbose": 0,
}


@dataclass(frozen=True)
class TrainConfig:
    """The resolved settings of a ``fedrl train`` run (written to ``OUT/config.json``).

    :param algo: the algorithm's key in :data:`fedrl_algos.ALGORITHMS`
    :param env: the registered id the agents live in (``"module:EnvId"`` resolved to ``EnvId``)
    :param out: the run directory
    :param agent_kwargs: one dict of ``gym.make`` (or family ``make_params``) arguments per agent
    :param n_agents: that many identical agents (a Gymnasium id without ``agent_kwargs``)
    :param algo_kwargs: further constructor arguments of the algorithm
    :param policy: the policy name
    :param policy_kwargs: keyword arguments of the policy
    :param seeds: one run per seed, in this order
    :param budget: total environment steps summed over agents (``learn(total_timesteps=budget)``)
    :param rounds: communication rounds (instead of ``budget``)
    :param eval_trajectories: evaluation episodes per agent at each log
    :param log_interval: rounds between two logs (and evaluations)
    :param checkpoint_every: rounds between two checkpoints (0: none; the final model is saved anyway)
    :param tensorboard: also write TensorBoard event files
    :param per_agent: per-agent lines in the learning-curve figure
    :param device: torch device
    :param env_modules: modules imported first (they register the user's envs)
    :param progress: progress bars
    :param verbose: 1: the logger's table on stdout at each log
    """

    algo: str
    env: str
    out: str
    agent_kwargs: list[dict[str, Any]] | None = None
    n_agents: int | None = None
    algo_kwargs: dict[str, Any] = field(default_factory=dict)
    policy: str = "MlpPolicy"
    policy_kwargs: dict[str, Any] | None = None
    seeds: tuple[int, ...] = (0,)
    budget: int | None = None
    rounds: int | None = None
    eval_trajectories: int = DEFAULT_EVAL_TRAJECTORIES
    log_interval: int = 1
    checkpoint_every: int = 10
    tensorboard: bool = False
    per_agent: bool = False
    device: str = "auto"
    env_modules: tuple[str, ...] = ()
    progress: bool = True
    verbose: int = 0

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON data (``config.json``'s ``settings``)."""
        data = asdict(self)
        data["seeds"] = list(self.seeds)
        data["env_modules"] = list(self.env_modules)
        return data

    def identity(self) -> dict[str, Any]:
        """The settings that identify the run (:data:`IDENTITY_KEYS`), as JSON data."""
        data = self.to_json()
        return {key: data[key] for key in IDENTITY_KEYS}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _fail(key: str, message: str) -> TrainConfigError:
    return TrainConfigError(f"{_flag(key)}: {message}")


def _read_structured(path: pathlib.Path, key: str) -> Any:
    """The data of a JSON, YAML or TOML file (by its suffix; JSON otherwise)."""
    if not path.is_file():
        raise _fail(key, f"file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise _fail(key, f"reading {path} needs PyYAML (pip install pyyaml); or give a TOML or JSON file") from None
            return yaml.safe_load(text)
        if suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10: the same parser as the tomli package
                try:
                    import tomli as tomllib
                except ImportError:
                    raise _fail(key, f"reading {path} needs Python >= 3.11 or the tomli package (pip install tomli); "
                                "or give a YAML or JSON file") from None
            return tomllib.loads(text)
        return json.loads(text)
    except TrainConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - any parser's error, reported with the file and flag
        raise _fail(key, f"cannot read {path} ({type(err).__name__}: {err})") from None


def _structured(value: Any, key: str, base_dir: pathlib.Path | None) -> Any:
    """A setting that may be given as data, as a JSON text, or as a file path."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise _fail(key, f"not valid JSON ({err})") from None
    path = pathlib.Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        path = base_dir / path
    return _read_structured(path, key)


def load_config_file(path: str | pathlib.Path) -> dict[str, Any]:
    """The settings of a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON config file.

    Its keys are those of :data:`CONFIG_KEYS` (``-`` and ``_`` alike); a ``[train]`` table (TOML) or
    ``train:`` mapping (YAML) holding them is read as well. Relative file paths inside it
    (``agent_kwargs: agents.json``) are read relative to the config file's folder.

    :raise TrainConfigError: naming ``--config`` for a missing or unreadable file, or an unknown key
    """
    path = pathlib.Path(path).expanduser()
    data = _read_structured(path, "config")
    if isinstance(data, Mapping) and set(data) == {"train"} and isinstance(data["train"], Mapping):
        data = data["train"]
    if not isinstance(data, Mapping):
        raise _fail("config", f"{path} must hold a mapping of settings, got {type(data).__name__}")
    settings = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(settings) - set(CONFIG_KEYS))
    if unknown:
        raise _fail("config", f"{path}: unknown setting(s) {unknown}; a config file holds {sorted(CONFIG_KEYS)}")
    settings["_base_dir"] = str(path.resolve().parent)
    return settings


#: settings that replace each other: a source giving a key of the left drops the right ones of earlier sources
_REPLACES = {
    "budget": ("rounds",),
    "rounds": ("budget",),
    "agent_kwargs": ("n_agents",),
    "n_agents": ("agent_kwargs",),
    "seed_list": ("seeds", "seed"),
    "seeds": ("seed_list",),
    "seed": ("seed_list",),
}


def merge_settings(*sources: Mapping[str, Any]) -> dict[str, Any]:
    """Layer settings, later sources winning (defaults, then a config file, then the command line).

    ``None`` values do not count as given. Settings that replace each other (``budget``/``rounds``,
    ``agent_kwargs``/``n_agents``, ``seed_list``/``seeds``+``seed``): a source that gives one of a group
    drops the ones of earlier sources.
    """
    merged: dict[str, Any] = {}
    for source in sources:
        given = {k: v for k, v in source.items() if v is not None}
        for key in given:
            for replaced in _REPLACES.get(key, ()):
                merged.pop(replaced, None)
        merged.update(given)
    return merged


def _check_int(key: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, str):
        value = _number(key, value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        raise _fail(key, f"must be an integer >= {low}" + (f" and < {high + 1}" if high is not None else "") + f", got {value}")
    return value


def _number(key: str, text: str) -> float:
    try:
        return float(text.replace("_", ""))
    except ValueError:
        raise _fail(key, f"must be a number, got {text!r}") from None


def _check_bool(key: str, value: Any) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    if not isinstance(value, bool):
        raise _fail(key, f"must be true or false, got {value!r}")
    return value


def _check_mapping(key: str, value: Any, base_dir: pathlib.Path | None) -> dict[str, Any]:
    value = _structured(value, key, base_dir)
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _fail(key, f"must be a mapping of keyword arguments (a JSON object), got {type(value).__name__}")
    return dict(value)


def _check_agent_kwargs(value: Any, base_dir: pathlib.Path | None) -> list[dict[str, Any]]:
    value = _structured(value, "agent_kwargs", base_dir)
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        raise _fail("agent_kwargs", f"must be a list with one dict of gym.make arguments per agent, got {type(value).__name__}")
    if not value:
        raise _fail("agent_kwargs", "must be a non-empty list with one dict per agent")
    for i, kw in enumerate(value):
        if not isinstance(kw, Mapping) or not all(isinstance(k, str) for k in kw):
            raise _fail("agent_kwargs", f"entry {i} must be a dict of gym.make arguments, got {kw!r}")
    return [dict(kw) for kw in value]


def _check_seeds(settings: Mapping[str, Any]) -> tuple[int, ...]:
    limit = 2**63 - 1
    if settings.get("seed_list") is not None:
        raw = settings["seed_list"]
        if isinstance(raw, str):
            raw = [s for s in raw.replace(" ", "").split(",") if s]
        if isinstance(raw, int | float):
            raw = [raw]
        if not isinstance(raw, Sequence) or not raw:
            raise _fail("seed_list", f"must be a non-empty list of seeds, got {settings['seed_list']!r}")
        seeds = tuple(_check_int("seed_list", s, 0, limit) for s in raw)
        if len(set(seeds)) != len(seeds):
            raise _fail("seed_list", f"the seeds must differ, got {list(seeds)}")
        return seeds
    count = _check_int("seeds", settings.get("seeds", 1), 1)
    first = _check_int("seed", settings.get("seed", 0), 0, limit)
    if first + count - 1 > limit:
        raise _fail("seed", f"the seeds {first}..{first + count - 1} do not fit in [0, 2**63)")
    return tuple(range(first, first + count))


def _check_algo_kwargs(algo: str, value: Any, base_dir: pathlib.Path | None) -> dict[str, Any]:
    import inspect

    from fedrl_algos import ALGORITHMS

    kwargs = _check_mapping("algo_kwargs", value, base_dir)
    for key in kwargs:
        if key in _RESERVED_KWARGS:
            raise _fail("algo_kwargs", f"{key!r} is set by {_RESERVED_KWARGS[key]}, not in --algo-kwargs")
    cls = ALGORITHMS[algo]
    accepted = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "_init_setup_model")]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        allowed = sorted(set(accepted) - set(_RESERVED_KWARGS) - {"policy", "env", "algorithm_class"})
        extra = " and algorithm_class" if algo == "fedavg_sb3" else ""
        raise _fail("algo_kwargs", f"{cls.__name__} takes no argument {unknown[0]!r}; it takes {allowed}{extra}")
    if algo == "fedavg_sb3":
        name = kwargs.get("algorithm_class")
        if name not in SB3_ALGORITHM_CLASSES:
            raise _fail("algo_kwargs", f"fedavg_sb3 needs 'algorithm_class', the name of an SB3 algorithm in "
                        f"{list(SB3_ALGORITHM_CLASSES)}, e.g. --algo-kwargs '{{\"algorithm_class\": \"PPO\"}}'; got {name!r}")
    return kwargs


def import_env_modules(modules: Sequence[str]) -> None:
    """Import the modules that register the user's environments (``gymnasium.register`` at import).

    :raise TrainConfigError: naming ``--env-module`` for a module that cannot be imported
    """
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise _fail("env_module", f"{name!r} cannot be imported ({err}); it must be importable from here "
                        "(an installed package, or a module on PYTHONPATH)") from None


def check_env(env: Any, env_modules: Sequence[str]) -> str:
    """The registered id behind ``env`` (``"module:EnvId"`` imports ``module``), after importing ``env_modules``.

    :raise TrainConfigError: naming ``--env`` (with a hint about ``--env-module``) when it is not registered
    """
    import gymnasium as gym

    import fedrl_envs  # noqa: F401 - registers the fedrl/ ids
    from fedrl_wrappers.federated import resolve_env_id

    if not isinstance(env, str) or not env:
        raise _fail("env", f"must be a registered environment id, got {env!r}")
    import_env_modules(env_modules)
    try:
        env_id = resolve_env_id(env)
    except ValueError as err:
        raise _fail("env", str(err)) from None
    if env_id not in gym.registry:
        close = [k for k in gym.registry if k.split("-v")[0].lower() == env_id.split("-v")[0].lower()]
        hint = f" (registered versions: {close})" if close else ""
        raise _fail("env", f"{env_id!r} is not a registered Gymnasium or fedrl environment{hint}. An env of your own: "
                    "pass --env-module MODULE (the module whose import calls gymnasium.register), or --env MODULE:ID")
    return env_id


def resolve_config(settings: Mapping[str, Any]) -> TrainConfig:
    """Check every setting and resolve them into a :class:`TrainConfig` (nothing is built or trained).

    :param settings: the keys of :data:`CONFIG_KEYS` (e.g. :func:`merge_settings` of the defaults, a
        config file and the command line); unset keys take their defaults
    :raise TrainConfigError: naming the flag of the first unusable setting
    """
    from fedrl_algos import ALGORITHMS

    base_dir = pathlib.Path(settings["_base_dir"]) if settings.get("_base_dir") else None
    settings = {**_DEFAULTS, **{k: v for k, v in settings.items() if v is not None and k != "_base_dir"}}
    unknown = sorted(set(settings) - set(CONFIG_KEYS))
    if unknown:
        raise TrainConfigError(f"unknown setting(s) {unknown}; the settings are {sorted(CONFIG_KEYS)}")
    for key in ("algo", "env", "out"):
        if not settings.get(key):
            raise _fail(key, "is required" + (" (the run directory)" if key == "out" else ""))
    algo = settings["algo"]
    if algo not in ALGORITHMS:
        raise _fail("algo", f"unknown algorithm {algo!r}; choose from {sorted(ALGORITHMS)}")
    env_modules = settings.get("env_module", ())
    env_modules = (env_modules,) if isinstance(env_modules, str) else tuple(env_modules)
    if not all(isinstance(m, str) and m for m in env_modules):
        raise _fail("env_module", f"must be module names, got {list(env_modules)}")
    env_id = check_env(settings["env"], env_modules)
    if ":" in settings["env"]:  # "module:EnvId": a later run (a resume) imports the module too
        env_modules = (*env_modules, settings["env"].partition(":")[0])
    agent_kwargs = None if settings.get("agent_kwargs") is None else _check_agent_kwargs(settings["agent_kwargs"], base_dir)
    n_agents = None if settings.get("n_agents") is None else _check_int("n_agents", settings["n_agents"], 1)
    if agent_kwargs is not None and n_agents is not None:
        raise _fail("n_agents", "give either --agent-kwargs (one dict per agent) or --n-agents (identical agents), not both")
    import fedrl_envs

    if fedrl_envs.family_of(env_id) is None and agent_kwargs is None and n_agents is None:
        raise _fail("agent_kwargs", f"{env_id} is a Gymnasium id: give --agent-kwargs (one dict of gym.make arguments per "
                    "agent) or --n-agents N (identical agents)")
    if fedrl_envs.family_of(env_id) is not None and n_agents is not None:
        raise _fail("n_agents", f"{env_id} is a fedrl family: its agents are its training tasks, or one per --agent-kwargs dict")
    algo_kwargs = _check_algo_kwargs(algo, settings.get("algo_kwargs") or {}, base_dir)
    policy = settings["policy"]
    if not isinstance(policy, str) or not policy:
        raise _fail("policy", f"must be a policy name, got {policy!r}")
    if algo != "fedavg_sb3" and policy not in ALGORITHMS[algo].policy_aliases:
        raise _fail("policy", f"{ALGORITHMS[algo].__name__} takes {sorted(ALGORITHMS[algo].policy_aliases)}, got {policy!r}")
    policy_kwargs = None if settings.get("policy_kwargs") is None else _check_mapping("policy_kwargs", settings["policy_kwargs"], base_dir)
    if (settings.get("budget") is None) == (settings.get("rounds") is None):
        raise _fail("budget", "give exactly one of --budget (environment steps summed over agents) and --rounds")
    budget = None
    if settings.get("budget") is not None:
        raw = settings["budget"]
        value = _number("budget", raw) if isinstance(raw, str) else raw
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 1:
            raise _fail("budget", f"must be a number of environment steps >= 1, got {raw!r}")
        if not float(value).is_integer():
            raise _fail("budget", f"must be a whole number of environment steps, got {raw!r}")
        budget = int(value)
    rounds = None if settings.get("rounds") is None else _check_int("rounds", settings["rounds"], 1)
    device = settings["device"]
    if device != "auto":
        from fedrl_envs.validation import check_device

        try:
            device = str(check_device(device))
        except ValueError as err:
            raise _fail("device", str(err)) from None
    return TrainConfig(
        algo=algo,
        env=env_id,
        out=str(settings["out"]),
        agent_kwargs=agent_kwargs,
        n_agents=n_agents,
        algo_kwargs=algo_kwargs,
        policy=policy,
        policy_kwargs=policy_kwargs,
        seeds=_check_seeds(settings),
        budget=budget,
        rounds=rounds,
        eval_trajectories=_check_int("eval_trajectories", settings["eval_trajectories"], 0),
        log_interval=_check_int("log_interval", settings["log_interval"], 1),
        checkpoint_every=_check_int("checkpoint_every", settings["checkpoint_every"], 0),
        tensorboard=_check_bool("tensorboard", settings["tensorboard"]),
        per_agent=_check_bool("per_agent", settings["per_agent"]),
        device=device,
        env_modules=env_modules,
        progress=_check_bool("progress", settings["progress"]),
        verbose=_check_int("verbose", settings["verbose"], 0, 2),
    )
