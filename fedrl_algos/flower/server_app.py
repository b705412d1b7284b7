"""The ServerApp and its Strategy: each algorithm's server side on Flower.

:class:`FederationStrategy` is a Flower :class:`~flwr.serverapp.strategy.Strategy` around one fedrl
model: ``configure_train`` sends this round's agents the server's arrays (and their stream
positions), ``aggregate_train`` checks the replies and runs the algorithm's server side on the
model. What both sides do is the model's class's ``round_protocol``
(:class:`~fedrl_algos.common.round_protocol.RoundProtocol`), so one Strategy serves every algorithm
that declares one, a user's subclass or a new algorithm included.

:func:`run_federation` trains a model over a :class:`~flwr.serverapp.Grid` through the model's own
``learn`` loop (SB3 logger, callbacks, progress bar, the same bookkeeping as in one process), with a
checkpoint after every round and resumption from it. ``app`` is the ServerApp of a Flower App
directory (``fedrl flower app``), configured by the run config.
"""

from __future__ import annotations

import logging
import pathlib
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy
from stable_baselines3.common.callbacks import BaseCallback

from fedrl_algos.common.round_protocol import AgentReply, RoundProtocol, RoundReplies, protocol_for
from fedrl_algos.flower.task import import_env_modules, load_model

__all__ = [
    "FederationStrategy",
    "strategy_for",
    "run_federation",
    "discover_agents",
    "RoundCheckpoint",
    "app",
]

logger = logging.getLogger("fedrl.flower")


def _array_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})


def record_bytes(record: ArrayRecord) -> int:
    """Bytes of the arrays of an ArrayRecord (the payload a message carries, without framing)."""
    return int(sum(len(array.data) for array in record.values()))


