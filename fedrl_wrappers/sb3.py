"""Stable-Baselines3 view of a federation: ``FederatedVecEnv.to_sb3(agent=i)``.

The adapter knows Gymnasium's vector-env contract, not the federation: like a Gymnasium wrapper, it
takes any ``gymnasium.vector.VectorEnv`` (a federation is one) and imports nothing of
:mod:`fedrl_wrappers.federated`, not even for type hints; the dependency runs one way only
(``FederatedVecEnv.to_sb3`` imports this module when called, so that importing the federation does
not import Stable-Baselines3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn

__all__ = ["SB3VecEnv"]


def _to_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class SB3VecEnv(VecEnv):
    """A :class:`~fedrl_wrappers.federated.FederatedVecEnv` (normally one agent's) as a Stable-Baselines3 ``VecEnv``.

    Observations, rewards and dones are NumPy arrays; actions are NumPy arrays. SB3's autoreset
    semantics hold: when an episode ends, ``step_wait`` returns the first observation of the next
    episode, ``infos[j]["terminal_observation"]`` holds the last observation of the finished one,
    and ``infos[j]["TimeLimit.truncated"]`` says whether it ended by the time limit only.

    The native backend has no per-environment objects: ``get_attr`` and ``env_method`` act on the
    federation itself (one value, repeated for each requested index) and ``set_attr`` must target
    every index. The generic backend forwards them to the Gymnasium sub-environments.

    The adapter checks the vector-env contract (a Gymnasium ``VectorEnv`` with ``SAME_STEP``
    autoreset), not the class, so a ``fedrl_envs.FamilyVectorEnv`` fits as well; any vector env
    without ``agent_envs`` is treated like the native backend by the attribute methods.

    :param venv: a federation with ``autoreset=True`` (see :meth:`~fedrl_wrappers.federated.FederatedVecEnv.to_sb3`), or
        another vector env whose ``metadata["autoreset_mode"]`` is ``SAME_STEP``
    """

    def __init__(self, venv: VectorEnv) -> None:
        if not isinstance(venv, VectorEnv):
            raise TypeError(f"venv must be a FederatedVecEnv (a gymnasium VectorEnv), got {type(venv).__name__}")
        if venv.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                "venv must have autoreset=True (metadata['autoreset_mode'] SAME_STEP): "
                "SB3 expects its vector envs to reset themselves"
            )
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self.metadata = venv.metadata
        self._actions: Any = None

    # --- stepping ------------------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        seed = self._seeds[0]
        obs, _ = self.venv.reset(seed=seed)
        self._reset_seeds()
        self._reset_options()
        return _to_numpy(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        actions, self._actions = self._actions, None
        if actions is None:
            raise RuntimeError("step_async(actions) must be called before step_wait()")
        if isinstance(self.action_space, gym.spaces.Discrete):
            actions = np.asarray(actions).reshape(self.num_envs)
        obs, reward, terminated, truncated, info = self.venv.step(actions)
        obs_np, term_np, trunc_np = _to_numpy(obs), _to_numpy(terminated), _to_numpy(truncated)
        dones = term_np | trunc_np
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": bool(trunc_np[j] and not term_np[j])} for j in range(self.num_envs)]
        done_rows = np.flatnonzero(dones)
        if done_rows.size:
            final = _to_numpy(info["final_obs"])
            for j in done_rows:
                infos[j]["terminal_observation"] = final[j]
        self._add_extra_infos(infos, info)
        return obs_np, _to_numpy(reward).astype(np.float32, copy=False), dones, infos

    @staticmethod
    def _add_extra_infos(infos: list[dict[str, Any]], info: dict[str, Any]) -> None:
        skip = {"final_obs", "final_info"}
        for key, value in info.items():
            if key.startswith("_") or key in skip:
                continue
            mask = _to_numpy(info.get(f"_{key}", np.ones(len(infos), dtype=bool)))
            for j in np.flatnonzero(mask):
                infos[j][key] = value[j] if not isinstance(value, dict) else {k: v[j] for k, v in value.items() if not k.startswith("_")}
        final_info = info.get("final_info")
        if final_info:
            # Generic backend: the finished episodes' own infos (e.g. Monitor's "episode").
            for key, value in final_info.items():
                if key.startswith("_"):
                    continue
                mask = _to_numpy(final_info.get(f"_{key}", np.ones(len(infos), dtype=bool)))
                for j in np.flatnonzero(mask):
                    infos[j].setdefault(key, value[j])

    def close(self) -> None:
        self.venv.close()

    # --- attributes and methods of the sub-environments ----------------------------------------
    def _indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, int | np.integer):
            return [int(indices)]
        return [int(i) for i in indices]

    def _sub_envs(self, indices: VecEnvIndices) -> list[gym.Env] | None:
        """The Gymnasium sub-environments (generic sync backend), or ``None`` (native backend)."""
        agent_envs = getattr(self.venv, "agent_envs", None)
        if agent_envs is None:
            return None
        flat: list[gym.Env] = []
        for venv in agent_envs:
            if not hasattr(venv, "envs"):
                raise NotImplementedError("attribute access to async sub-environments is not supported; use 'sync'")
            flat.extend(venv.envs)
        return [flat[i] for i in self._indices(indices)]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        envs = self._sub_envs(indices)
        if envs is None:
            return [getattr(self.venv, attr_name)] * len(self._indices(indices))
        return [env.get_wrapper_attr(attr_name) for env in envs]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        envs = self._sub_envs(indices)
        if envs is None:
            if sorted(self._indices(indices)) != list(range(self.num_envs)):
                raise ValueError(
                    "indices must cover every environment: the native backend is one batched program whose "
                    "attributes are shared by all its environments"
                )
            setattr(self.venv, attr_name, value)
            return
        for env in envs:
            setattr(env, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
        envs = self._sub_envs(indices)
        if envs is None:
            result = getattr(self.venv, method_name)(*method_args, **method_kwargs)
            return [result] * len(self._indices(indices))
        return [env.get_wrapper_attr(method_name)(*method_args, **method_kwargs) for env in envs]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        envs = self._sub_envs(indices)
        if envs is None:
            return [False] * len(self._indices(indices))
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(env, wrapper_class) for env in envs]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs
