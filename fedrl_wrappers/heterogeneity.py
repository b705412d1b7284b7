"""Per-agent heterogeneity for Gymnasium's MuJoCo and Atari environments.

A federation on the generic backend of :class:`~fedrl_wrappers.FederatedVecEnv` gives each agent its own
``gym.make`` keyword arguments (``agent_kwargs``). Atari games take their variations as plain
keyword arguments (``mode``, ``difficulty``, ``repeat_action_probability``); MuJoCo models have no
such arguments, so their physics is changed *after construction* by a wrapper. Any agent kwargs
may carry ``wrappers=[...]``, the list of ``env -> env`` callables that ``gym.make_vec`` applies to
each of that agent's sub-environments, so both kinds travel the same way::

    FederatedVecEnv("HalfCheetah-v5", 4, agent_kwargs=mujoco_agent_kwargs(mass_scale=[0.8, 1.0, 1.2]))
    FederatedVecEnv("ALE/Pong-v5", 1, agent_kwargs=atari_agent_kwargs(difficulty=[0, 1, 2, 3]))

* :class:`BodyMassScale` and :class:`FrictionScale` are the wrappers; :class:`MuJoCoDynamics` is a
  small picklable factory of both for ``wrappers=[...]``; :func:`mujoco_agent_kwargs` builds one
  dict per agent from per-agent scales.
* :class:`AtariPreprocess` is a factory of Gymnasium's standard ``AtariPreprocessing`` (noop
  starts, frame skip 4 with max-pooling, 84×84 grayscale) followed by ``FrameStackObservation``;
  :func:`atari_agent_kwargs` builds one dict per agent (with ``frameskip=1``, since the
  preprocessing wrapper does the frame skipping).

The factories are frozen dataclasses: they compare by value, have a readable ``repr``, pickle
(``vectorization_mode="async"``) and serialize to JSON (:func:`factory_to_json`), so a saved
federation can rebuild its environments.

See ``docs/mujoco_atari.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from fedrl_envs.validation import check_bool, check_int, check_real, is_real

__all__ = [
    "BodyMassScale",
    "FrictionScale",
    "MuJoCoDynamics",
    "AtariPreprocess",
    "mujoco_agent_kwargs",
    "atari_agent_kwargs",
    "factory_to_json",
    "factory_from_json",
]


def _positive(name: str, value: Any) -> float:
    if not is_real(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _mujoco_model(env: gym.Env, wrapper: str) -> tuple[Any, Any]:
    """``(MjModel, MjData)`` of a Gymnasium MuJoCo env, or a ValueError naming ``wrapper``."""
    base = env.unwrapped
    model, data = getattr(base, "model", None), getattr(base, "data", None)
    if model is None or data is None or type(model).__name__ != "MjModel":
        raise ValueError(
            f"{wrapper} needs a Gymnasium MuJoCo environment (env.unwrapped.model an MjModel), got {base!r}; "
            "install the extra with pip install 'fedrl[mujoco]'"
        )
    return model, data


def _named_ids(model: Any, names: Sequence[str], kind: str, wrapper: str) -> np.ndarray:
    """Ids of the ``kind`` (``"body"`` or ``"geom"``) objects called ``names``; errors name ``wrapper``."""
    import mujoco

    obj = {"body": mujoco.mjtObj.mjOBJ_BODY, "geom": mujoco.mjtObj.mjOBJ_GEOM}[kind]
    count = {"body": model.nbody, "geom": model.ngeom}[kind]
    argument = {"body": "bodies", "geom": "geoms"}[kind]
    ids = []
    for name in names:
        idx = mujoco.mj_name2id(model, obj, name)
        if idx < 0:
            known = [mujoco.mj_id2name(model, obj, k) for k in range(count)]
            raise ValueError(f"{wrapper}: {argument} names an unknown {kind} {name!r}; this model has {known}")
        ids.append(idx)
    return np.asarray(ids, dtype=np.int64)


class BodyMassScale(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Multiply the masses and rotational inertias of a MuJoCo model's bodies by ``scale``.

    Applied once, at construction, to this environment's own ``MjModel`` (each sub-environment of
    a vector env has its own); resets keep it. Mass and inertia are scaled together (a uniform
    change of density: the bodies keep their shapes), then ``mj_setConst`` recomputes the model's
    derived constants (subtree masses, inverse weights, mean inertia). Everything else —
    observations, rewards, actuator gears, joint damping — is unchanged, so a heavier body reacts
    less to the same torques.

    :param env: a Gymnasium MuJoCo environment (``env.unwrapped.model`` is an ``MjModel``)
    :param scale: factor > 0 for every selected body
    :param bodies: names of the bodies to scale (default: every body but the world body)
    """

    def __init__(self, env: gym.Env, scale: float, bodies: Sequence[str] | None = None) -> None:
        import mujoco

        scale = _positive("scale", scale)
        gym.utils.RecordConstructorArgs.__init__(self, scale=scale, bodies=None if bodies is None else list(bodies))
        gym.Wrapper.__init__(self, env)
        model, data = _mujoco_model(env, "BodyMassScale")
        # Every body but the world (id 0, massless) unless named.
        ids = np.arange(1, model.nbody) if bodies is None else _named_ids(model, bodies, "body", "BodyMassScale")
        self.scale = scale
        self.body_ids = ids
        model.body_mass[ids] *= scale
        model.body_inertia[ids] *= scale
        mujoco.mj_setConst(model, data)