def _check_count(name: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


class FederationStrategy(Strategy):
    """A Flower Strategy that runs one fedrl model's server side.

    :param model: the server's model (the whole federation); it is updated in place
    :param agent_nodes: the SuperNode of every agent (:func:`discover_agents`)
    :param min_train_nodes: fewer valid replies than this skip the round (the model unchanged);
        ``None``: 1
    :param eval_trajectories: rollouts per agent of the client-side evaluation (0: none)
    :param protocol: the round by halves (default: the one the model's class declares, ``round_protocol``)
    :param aggregator: a Flower strategy's robust aggregation in place of the algorithm's own, for
        algorithms whose protocol accepts one (FedPG-BR: in place of its filter): ``"krum"``,
        ``"multikrum"``, ``"fedmedian"``, ``"fedtrimmedavg"`` (:func:`~fedrl_algos.flower.robust.flower_aggregator`)
    :param num_malicious_nodes: f of (Multi)Krum (default: the agents the protocol assumes faulty,
        FedPG-BR's Byzantine agents)
    """

    def __init__(
        self, model: Any, agent_nodes: dict[int, int], min_train_nodes: int | None = None, eval_trajectories: int = 0,
        protocol: RoundProtocol | None = None, aggregator: str | None = None, num_malicious_nodes: int | None = None,
    ) -> None:
        self.model = model
        if protocol is None:
            options = {}
            if aggregator is not None:
                from fedrl_algos.flower.robust import flower_aggregator

                declared = getattr(type(model), "round_protocol", None)
                faulty = declared.assumed_faulty_agents(model) if declared is not None else 0
                f = faulty if num_malicious_nodes is None else _check_count("num_malicious_nodes", num_malicious_nodes)
                options["aggregate"] = flower_aggregator(aggregator, f)
            protocol = protocol_for(model, **options)
        elif aggregator is not None:
            raise ValueError("give aggregator or protocol, not both (the protocol holds its own aggregation)")
        self.protocol: RoundProtocol = protocol
        n = int(model.n_agents)
        missing = sorted(set(range(n)) - set(agent_nodes))
        if missing:
            raise ValueError(f"agent_nodes must name a SuperNode for every agent; missing agents {missing}")
        self.agent_nodes = dict(agent_nodes)
        self.node_agents = {node: agent for agent, node in self.agent_nodes.items()}
        self.min_train_nodes = 1 if min_train_nodes is None else _check_count("min_train_nodes", min_train_nodes, 1)
        self.eval_trajectories = _check_count("eval_trajectories", eval_trajectories)
        self._asked: list[int] = []
        self._bytes_sent = self._bytes_received = 0
        #: what the last round did: ``skipped``, ``rejected``, ``reasons``, ``replies``, ``failures``
        #: (agent → why), ``bytes_sent``/``bytes_received`` (array payloads of the train messages)
        self.last_round: dict[str, Any] = {}

    def summary(self) -> None:
        logger.info("%s: %s with %d agents, min_train_nodes=%d", type(self).__name__, type(self.model).__name__,
                    self.model.n_agents, self.min_train_nodes)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Messages to this round's agents (``arrays``: ignored, the model is the server's state)."""
        self._asked = self.protocol.participants()
        messages = []
        self._bytes_sent = 0
        for agent in self._asked:
            payload, agent_config = self.protocol.train_message(agent)
            arrays = _array_record(payload)
            self._bytes_sent += record_bytes(arrays)
            record = RecordDict({"arrays": arrays, "config": ConfigRecord({**dict(config), **agent_config, "server-round": server_round})})
            messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=self.agent_nodes[agent]))
        return messages

    def _parse(self, replies: Iterable[Message]) -> RoundReplies:
        got: dict[int, AgentReply] = {}
        failures: dict[int, str] = {}
        self._bytes_received = 0
        for msg in replies:
            agent = self.node_agents.get(msg.metadata.src_node_id)
            if agent is None or agent not in self._asked:
                continue  # a node this round did not ask (or a late reply of an earlier round)
            if msg.has_error():
                failures[agent] = f"client error: {msg.error.reason}"
                continue
            try:
                self._bytes_received += record_bytes(msg.content["arrays"])
                arrays = {name: array.numpy() for name, array in msg.content["arrays"].items()}
                metrics = {k: float(v) for k, v in msg.content["metrics"].items()} if "metrics" in msg.content else {}
                counters = arrays.pop("stream-counters")
                self.protocol.store_counters(agent, counters)
                if "env-state" in arrays:
                    self.protocol.store_env_state(agent, arrays.pop("env-state"))
            except (KeyError, ValueError, TypeError) as err:
                failures[agent] = f"malformed reply: {err}"
                continue
            got[agent] = AgentReply(agent, arrays, metrics)
        for agent in self._asked:
            if agent not in got and agent not in failures:
                failures[agent] = "no reply within the round's timeout"
        return RoundReplies(list(self._asked), got, failures)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies and run the algorithm's server side on the model."""
        parsed = self._parse(replies)
        outcome = self.protocol.server_update(parsed, self.min_train_nodes)
        self.last_round = {**outcome, "replies": len(parsed.replies), "failures": dict(parsed.failures),
                           "bytes_sent": self._bytes_sent, "bytes_received": self._bytes_received}
        trajectories = [r.metrics.get("num-trajectories", 0.0) for r in parsed.replies.values()]
        metrics = MetricRecord({"num-replies": len(parsed.replies), "num-failures": len(parsed.failures),
                                "num-trajectories": float(sum(trajectories)), "skipped": int(bool(outcome["skipped"]))})
        theta = self.model.policy.theta.detach().cpu().numpy()
        return _array_record({"theta": theta}), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Client-side evaluation of the server's θ on every agent (none when ``eval_trajectories`` is 0)."""
        if self.eval_trajectories == 0:
            return []
        theta = self.model.policy.theta.detach().cpu().numpy()
        record = RecordDict({"arrays": _array_record({"theta": theta}),
                             "config": ConfigRecord({"num-trajectories": self.eval_trajectories, "server-round": server_round})})
        return [Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=node) for node in self.agent_nodes.values()]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The agents' mean evaluation return."""
        values = [float(m.content["metrics"]["return"]) for m in replies if not m.has_error()]
        return MetricRecord({"return": float(np.mean(values)), "num-agents": len(values)}) if values else None


def strategy_for(model: Any, agent_nodes: dict[int, int], **kwargs: Any) -> FederationStrategy:
    """The Strategy of ``model``: a :class:`FederationStrategy` running its class's ``round_protocol``.

    :param model: the server's model
    :param agent_nodes: the SuperNode of every agent
    :param kwargs: :class:`FederationStrategy`'s keyword arguments
    """
    return FederationStrategy(model, agent_nodes, **kwargs)


def _apply_fraction_train(model: Any, fraction_train: Any, min_train_nodes: int | None) -> None:
    from fedrl_algos.common.base_class import check_agents_per_round

    if isinstance(fraction_train, bool) or not isinstance(fraction_train, int | float) or not 0.0 < fraction_train <= 1.0:
        raise ValueError(f"fraction_train must be a number in (0, 1], got {fraction_train!r}")
    if "agents_per_round" not in model.__dict__:
        raise ValueError(f"fraction_train needs an algorithm with client sampling (PerFedAvgPG, FedAvgPG), got {type(model).__name__}")
    n = int(model.n_agents)
    r = min(max(int(fraction_train * n), int(min_train_nodes or 1)), n)
    model.agents_per_round = check_agents_per_round(None if r == n else r, n)


