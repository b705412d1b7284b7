"""Run a fedrl federation on Flower's simulation engine (Ray backend), one agent per SuperNode."""

from __future__ import annotations

import copy
import logging
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedrl_algos.common.round_protocol import AgentWorker, protocol_for
from fedrl_algos.flower.client_app import make_client_app
from fedrl_algos.flower.server_app import _check_count, run_federation
from fedrl_algos.flower.task import import_env_modules, load_model, model_to_bytes

__all__ = ["simulate", "default_backend_config"]


def default_backend_config(num_cpus: int | None = None) -> dict[str, Any]:
    """Ray settings for a simulation on this machine: one CPU per ClientApp, no dashboard.

    :param num_cpus: CPUs Ray may use (default: all of this machine's)
    """
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": int(num_cpus or os.cpu_count() or 1), "include_dashboard": False, "logging_level": logging.ERROR,
                      "log_to_driver": False},
    }


def simulate(
    model: Any,
    num_rounds: int,
    num_supernodes: int | None = None,
    backend_config: dict[str, Any] | None = None,
    round_timeout: float = 600.0,
    min_train_nodes: int | None = None,
    checkpoint_path: str | pathlib.Path | None = None,
    eval_trajectories: int = 0,
    callback: Any = None,
    progress_bar: bool = False,
    client_mods: Sequence[Callable] | None = None,
    verbose: bool = False,
    round_stats: list[dict[str, Any]] | None = None,
    strategy_kwargs: dict[str, Any] | None = None,
    fraction_train: float | None = None,
    env_modules: Sequence[str] | None = None,
) -> Any:
    """Train ``model`` for ``num_rounds`` rounds through Flower's simulation engine and return it.

    Every agent runs as a ClientApp on its own virtual SuperNode (``partition-id`` = agent index);
    the ServerApp runs the algorithm's Strategy with the model as its state. With the same seed the
    result equals ``model.learn(total_rounds=num_rounds)`` in one process, bit for bit on CPU.

    >>> from fedrl_algos import PerFedAvgPG
    >>> from fedrl_algos.flower import simulate
    >>> model = PerFedAvgPG("TabularPolicy", "fedrl/GridWorld-v0", seed=0, device="cpu")
    >>> model = simulate(model, num_rounds=2)  # doctest: +SKIP

    :param model: a model whose class declares a ``round_protocol`` (PerFedAvgPG, FedAvgPG,
        IndependentPG, MFPO, FedPGBR, their subclasses, a new algorithm; of a fedrl task family, or
        of a Gymnasium id with sync vectorization); it is trained in place and returned,
        except when ``checkpoint_path`` holds a checkpoint: then the loaded checkpoint is trained on
    :param num_rounds: communication rounds (in total, when resuming a checkpoint)
    :param num_supernodes: virtual SuperNodes; must equal the model's agents (default)
    :param backend_config: Ray backend settings (default: :func:`default_backend_config`)
    :param round_timeout: seconds the server waits for a round's replies
    :param min_train_nodes: valid replies a round needs (else it is skipped); default 1
    :param checkpoint_path: the server's model is saved here after every round; an existing file is resumed
    :param eval_trajectories: rollouts per agent of a client-side evaluation after each round (0: none)
    :param callback: SB3 callback(s), called once per round
    :param progress_bar: show a progress bar
    :param client_mods: Flower client mods around every ClientApp call
    :param verbose: Flower's and Ray's own logs
    :param round_stats: a list receiving one dict per round (see :func:`~fedrl_algos.flower.run_federation`)
    :param strategy_kwargs: more keyword arguments of the Strategy (FedPG-BR: ``aggregator``,
        ``num_malicious_nodes``; see :class:`~fedrl_algos.flower.FederationStrategy`)
    :param fraction_train: Flower's client sampling: ``max(int(fraction_train · n), min_train_nodes)``
        agents per round (sets the model's ``agents_per_round``; see :func:`~fedrl_algos.flower.run_federation`)
    :param env_modules: modules that register environments of the user's own (``gymnasium.register``
        at import): every ClientApp imports them, as the caller's script did, before it builds its
        agent (they must be importable there: the same ``PYTHONPATH``)
    :return: the trained model
    """
    from flwr.simulation import run_simulation

    protocol_for(model)
    num_rounds = _check_count("num_rounds", num_rounds, 1)
    n_agents = int(model.n_agents)
    if num_supernodes is None:
        num_supernodes = n_agents
    num_supernodes = _check_count("num_supernodes", num_supernodes, 1)
    if num_supernodes != n_agents:
        raise ValueError(f"num_supernodes must equal the model's agents (one agent per SuperNode): {n_agents}, got {num_supernodes}")
    if backend_config is not None and not isinstance(backend_config, dict):
        raise TypeError(f"backend_config must be a dict, got {type(backend_config).__name__}")
    import_env_modules(env_modules)
    model_bytes = model_to_bytes(model)
    # What every ClientApp does first, done here before Ray starts: a model the clients cannot load,
    # or an agent they cannot build (an option Flower does not support), fails now with its reason
    # instead of in every SuperNode's traceback.
    AgentWorker(load_model(model_bytes, algorithm=type(model)), 0)
    outcome: dict[str, Any] = {}

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            outcome["model"] = run_federation(
                model, grid, num_rounds, round_timeout=round_timeout, min_train_nodes=min_train_nodes,
                checkpoint_path=checkpoint_path, eval_trajectories=eval_trajectories, callback=callback, progress_bar=progress_bar,
                round_stats=round_stats, strategy_kwargs=strategy_kwargs, fraction_train=fraction_train,
            )
        except BaseException as err:  # re-raised in the caller's thread below
            outcome["error"] = err

    client = make_client_app(model_bytes, mods=client_mods, algorithm=type(model), env_modules=list(env_modules or []))
    config = copy.deepcopy(backend_config) if backend_config is not None else default_backend_config()
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if not verbose:
        flwr_logger.setLevel(logging.WARNING)
    try:
        run_simulation(server, client, num_supernodes=num_supernodes, backend_config=config, verbose_logging=verbose)
    finally:
        flwr_logger.setLevel(level)
    if "error" in outcome:
        raise outcome["error"]
    if "model" not in outcome:
        raise RuntimeError("the Flower simulation ended without running the ServerApp to completion")
    return outcome["model"]
