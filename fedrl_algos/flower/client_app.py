"""The ClientApp: one fedrl agent per SuperNode.

The SuperNode's node config names its agent (``partition-id``, Flower's convention, or ``agent``).
A ``train`` message carries the server's arrays and config; the ClientApp runs its algorithm's agent
side (:meth:`~fedrl_algos.common.round_protocol.RoundProtocol.agent_round`, the round its class's ``round_protocol`` declares) on that agent's slice of the
federation and replies with arrays and metrics (``num-trajectories``, returns). What must outlive a
round on the client (MFPO's θ^(t−1)) is kept in ``context.state``.

``app`` is the ClientApp of a Flower App directory (``fedrl flower app``): it reads the model file
named by the run config's ``model-path``. :func:`make_client_app` builds one around a model's bytes
(what :func:`~fedrl_algos.flower.simulate` uses).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedrl_algos.common.round_protocol import protocol_for
from fedrl_algos.flower.task import agent_worker, import_env_modules

__all__ = ["app", "make_client_app", "agent_of", "STATE_KEY"]

#: the ``context.state`` record holding the agent's state between rounds
STATE_KEY = "fedrl-agent-state"

ModelSource = Callable[[Context], "bytes | str | pathlib.Path"]


def agent_of(context: Context) -> int:
    """The agent index of this SuperNode: node config ``agent`` or ``partition-id``."""
    config = context.node_config
    for key in ("agent", "partition-id"):
        if key in config:
            return int(config[key])
    raise ValueError("the SuperNode's node config must name its agent: --node-config 'partition-id=<i>' (or agent=<i>)")


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def _array_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})


def _load_state(context: Context) -> dict[str, Any]:
    return _arrays(context.state[STATE_KEY]) if STATE_KEY in context.state else {}


def _save_state(context: Context, state: dict[str, Any]) -> None:
    if state:
        context.state[STATE_KEY] = _array_record({k: np.asarray(v) for k, v in state.items()})


def make_client_app(
    source: bytes | str | pathlib.Path | ModelSource, mods: Sequence[Callable] | None = None, algorithm: type | None = None,
    env_modules: Sequence[str] | None = None,
) -> ClientApp:
    """A ClientApp for the model in ``source``.

    :param source: the model file's bytes or path, or a function of the ``Context`` returning one
    :param mods: Flower client mods wrapped around every call (e.g. for fault injection in tests)
    :param algorithm: the model's class (default: the class that saved the file, among those defined
        in the client's process); :func:`~fedrl_algos.flower.simulate` passes it, so that a class
        defined in the caller's script or test travels to the simulation's workers with the app
    :param env_modules: modules that register the user's environments, imported before the model
        is loaded (and the run config's ``env-modules``, comma-separated, in a deployment)
    """
    resolve: ModelSource = source if callable(source) else (lambda context: source)

    def worker_of(context: Context) -> Any:
        import_env_modules(env_modules)
        import_env_modules([m for m in str(context.run_config.get("env-modules", "")).split(",") if m])
        return agent_worker(resolve(context), agent_of(context), algorithm)

    app = ClientApp(mods=list(mods or []))

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Which agent this SuperNode runs."""
        return Message(RecordDict({"metrics": MetricRecord({"agent": agent_of(context)})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        """The agent's side of one round."""
        worker = worker_of(context)
        protocol = protocol_for(worker.model)
        config = dict(msg.content["config"]) if "config" in msg.content else {}
        state = _load_state(context)
        reply = protocol.agent_round(worker, _arrays(msg.content["arrays"]), config, state)
        _save_state(context, state)
        metrics = MetricRecord({**reply.metrics, "agent": worker.agent})
        return Message(RecordDict({"arrays": _array_record(reply.arrays), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        """Monte Carlo discounted return of the server's θ on this agent's task (evaluation streams)."""
        worker = worker_of(context)
        config = dict(msg.content["config"]) if "config" in msg.content else {}
        theta = torch.as_tensor(msg.content["arrays"]["theta"].numpy()).reshape(1, -1)
        n = int(config.get("num-trajectories", 32))
        value = float(worker.federation.evaluate(theta, n).reshape(-1)[0])
        return Message(RecordDict({"metrics": MetricRecord({"return": value, "num-trajectories": n, "agent": worker.agent})}), reply_to=msg)

    return app


def _model_path(context: Context) -> pathlib.Path:
    if "model-path" not in context.run_config:
        raise ValueError("run config must set model-path (the fedrl model file the federation trains)")
    return pathlib.Path(str(context.run_config["model-path"]))


#: the ClientApp of a Flower App directory (``flwr run``): the model file is the run config's ``model-path``
app = make_client_app(_model_path)