def discover_agents(grid: Grid, n_agents: int, timeout: float = 120.0) -> dict[int, int]:
    """Wait for ``n_agents`` SuperNodes and ask each which agent it runs: agent → node id.

    :raise TimeoutError: when fewer SuperNodes connect, or not every agent is found, within ``timeout`` s
    :raise ValueError: when two SuperNodes claim the same agent, or one an agent the model lacks
    """
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < n_agents:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(list(grid.get_node_ids()))} SuperNodes connected within {timeout:.0f} s; the federation has {n_agents} agents")
        time.sleep(0.2)
    agents: dict[int, int] = {}
    while True:
        nodes = [n for n in grid.get_node_ids() if n not in agents.values()]
        queries = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
        for reply in grid.send_and_receive(queries, timeout=max(deadline - time.monotonic(), 1.0)):
            if reply.has_error():
                continue
            agent = int(reply.content["metrics"]["agent"])
            if not 0 <= agent < n_agents:
                raise ValueError(f"SuperNode {reply.metadata.src_node_id} runs agent {agent}; the federation has agents 0..{n_agents - 1}")
            if agent in agents and agents[agent] != reply.metadata.src_node_id:
                raise ValueError(f"two SuperNodes run agent {agent} ({agents[agent]} and {reply.metadata.src_node_id}); give each its own partition-id")
            agents[agent] = reply.metadata.src_node_id
        if len(agents) == n_agents:
            return agents
        if time.monotonic() > deadline:
            raise TimeoutError(f"agents {sorted(set(range(n_agents)) - set(agents))} have no SuperNode after {timeout:.0f} s")
        time.sleep(0.2)


class RoundCheckpoint(BaseCallback):
    """Save the server's model after every round (atomically: a crash leaves the last complete round).

    :param path: the checkpoint file
    """

    def __init__(self, path: str | pathlib.Path) -> None:
        super().__init__()
        self.path = pathlib.Path(path)

    def _on_step(self) -> bool:
        self.model.save(self.path, exclude=["_train_round"])
        return True


