"""Property-based tests (hypothesis): inputs that cannot corrupt state.

Over env constructor kwargs, action batches (dtype, shape, device, out of range, NaN), the
arguments of ``FederatedVecEnv`` and the algorithms' hyperparameters: every invalid input gets a
``ValueError`` or ``TypeError`` naming the argument; every valid one works (the env steps with
finite outputs in its spaces, the algorithm trains a round with finite parameters).

Sizes are kept small (``max_examples``) so that the whole file runs in well under a minute; run
with ``--hypothesis-show-statistics`` for the number of cases.
"""

from __future__ import annotations

import inspect
import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fedrl_envs
from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG
from fedrl_envs import FamilyVectorEnv
from wrappers import FederatedVecEnv

FAMILY_IDS = sorted(fedrl_envs.FAMILIES)


FUZZ = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

#: anything a user might pass: numbers of every kind, NaN and inf, strings, containers, None
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-20, 40),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(-3, 3),
    st.text(max_size=3),
    st.tuples(st.integers(-2, 6), st.integers(-2, 6)),
    st.tuples(st.floats(-1.5, 1.5), st.floats(-1.5, 1.5)),
    st.tuples(st.floats(allow_nan=True), st.floats(allow_infinity=True)),
    st.lists(st.integers(-2, 4), max_size=3),
    st.just(np.int64(3)),
    st.just(np.float32(0.5)),
    st.just(object()),
)


def _named(err: BaseException, names: list[str]) -> bool:
    """Whether the error message names one of the arguments."""
    msg = str(err)
    return any(name in msg for name in names)


# --- env constructor kwargs ---------------------------------------------------------------------
def _family_kwargs(family_id: str) -> list[str]:
    return [p for p in inspect.signature(fedrl_envs.FAMILIES[family_id].make_params).parameters]


@st.composite
def env_kwargs(draw):
    family_id = draw(st.sampled_from(FAMILY_IDS))
    names = _family_kwargs(family_id) + ["render_mode"]
    chosen = draw(st.lists(st.sampled_from(names + ["bogus_kwarg"]), unique=True, max_size=3))
    # render_mode: strings or None only; gym.make itself calls render_mode.endswith(...) before
    # the env sees it (an AttributeError inside Gymnasium for other types, not fedrl's to fix).
    render = st.one_of(st.none(), st.text(max_size=3), st.sampled_from(["ansi", "human", "rgb_array"]))
    return family_id, {name: draw(render if name == "render_mode" else ANY_VALUE) for name in chosen}


def _check_single_env_runs(env: gym.Env) -> None:
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    for _ in range(3):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and math.isfinite(reward)
        if terminated or truncated:
            obs, _ = env.reset()


@FUZZ
@given(env_kwargs())
def test_gym_make_with_random_kwargs(case):
    family_id, kwargs = case
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Gymnasium's passive checker warns about odd spaces; errors are what we test
            env = gym.make(family_id, **kwargs)
    except (ValueError, TypeError) as err:
        event("refused")
        assert _named(err, list(kwargs)), f"{family_id} {kwargs!r}: {err}"
        return
    except gym.error.DependencyNotInstalled:
        # render_mode="human": gym.make wraps an rgb_array env in HumanRendering, which needs pygame.
        assert kwargs.get("render_mode") == "human"
        event("refused")
        return
    event("accepted")
    try:
        _check_single_env_runs(env)
    finally:
        env.close()


# --- action batches ------------------------------------------------------------------------------
NUMPY_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                np.float64, np.bool_, np.complex64, np.str_, np.object_]
TORCH_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16, torch.float32,
                torch.float64, torch.bool, torch.complex64]


@st.composite
def action_batches(draw, num_envs: int, space: gym.Space):
    """An action batch that may be right, or wrong in kind, dtype, shape, device, range or finiteness."""
    shape = (num_envs, *space.shape)
    if draw(st.integers(0, 2)) == 0:  # a third of the cases: a valid batch of a random accepted kind
        if isinstance(space, gym.spaces.Discrete):
            values = draw(st.lists(st.integers(int(space.start), int(space.start + space.n - 1)), min_size=num_envs, max_size=num_envs))
            dtype = draw(st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.uint16, np.uint64]))
            arr = np.asarray(values, dtype=dtype)
        else:
            arr = np.asarray(draw(st.lists(st.floats(-10, 10), min_size=math.prod(shape), max_size=math.prod(shape)))).reshape(shape)
            arr = arr.astype(draw(st.sampled_from([np.float32, np.float64, np.float16])))
        kind = draw(st.sampled_from(["numpy", "torch", "list"]))
        return torch.as_tensor(arr.astype(np.int64) if arr.dtype.kind == "u" else arr) if kind == "torch" else (arr.tolist() if kind == "list" else arr)
    shape = draw(st.one_of(st.just(shape), st.lists(st.integers(0, 4), max_size=3).map(tuple)))
    if isinstance(space, gym.spaces.Discrete):
        values = st.one_of(st.integers(-3, int(space.n) + 2), st.integers(0, int(space.n) - 1), st.floats(allow_nan=True))
    else:
        values = st.one_of(st.floats(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3))
    flat = draw(st.lists(values, min_size=math.prod(shape), max_size=math.prod(shape)))
    kind = draw(st.sampled_from(["numpy", "torch", "list", "meta"]))
    if kind == "list":
        return np.asarray(flat, dtype=object).reshape(shape).tolist() if shape else flat
    if kind == "numpy":
        dtype = draw(st.sampled_from(NUMPY_DTYPES))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return np.asarray(flat, dtype=np.float64).reshape(shape).astype(dtype)
            except (ValueError, OverflowError):
                return np.asarray(flat, dtype=object).reshape(shape)
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    base = torch.tensor(flat, dtype=torch.float64).reshape(shape)
    if not dtype.is_floating_point and dtype not in (torch.complex64,):
        base = torch.nan_to_num(base, nan=0.0, posinf=0.0, neginf=0.0)  # a NaN cannot be cast to an integer
    tensor = base.to(dtype)
    return tensor.to("meta") if kind == "meta" else tensor