class FrictionScale(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Multiply the sliding friction coefficient of a MuJoCo model's geoms by ``scale``.

    Applied once, at construction, to this environment's own ``MjModel``. Only the sliding
    (tangential) coefficient — column 0 of ``geom_friction`` — is scaled; torsional and rolling
    friction are left alone. MuJoCo combines the two geoms of a contact by taking the larger
    coefficient, so scaling every geom (the default) scales every contact's friction.

    :param env: a Gymnasium MuJoCo environment
    :param scale: factor > 0
    :param geoms: names of the geoms to scale (default: every geom, the floor included)
    """

    def __init__(self, env: gym.Env, scale: float, geoms: Sequence[str] | None = None) -> None:
        scale = _positive("scale", scale)
        gym.utils.RecordConstructorArgs.__init__(self, scale=scale, geoms=None if geoms is None else list(geoms))
        gym.Wrapper.__init__(self, env)
        model, _ = _mujoco_model(env, "FrictionScale")
        ids = np.arange(model.ngeom) if geoms is None else _named_ids(model, geoms, "geom", "FrictionScale")
        self.scale = scale
        self.geom_ids = ids
        model.geom_friction[ids, 0] *= scale


@dataclass(frozen=True)
class MuJoCoDynamics:
    """``env -> env`` factory for ``wrappers=[...]``: :class:`BodyMassScale` then :class:`FrictionScale`.

    A scale of exactly 1 adds no wrapper.

    :param mass_scale: factor of every body's mass and inertia
    :param friction_scale: factor of every geom's sliding friction
    """

    mass_scale: float = 1.0
    friction_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mass_scale", _positive("mass_scale", self.mass_scale))
        object.__setattr__(self, "friction_scale", _positive("friction_scale", self.friction_scale))

    def __call__(self, env: gym.Env) -> gym.Env:
        if self.mass_scale != 1.0:
            env = BodyMassScale(env, self.mass_scale)
        if self.friction_scale != 1.0:
            env = FrictionScale(env, self.friction_scale)
        return env


@dataclass(frozen=True)
class AtariPreprocess:
    """``env -> env`` factory for ``wrappers=[...]``: ``AtariPreprocessing`` then ``FrameStackObservation``.

    The defaults are the standard DQN preprocessing (Mnih et al., 2015; Machado et al., 2018): up
    to 30 no-op starts, the frame skipping of the wrapper (the ALE env must have ``frameskip=1``),
    max-pooling of the last two frames, 84×84 grayscale ``uint8`` frames and 4 stacked frames,
    giving observations of shape ``(4, 84, 84)`` (channel-first, as SB3's ``CnnPolicy`` expects).

    :param frame_stack: frames stacked along the first axis (1: no stacking, ``(84, 84)`` frames)
    :param noop_max: maximum number of no-op actions at reset
    :param frame_skip: frames per action, done by ``AtariPreprocessing``
    :param screen_size: side of the square resized frame
    :param terminal_on_life_loss: end the episode when a life is lost
    :param grayscale_obs: grayscale (else RGB) frames
    :param scale_obs: float frames in [0, 1] (else ``uint8``)
    """

    frame_stack: int = 4
    noop_max: int = 30
    frame_skip: int = 4
    screen_size: int = 84
    terminal_on_life_loss: bool = False
    grayscale_obs: bool = True
    scale_obs: bool = False

    def __post_init__(self) -> None:
        # Stored as plain ints (a NumPy integer is accepted) so the factory stays JSON-able.
        for name, low in (("frame_stack", 1), ("noop_max", 0), ("frame_skip", 1), ("screen_size", 1)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), low))
        for name in ("terminal_on_life_loss", "grayscale_obs", "scale_obs"):
            object.__setattr__(self, name, check_bool(name, getattr(self, name)))

    def __call__(self, env: gym.Env) -> gym.Env:
        frameskip = getattr(env.unwrapped, "_frameskip", 1)
        if self.frame_skip > 1 and frameskip != 1:
            raise ValueError(
                f"AtariPreprocess skips frames itself (frame_skip={self.frame_skip}): make the ALE env with "
                f"frameskip=1, got frameskip={frameskip}"
            )
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=self.noop_max,
            frame_skip=self.frame_skip,
            screen_size=self.screen_size,
            terminal_on_life_loss=self.terminal_on_life_loss,
            grayscale_obs=self.grayscale_obs,
            scale_obs=self.scale_obs,
        )
        if self.frame_stack > 1:
            env = gym.wrappers.FrameStackObservation(env, self.frame_stack)
        return env


def _per_agent(name: str, value: Any, n: int | None) -> tuple[list[Any], int | None]:
    """Broadcast a scalar or check a per-agent sequence; returns the list and the agent count."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        values = list(value)
        if len(values) == 0:
            raise ValueError(f"{name} must be a value or a non-empty list with one value per agent")
        if n is not None and len(values) != n:
            raise ValueError(f"{name} must have one value per agent ({n}), got {len(values)}")
        return values, len(values)
    return [value], n


def _each(name: str, value: Any, check: Any) -> Any:
    """``check(name, value)`` of a scalar, or a list of ``check(f"{name}[k]", v)`` of a per-agent sequence."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [check(f"{name}[{k}]", v) for k, v in enumerate(value)]
    return check(name, value)


def _broadcast(columns: Mapping[str, Any], n_agents: int | None) -> list[dict[str, Any]]:
    lists: dict[str, list[Any]] = {}
    n = n_agents
    for name, value in columns.items():
        lists[name], n = _per_agent(name, value, n)
    n = n or 1
    return [{name: vals[k] if len(vals) > 1 else vals[0] for name, vals in lists.items()} for k in range(n)]


def mujoco_agent_kwargs(
    mass_scale: float | Sequence[float] = 1.0,
    friction_scale: float | Sequence[float] = 1.0,
    n_agents: int | None = None,
    **env_kwargs: Any,
) -> list[dict[str, Any]]:
    """One ``agent_kwargs`` dict per agent of a heterogeneous MuJoCo federation.

    Each scale is one number for every agent or a list with one per agent; the number of agents
    is the length of the lists (or ``n_agents``). Each dict holds ``env_kwargs`` (passed to
    ``gym.make``, e.g. ``ctrl_cost_weight``) and ``wrappers=[MuJoCoDynamics(mass_scale, friction_scale)]``.

    >>> kwargs = mujoco_agent_kwargs(mass_scale=[0.8, 1.25], friction_scale=1.1)
    >>> kwargs[1]["wrappers"]
    [MuJoCoDynamics(mass_scale=1.25, friction_scale=1.1)]
    """
    if n_agents is not None:
        n_agents = check_int("n_agents", n_agents, 1)
    rows = _broadcast({"mass_scale": mass_scale, "friction_scale": friction_scale}, n_agents)
    return [{**env_kwargs, "wrappers": [MuJoCoDynamics(row["mass_scale"], row["friction_scale"])]} for row in rows]


def atari_agent_kwargs(
    mode: int | None | Sequence[int | None] = None,
    difficulty: int | None | Sequence[int | None] = None,
    repeat_action_probability: float | Sequence[float] = 0.25,
    n_agents: int | None = None,
    preprocess: AtariPreprocess | None = None,
    **env_kwargs: Any,
) -> list[dict[str, Any]]:
    """One ``agent_kwargs`` dict per agent of a heterogeneous Atari federation (ALE v5 ids).

    ``mode`` and ``difficulty`` are the game's flavours (``None``: the game's default; the valid
    values are ``env.unwrapped.ale.getAvailableModes()`` / ``getAvailableDifficulties()``, e.g.
    Pong: modes 0–1, difficulties 0–3; Breakout: modes 0, 4, …, 44, difficulties 0–1);
    ``repeat_action_probability`` is the sticky-action probability (0.25 in the v5 ids). Each is
    one value for every agent or a list with one per agent. Every dict also holds
    ``frameskip=1`` and ``wrappers=[preprocess]`` (default :class:`AtariPreprocess()`), plus
    ``env_kwargs``. Importing ``ale_py`` (done here) registers the ``ALE/...`` ids.

    ``mode`` and ``difficulty`` are ints ``>= 0`` or ``None``, ``repeat_action_probability`` a
    real number in ``[0, 1]`` (Python or NumPy); anything else is a ``TypeError``/``ValueError``
    naming the argument, raised before ``ale_py`` is imported.
    """
    if n_agents is not None:
        n_agents = check_int("n_agents", n_agents, 1)
    if preprocess is None:
        preprocess = AtariPreprocess()
    elif not callable(preprocess):
        raise TypeError(f"preprocess must be an AtariPreprocess (or another env -> env callable), got {preprocess!r}")
    mode = _each("mode", mode, lambda name, v: None if v is None else check_int(name, v, 0))
    difficulty = _each("difficulty", difficulty, lambda name, v: None if v is None else check_int(name, v, 0))
    repeat_action_probability = _each(
        "repeat_action_probability", repeat_action_probability, lambda name, v: check_real(name, v, 0, 1)
    )
    rows = _broadcast(
        {"mode": mode, "difficulty": difficulty, "repeat_action_probability": repeat_action_probability}, n_agents
    )
    try:
        import ale_py  # noqa: F401  (registers the ALE/... ids)
    except ImportError as err:  # pragma: no cover - depends on the installed extras
        raise ImportError("Atari environments need the extra: pip install 'fedrl[atari]'") from err
    out = []
    for row in rows:
        kw = {key: value for key, value in row.items() if value is not None}
        out.append({**env_kwargs, **kw, "frameskip": 1, "wrappers": [preprocess]})
    return out


_FACTORIES = {cls.__name__: cls for cls in (MuJoCoDynamics, AtariPreprocess)}


def factory_to_json(obj: Any) -> dict[str, Any]:
    """A JSON-able ``{"wrapper_factory": name, "kwargs": {...}}`` for the factories of this module.

    Raises ``TypeError`` for anything else (arbitrary callables are not serialized).
    """
    if type(obj).__name__ in _FACTORIES and isinstance(obj, _FACTORIES[type(obj).__name__]):
        return {"wrapper_factory": type(obj).__name__, "kwargs": dataclasses.asdict(obj)}
    raise TypeError(f"only {sorted(_FACTORIES)} serialize to JSON, got {obj!r}")


def factory_from_json(data: Mapping[str, Any]) -> Any:
    """Inverse of :func:`factory_to_json`."""
    name = data.get("wrapper_factory")
    if name not in _FACTORIES:
        raise ValueError(f"unknown wrapper factory {name!r}; known: {sorted(_FACTORIES)}")
    return _FACTORIES[name](**data.get("kwargs", {}))