def run_federation(
    model: Any,
    grid: Grid,
    num_rounds: int,
    round_timeout: float = 600.0,
    min_train_nodes: int | None = None,
    checkpoint_path: str | pathlib.Path | None = None,
    node_timeout: float = 120.0,
    eval_trajectories: int = 0,
    callback: Any = None,
    progress_bar: bool = False,
    log_interval: int = 1,
    round_stats: list[dict[str, Any]] | None = None,
    strategy_kwargs: dict[str, Any] | None = None,
    fraction_train: float | None = None,
) -> Any:
    """Train ``model`` for ``num_rounds`` rounds over ``grid``; returns the trained model.

    With ``checkpoint_path`` the model is saved after every round, and a checkpoint already there
    (of an interrupted run) is resumed: the rounds it completed count towards ``num_rounds``, and
    the result equals that of an uninterrupted run.

    :param model: the server's model
    :param grid: the Flower Grid
    :param num_rounds: rounds in total (including those of a resumed checkpoint)
    :param round_timeout: seconds to wait for the replies of a round
    :param min_train_nodes: valid replies a round needs (else it is skipped); ``None``: 1
    :param checkpoint_path: file saved after every round and resumed from
    :param node_timeout: seconds to wait for the SuperNodes at the start
    :param eval_trajectories: rollouts per agent of a client-side evaluation after each round (0: none)
    :param callback: SB3 callback(s) of ``learn``
    :param progress_bar: show ``learn``'s progress bar
    :param log_interval: rounds between logger dumps
    :param round_stats: a list that receives one dict per round: the Strategy's ``last_round``
        (replies, failures, bytes sent and received) and ``seconds`` (wall time of the round)
    :param strategy_kwargs: more keyword arguments of the algorithm's Strategy (e.g. FedPG-BR's ``aggregator``)
    :param fraction_train: Flower's client sampling (Per-FedAvg-PG and FedAvg-PG): each round samples
        ``max(int(fraction_train · n), min_train_nodes)`` agents, which sets the model's
        ``agents_per_round`` (so one process trained with that ``agents_per_round`` gives the same θ);
        ``None``: the model's own ``agents_per_round``
    """
    num_rounds = _check_count("num_rounds", num_rounds)
    if fraction_train is not None:
        _apply_fraction_train(model, fraction_train, min_train_nodes)
    if checkpoint_path is not None and pathlib.Path(checkpoint_path).is_file():
        resumed = load_model(checkpoint_path, device=str(model.device))
        if type(resumed) is not type(model):
            raise ValueError(f"checkpoint_path holds a {type(resumed).__name__}, not a {type(model).__name__}")
        logger.info("resuming from %s after round %d", checkpoint_path, resumed.rounds_done)
        model = resumed
        model.__dict__.pop("_flower_prev_from_agent", None)  # a new session: agents' own state is not trusted
    rounds_left = num_rounds - int(model.rounds_done)
    if rounds_left <= 0:
        return model
    agent_nodes = discover_agents(grid, int(model.n_agents), node_timeout)
    strategy = strategy_for(model, agent_nodes, min_train_nodes=min_train_nodes, eval_trajectories=eval_trajectories, **(strategy_kwargs or {}))
    strategy.summary()

    def flower_round() -> None:
        started = time.perf_counter()
        server_round = int(model.rounds_done) + 1
        replies = grid.send_and_receive(strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid), timeout=round_timeout)
        strategy.aggregate_train(server_round, replies)
        evaluation = list(strategy.configure_evaluate(server_round, ArrayRecord(), ConfigRecord(), grid))
        if evaluation:
            result = strategy.aggregate_evaluate(server_round, grid.send_and_receive(evaluation, timeout=round_timeout))
            if result is not None:
                model.logger.record("flower/eval_return", float(result["return"]))
        model.logger.record("flower/replies", strategy.last_round.get("replies", 0))
        model.logger.record("flower/failures", len(strategy.last_round.get("failures", {})))
        model.logger.record("flower/bytes_sent", strategy.last_round.get("bytes_sent", 0))
        model.logger.record("flower/bytes_received", strategy.last_round.get("bytes_received", 0))
        if round_stats is not None:
            round_stats.append({**strategy.last_round, "round": server_round, "seconds": time.perf_counter() - started})

    callbacks = [] if callback is None else (list(callback) if isinstance(callback, list) else [callback])
    if checkpoint_path is not None:
        callbacks.append(RoundCheckpoint(checkpoint_path))
    outcomes: list[dict[str, Any]] = []

    def recorded_round() -> None:
        flower_round()
        outcomes.append(dict(strategy.last_round))

    model._train_round = recorded_round  # the round of learn(): over the Grid instead of in this process
    try:
        model.learn(total_rounds=rounds_left, callback=callbacks or None, progress_bar=progress_bar, log_interval=log_interval,
                    reset_num_timesteps=model.rounds_done == 0)
    finally:
        del model._train_round
    if outcomes and all(o.get("skipped") for o in outcomes):
        # Not an untrained model handed back as if trained: the first reason says what the clients hit.
        reasons = [r for o in outcomes for r in o.get("reasons", ())]
        first = reasons[0].strip().splitlines() if reasons else ["no reply"]
        # A client's error arrives with its remote traceback: its first and last lines say what happened.
        summary = first[0] if len(first) == 1 else f"{first[0]} ... {first[-1].strip()}"
        raise RuntimeError(f"every one of the {len(outcomes)} Flower rounds was skipped (too few valid replies); the first "
                           f"reason: {summary}")
    return model


def _run_config_value(context: Context, key: str, default: Any = None) -> Any:
    value = context.run_config.get(key, default)
    return default if value == "" else value


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp of a Flower App directory: train the model of run config ``model-path`` for
    ``num-rounds`` rounds and save it to ``output-path`` (checkpoints: ``checkpoint-path``)."""
    model_path = _run_config_value(context, "model-path")
    if not model_path:
        raise ValueError("run config must set model-path (the fedrl model file the federation trains)")
    import_env_modules([m for m in str(_run_config_value(context, "env-modules", "")).split(",") if m])
    model = load_model(model_path)
    output = _run_config_value(context, "output-path") or str(pathlib.Path(model_path).with_suffix("")) + "-flower.zip"
    model = run_federation(
        model, grid, int(_run_config_value(context, "num-rounds", 1)),
        round_timeout=float(_run_config_value(context, "round-timeout", 600.0)),
        min_train_nodes=int(_run_config_value(context, "min-train-nodes", 0)) or None,
        fraction_train=float(_run_config_value(context, "fraction-train", 0.0)) or None,
        checkpoint_path=_run_config_value(context, "checkpoint-path") or None,
        node_timeout=float(_run_config_value(context, "node-timeout", 120.0)),
    )
    model.save(output)
    logger.info("saved the trained model to %s", output)
