"""``learn`` set-up for algorithms that do not own one SB3 ``VecEnv``, and their progress bar."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from stable_baselines3.common import utils
from stable_baselines3.common.callbacks import BaseCallback, ProgressBarCallback
from stable_baselines3.common.logger import HumanOutputFormat, Logger
from stable_baselines3.common.type_aliases import MaybeCallback

__all__ = ["EnvFreeLearnMixin", "FederatedProgressBar", "make_logger"]


def make_logger(verbose: int, tensorboard_log: str | None, tb_log_name: str, reset_num_timesteps: bool) -> Logger:
    """SB3's default logger of ``learn``, without the empty ``SB3-<time>`` folder it makes in the
    system temp directory on every call when nothing is written to files.

    :param verbose: 0 silent, 1 the logger's records on stdout
    :param tensorboard_log: TensorBoard directory (then SB3's ``configure_logger`` as usual)
    :param tb_log_name: TensorBoard run name
    :param reset_num_timesteps: start a new TensorBoard run (``False``: continue the last one)
    """
    if tensorboard_log is not None:
        return utils.configure_logger(verbose, tensorboard_log, tb_log_name, reset_num_timesteps)
    return Logger(folder=None, output_formats=[HumanOutputFormat(sys.stdout)] if verbose >= 1 else [])


class FederatedProgressBar(ProgressBarCallback):
    """SB3's progress bar, advanced by the environment steps a round actually consumed."""

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._start = self.model.num_timesteps

    def _on_step(self) -> bool:
        self.pbar.update(self.model.num_timesteps - self._start - self.pbar.n)
        return True


def check_optional_dict(name: str, value: Any) -> Mapping[str, Any] | None:
    """``value`` if it is ``None`` or a mapping (a ``dict``) of keyword arguments (``policy_kwargs``,
    ``algorithm_kwargs``, ...); ``TypeError`` naming ``name`` otherwise."""
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of keyword arguments or None, got {type(value).__name__} {value!r}")
    return value


def check_log_dir(name: str, value: Any) -> Any:
    """``value`` if it is ``None``, a ``str`` or an ``os.PathLike`` (a directory to log into);
    ``TypeError`` naming ``name`` otherwise, before ``learn`` would fail on it."""
    if value is not None and not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a directory path (str or os.PathLike) or None, got {type(value).__name__} {value!r}")
    return value


def check_callback(callback: Any, name: str = "callback") -> None:
    """``TypeError`` naming ``name`` unless ``callback`` is what SB3's ``learn`` takes: ``None``, a
    ``BaseCallback``, a function ``(locals, globals) -> bool``, or a list of ``BaseCallback``."""
    if isinstance(callback, list):
        bad = [item for item in callback if not isinstance(item, BaseCallback)]
        if bad:
            raise TypeError(f"{name}: a list of callbacks must hold SB3 BaseCallback objects only (a function can be "
                            f"wrapped in ConvertCallback), got {type(bad[0]).__name__} {bad[0]!r}")
    elif callback is not None and not isinstance(callback, BaseCallback) and not callable(callback):
        raise TypeError(f"{name} must be an SB3 BaseCallback, a function (locals, globals) -> bool, a list of "
                        f"BaseCallback, or None; got {type(callback).__name__} {callback!r}")


class EnvFreeLearnMixin:
    """``learn`` set-up for SB3 algorithms that do not own one SB3 ``VecEnv``.

    SB3's ``_setup_learn`` resets ``self.env``; a federation samples through its own samplers (or
    its agents' own SB3 models), so this version keeps only the counters, the logger and the
    callbacks, and swaps SB3's progress bar for one advanced by the steps actually consumed.
    """

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        check_callback(callback)  # before anything changes: a bad callback must not cost a round
        self.start_time = time.time_ns()
        if reset_num_timesteps:
            self.num_timesteps = 0
            self._episode_num = 0
        else:
            total_timesteps += self.num_timesteps
        self._total_timesteps = total_timesteps
        self._num_timesteps_at_start = self.num_timesteps
        if not self._custom_logger:
            self._logger = make_logger(self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps)
        return total_timesteps, self._init_callback(callback, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        if progress_bar:
            callback = [cb for cb in ([callback] if not isinstance(callback, list) else callback) if cb is not None]
            callback = [*callback, FederatedProgressBar()]
        return super()._init_callback(callback, progress_bar=False)