def _valid_action(actions, num_envs: int, space: gym.Space, cast: bool = False) -> bool:
    """The oracle: a batch the env must accept (anything else must be refused); ``cast``: the env
    converts Box actions to the space's dtype first (the generic backend), so they must be finite there."""
    if isinstance(actions, torch.Tensor):
        if actions.device.type != "cpu":
            return False
        arr = actions.to(torch.float64).numpy() if actions.dtype not in (torch.complex64, torch.bool) else None
        kind = "f" if actions.is_floating_point() else ("b" if actions.dtype == torch.bool else ("c" if actions.is_complex() else "i"))
    else:
        try:
            raw = np.asarray(actions)
        except ValueError:  # a ragged list
            return False
        if raw.dtype.kind not in "iuf":
            return False
        arr, kind = raw.astype(np.float64), raw.dtype.kind
    if arr is None or arr.shape != (num_envs, *space.shape):
        return False
    if isinstance(space, gym.spaces.Discrete):
        return kind in "iu" and bool(((arr >= space.start) & (arr < space.start + space.n)).all())
    with np.errstate(over="ignore"):
        arr = arr.astype(space.dtype) if cast else arr
    return kind in "iuf" and bool(np.isfinite(arr).all())


def _check_step(env, actions, num_envs: int, space: gym.Space, cast: bool = False) -> None:
    valid = _valid_action(actions, num_envs, space, cast)
    try:
        obs, reward, terminated, truncated, _ = env.step(actions)
    except (ValueError, TypeError) as err:
        event("refused")
        assert not valid, f"a valid action batch was refused: {err}"
        assert "action" in str(err), f"the error does not name the actions: {err}"
        return
    event("accepted")
    assert valid, f"an invalid action batch was accepted: {actions!r}"
    assert torch.isfinite(torch.as_tensor(reward)).all() and torch.as_tensor(obs).isfinite().all()


@pytest.mark.parametrize("family_id", FAMILY_IDS)
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_native_vector_env_action_batches(family_id, data):
    family = fedrl_envs.FAMILIES[family_id]
    env = FamilyVectorEnv(family, family.train_tasks[:2], n_envs=2, seed=0)
    env.reset()
    actions = data.draw(action_batches(env.num_envs, env.single_action_space))
    _check_step(env, actions, env.num_envs, env.single_action_space)
    # Whatever happened, the env still steps correctly afterwards (a refused batch changed nothing).
    env.step(env.action_space.sample())


@pytest.mark.parametrize("family_id", ["fedrl/GridWorld-v0", "fedrl/Pendulum-v0", "CartPole-v1", "Pendulum-v1"])
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_federated_vec_env_action_batches(family_id, data):
    """Both backends: the native one (fedrl families) and the generic one (Gymnasium ids)."""
    native = family_id.startswith("fedrl/")
    env = FederatedVecEnv(family_id, 2, agents=[0, 1], seed=0) if native else FederatedVecEnv(family_id, 2, agent_kwargs=[{}, {}], seed=0)
    env.reset()
    before = env.state.clone() if native else None
    actions = data.draw(action_batches(env.num_envs, env.single_action_space))
    valid = _valid_action(actions, env.num_envs, env.single_action_space, cast=not native)
    _check_step(env, actions, env.num_envs, env.single_action_space, cast=not native)
    if not valid and before is not None:
        assert torch.equal(env.state, before), "a refused action batch changed the state"


# --- FederatedVecEnv constructor arguments --------------------------------------------------------
FED_ARGS = ["n_envs", "agents", "agent_kwargs", "device", "seed", "autoreset", "env_kwargs", "stream_ids", "vectorization_mode"]


