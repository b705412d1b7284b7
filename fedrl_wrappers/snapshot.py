"""Mid-episode snapshots of environments, as plain data, for a saved run that resumes bitwise.

A Gymnasium environment's state is whatever its class holds (a MuJoCo simulation, a Box2D world, a
user's attributes); there is no API to read or write it. What does determine it, for an environment
whose only randomness is ``np_random``, is where its episode started and what it was told since:
its generator state before the episode's ``reset``, that reset's arguments, and the actions of
every step after. :class:`EpisodeRecorder` keeps the first two (at each reset), the autoresetting
:class:`~fedrl_wrappers.FederatedVecEnv` the actions (one copy of each step's batch), and
:meth:`EpisodeRecorder.replay` puts a freshly made environment into the same mid-episode state by
resetting and stepping it again. Episodes are bounded by the env's time limit, so is a record.

Tensors travel as :func:`tensor_data` (exact: every float32, float64 and int64 value survives JSON).
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch

__all__ = ["EpisodeRecorder", "tensor_data", "tensor_from_data", "generator_from_state"]


def tensor_data(x: torch.Tensor) -> dict[str, Any]:
    """A tensor as JSON data: dtype, shape and its values (exact for floats up to 64 bits and integers)."""
    x = x.detach().cpu()
    return {"dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape), "values": x.reshape(-1).tolist()}


def tensor_from_data(data: dict[str, Any], device: torch.device | str = "cpu") -> torch.Tensor:
    """The tensor :func:`tensor_data` described.

    :raise ValueError: for anything else
    """
    try:
        dtype = getattr(torch, str(data["dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise TypeError(data["dtype"])
        return torch.tensor(data["values"], dtype=dtype).reshape(data["shape"]).to(device)
    except (KeyError, TypeError, AttributeError, RuntimeError) as err:
        raise ValueError(f"not a tensor's data: {str(data)[:80]} ({err})") from None


def generator_from_state(state: dict[str, Any]) -> np.random.Generator:
    """A NumPy generator in the bit-generator state ``state`` (``generator.bit_generator.state``).

    :raise ValueError: when ``state`` is not a NumPy bit generator's state
    """
    bit_generator = getattr(np.random, str(state.get("bit_generator", "")), None) if isinstance(state, dict) else None
    if not (isinstance(bit_generator, type) and issubclass(bit_generator, np.random.BitGenerator)):
        raise ValueError(f"not a NumPy bit generator state: {str(state)[:80]}")
    generator = np.random.Generator(bit_generator())
    generator.bit_generator.state = state
    return generator


def _generator_state(env: gym.Env) -> dict[str, Any] | None:
    # The unwrapped env's generator, read without creating one (np_random would seed a fresh one).
    generator = getattr(env.unwrapped, "_np_random", None)
    return None if generator is None else copy.deepcopy(generator.bit_generator.state)


class EpisodeRecorder(gym.Wrapper):
    """Records how the current episode began, so that :meth:`replay` can rebuild it.

    The outermost wrapper of each sub-environment of an autoresetting generic
    :class:`~fedrl_wrappers.FederatedVecEnv` (so a replay's steps pass the time limit too). It
    overrides only ``reset`` (an autoreset happens inside the vector env's step, where nothing
    outside sees the generator before it); the actions since are logged once per vector step by the
    federated env, not here per sub-environment and step.

    :param env: the environment
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._start: dict[str, Any] | None = None
        self._reset_kwargs: dict[str, Any] = {"seed": None, "options": None}
        #: a record waiting for :meth:`apply_replay` (set through the vector env's ``set_attr``)
        self.pending_replay: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._start = _generator_state(self.env)
        self._reset_kwargs = {"seed": seed, "options": options}
        return self.env.reset(seed=seed, options=options)

    @property
    def reset_record(self) -> dict[str, Any]:
        """How the current episode began, as plain data: the generator before its reset, the reset's
        arguments, and the generator now (the actions since are the vector env's to add)."""
        return {"start": self._start, "reset": dict(self._reset_kwargs), "now": _generator_state(self.env)}

    def replay(self, record: dict[str, Any]) -> None:
        """Put this (freshly made) environment into the recorded mid-episode state: reset it as the
        episode was reset, from the same generator, and step the same actions.

        :raise ValueError: when the record's reset options are not plain data
        """
        unwrapped = self.env.unwrapped
        unwrapped._np_random = None if record["start"] is None else generator_from_state(record["start"])
        self.reset(**record["reset"])
        dtype = np.dtype(record["action_dtype"])
        for action in record["actions"]:
            self.env.step(np.asarray(action, dtype=dtype))
        if record["now"] is not None:
            unwrapped._np_random = generator_from_state(record["now"])

    def apply_replay(self) -> None:
        """:meth:`replay` of :attr:`pending_replay` (how a vector env replays each sub-env its own record)."""
        record, self.pending_replay = self.pending_replay, None
        if record is not None:
            self.replay(record)