@st.composite
def fed_env_arguments(draw):
    env_id = draw(st.sampled_from(["fedrl/GridWorld-v0", "fedrl/CartPole-v0", "fedrl/ArcNavigation-v0"]))
    kwargs = {"n_envs": draw(st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(-1, 3), ANY_VALUE))}
    for name in draw(st.lists(st.sampled_from(FED_ARGS[1:]), unique=True, max_size=3)):
        if name == "agents":
            kwargs[name] = draw(st.one_of(st.lists(st.integers(-2, 10), max_size=4), ANY_VALUE))
        elif name == "agent_kwargs":
            kwargs[name] = draw(st.one_of(st.lists(st.dictionaries(st.sampled_from(["goal", "horizon", "agent", "nope"]), ANY_VALUE,
                                                                    max_size=2), max_size=3), ANY_VALUE))
        elif name == "device":
            kwargs[name] = draw(st.sampled_from(["cpu", "cuda:7", "tpu", "meta", 3, None, torch.device("cpu")]))
        elif name == "env_kwargs":
            kwargs[name] = draw(st.one_of(st.dictionaries(st.sampled_from(["horizon", "size", "nope"]), ANY_VALUE, max_size=2), ANY_VALUE))
        elif name == "stream_ids":
            kwargs[name] = draw(st.one_of(st.lists(st.integers(-2, 3), max_size=9), ANY_VALUE))
        elif name == "vectorization_mode":
            kwargs[name] = draw(st.sampled_from([None, "sync", "async", "vector_entry_point", 1]))
        else:
            kwargs[name] = draw(ANY_VALUE)
    return env_id, kwargs


@FUZZ
@given(fed_env_arguments())
def test_federated_vec_env_arguments(case):
    env_id, kwargs = case
    try:
        env = FederatedVecEnv(env_id, **kwargs)
    except (ValueError, TypeError) as err:
        event("refused")
        assert _named(err, [*kwargs, "goal", "horizon", "size", "agent"]), f"{env_id} {kwargs!r}: {err}"
        return
    event("accepted")
    try:
        obs, _ = env.reset()
        assert obs.shape[0] == env.num_envs == env.n_agents * env.n_envs and torch.isfinite(obs.double()).all()
        env.step(env.action_space.sample())
    finally:
        env.close()


# --- algorithm hyperparameters --------------------------------------------------------------------
SMALL = st.one_of(st.integers(-2, 4), st.floats(allow_nan=True, allow_infinity=True), st.floats(-1, 2), st.none(), st.booleans(),
                  st.text(max_size=2), st.sampled_from(["auto", "auto_bound", "gpomdp", "reinforce", "loo", "mean", "sgd", "adam",
                                                        "exact", "first_order"]))
#: the hyperparameters fuzzed per class, and small valid defaults that keep a round cheap
ALGORITHMS = {
    FedAvgPG: (["step_size", "local_steps", "n_trajectories", "estimator", "baseline", "server_optimizer", "server_step_size",
                "alpha", "gamma", "agents_per_round", "control_variates", "eval_adapt_trajectories"], dict(local_steps=1, n_trajectories=3)),
    PerFedAvgPG: (["alpha", "step_size", "local_steps", "m_in", "m_h", "m_out", "variant", "gamma", "agents_per_round", "control_variates",
                   "hvp_chunk"],
                  dict(local_steps=1, m_in=2, m_h=2, m_out=2)),
    IndependentPG: (["step_size", "n_trajectories", "local_steps", "gamma"], dict(n_trajectories=3)),
    MFPO: (["step_size", "momentum", "local_steps", "n_trajectories", "initial_trajectories", "estimator", "baseline",
            "max_importance_weight", "self_normalize_weights", "gamma"], dict(local_steps=2, n_trajectories=3)),
    FedPGBR: (["step_size", "batch_range", "inner_batch_size", "sigma", "delta", "max_byzantine_fraction", "estimator", "baseline",
               "max_importance_weight", "use_filter", "server_task", "attack", "byzantine_agents", "gamma", "server_optimizer"],
              dict(batch_range=(2, 3), inner_batch_size=2)),
}


@st.composite
def hyperparameters(draw):
    cls = draw(st.sampled_from(list(ALGORITHMS)))
    names, base = ALGORITHMS[cls]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, min_size=1, max_size=2))
    kwargs = dict(base)
    for name in chosen:
        if name == "batch_range":
            kwargs[name] = draw(st.one_of(st.tuples(st.integers(-1, 4), st.integers(-1, 4)), SMALL))
        elif name == "byzantine_agents":
            kwargs[name] = draw(st.one_of(st.lists(st.integers(-2, 9), max_size=3), SMALL))
        elif name == "attack":
            kwargs[name] = draw(st.one_of(st.sampled_from(["sign_flip", "fedscspg", "huge_spread", "none", "nope"]), SMALL))
        else:
            kwargs[name] = draw(SMALL)
    return cls, chosen, kwargs


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(hyperparameters())
def test_algorithm_hyperparameters(case):
    cls, chosen, kwargs = case
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. RejectedUpdateWarning of a legal but huge step size
            model = cls("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu", **kwargs)
            model.learn(total_rounds=1)
    except (ValueError, TypeError) as err:
        event("refused")
        assert _named(err, chosen), f"{cls.__name__}({kwargs!r}): {err}"
        return
    except FloatingPointError as err:  # legal but diverging settings (e.g. a huge step size) stop with this error
        event("diverged")
        assert "round 1" in str(err)
        return
    event("accepted")
    assert torch.isfinite(model.theta).all()
