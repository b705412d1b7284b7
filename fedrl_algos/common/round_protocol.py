"""An algorithm's round split into its agent side and its server side (no Flower here).

A :class:`RoundProtocol` says, for one algorithm, what the server sends each agent, what the agent
computes from it (a Flower ClientApp's work on one SuperNode, or any other transport's), and how
the server turns the replies into the next model. Each algorithm package defines its protocol next
to its update (``<algorithm>/protocol.py``) and names it on its class (``round_protocol``); a
subclass inherits it, and a new algorithm runs on Flower by declaring one. Both halves call the
same functions as the in-process round, on one agent's slice of the federation
(:func:`agent_federation`) and on the stacked replies (:func:`stack_replies`).

Random numbers: agent ``i``'s streams are keyed by ``(seed, i)`` as in one process; the server keeps
every stream's position (counter) and sends it with each message, and the agent returns it
advanced. A client therefore needs no state to draw the right numbers, a restarted server resumes
exactly, and a round by halves equals the in-process round bit for bit on CPU.

:class:`AveragingProtocol` is the round every FedAvg-style algorithm shares (local steps from the
server's θ, the average of the valid local parameters); an algorithm fills in its local steps.

The critic (``baseline="critic"``): the server's message to agent ``i`` carries agent ``i``'s critic
(:data:`CRITIC_ARRAYS`: φ, the fit's Adam state, μ and σ), the agent fits it in its local work and
returns it; the server checks the returned critics like the other arrays (a bad one rejects that
reply), then keeps them under the model's ``critic_aggregation`` as the in-process round does
(:meth:`RoundProtocol.keep_critics`). Agents whose reply is missing or rejected keep their critic of
the round's start.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from fedrl_algos.core.aggregation import UpdateCheck, aggregate_valid
from fedrl_algos.core.critic import CriticState, average_critics, select_critics
from fedrl_algos.core.federation import Federation
from fedrl_algos.core.optim import AdamState
from fedrl_envs.params import index_params, params_to
from fedrl_envs.rng import RandomStreams
from fedrl_wrappers import FederatedVecEnv

__all__ = [
    "AgentReply",
    "RoundReplies",
    "AgentWorker",
    "RoundProtocol",
    "AveragingProtocol",
    "agent_federation",
    "CRITIC_ARRAYS",
    "critic_arrays",
    "critic_from_arrays",
    "env_random_state",
    "set_env_random_state",
    "message_tensor",
    "stack_replies",
    "merge_checks",
    "protocol_for",
    "round_by_halves",
]


@dataclass
class AgentReply:
    """What one agent sent back in a round: arrays (NumPy) and scalar metrics.

    :param agent: the agent's index in the federation
    :param arrays: named arrays (parameters, directions, gradients, stream counters)
    :param metrics: named numbers (``num-trajectories``, ``return``, ...)
    """

    agent: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float] = field(default_factory=dict)


def agent_federation(model: Any, agent: int) -> Federation:
    """The one-agent slice of ``model``'s federation that a Flower client samples with: agent
    ``agent``'s task (a fedrl family's parameters, or its ``gym.make`` kwargs and environments
    seeded as in the whole federation), the model's policy, and the random streams of ``(seed, agent)``.

    :param model: a fedrl federation (a task family, or a Gymnasium id with sync vectorization)
    :param agent: the agent's index
    """
    if model.__dict__.get("normalize_observations", False):
        raise ValueError("normalize_observations pools observation moments over every agent in-process; it is not supported on Flower")
    index = torch.tensor([int(agent)])
    if model.is_generic:
        layout = model.__dict__.get("generic_env_layout") or {}
        if (layout.get("vectorization_mode") or "sync") != "sync":
            raise ValueError(f"Flower runs Gymnasium-env federations with vectorization_mode='sync' (their environments' random "
                             f"state travels with the messages), got {layout.get('vectorization_mode')!r}")
        env = FederatedVecEnv(model.env_id, int(layout.get("n_envs", 1)), agent_kwargs=[dict(model.agent_kwargs[int(agent)])],
                              autoreset=False, seed=model.seed, device=model.device, vectorization_mode="sync", stream_ids=[int(agent)])
        return Federation.from_env(env, model.policy, model.seed, model.gamma, model.horizon, agent_ids=index,
                                   stop_when_done=model.stop_rollouts_when_done)
    params = index_params(params_to(model.agent_params, model.device), index.to(model.device))
    return Federation(
        model.family, params, model.policy, torch.tensor([model.seed]), model.gamma, horizon_override=model.horizon,
        stop_when_done=model.stop_rollouts_when_done, agent_ids=index,
    )


def env_random_state(federation: Federation, row: int) -> dict[str, Any] | None:
    """The random state of agent row ``row``'s Gymnasium environments in an env-backed federation
    (whether its first seeded reset happened, and each sub-environment's ``np_random`` state);
    ``None`` for a family-backed one, whose environments are pure functions of the streams."""
    if federation.env is None:
        return None
    seeded = bool(federation.sampler._reset_seed_used)
    return {"seeded": seeded, "np_random": federation.env.agent_random_state(row) if seeded else []}


def set_env_random_state(federation: Federation, row: int, state: dict[str, Any]) -> None:
    """Restore what :func:`env_random_state` returned into agent row ``row``'s environments."""
    if federation.env is None:
        return
    if not state.get("seeded", False):  # the next rollout makes the first, seeded reset
        federation.sampler._reset_seed_used = False
        return
    federation.env.set_agent_random_state(row, state["np_random"])
    federation.sampler._reset_seed_used = True
    federation.env._reset_done = True


def _encode_state(state: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(json.dumps(state).encode(), dtype=np.uint8).copy()


def _decode_state(value: np.ndarray) -> dict[str, Any]:
    try:
        state = json.loads(np.asarray(value, dtype=np.uint8).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"env-state is not valid JSON ({err})") from None
    if not isinstance(state, dict):
        raise ValueError("env-state must be a JSON object")
    return state


#: the arrays of an agent's critic in the messages (``baseline="critic"``), in :class:`CriticState`'s
#: order: φ ``[d_φ]``, the fit's Adam step count ``[1]`` and moments ``[d_φ]``, μ ``[1]`` and σ ``[1]``
CRITIC_ARRAYS = ("critic-phi", "critic-adam-step", "critic-adam-first", "critic-adam-second", "critic-mean", "critic-scale")


def _uses_critic(model: Any) -> bool:
    return bool(getattr(model, "uses_critic", False))


def _critic_parts(state: CriticState) -> tuple[torch.Tensor, ...]:
    return (state.phi, *state.moments, state.mean, state.scale)


def _critic_state(parts: Sequence[torch.Tensor]) -> CriticState:
    phi, step, first, second, mean, scale = parts
    return CriticState(phi, AdamState(step, first, second), mean, scale)


def critic_arrays(state: CriticState, agent: int) -> dict[str, np.ndarray]:
    """Agent ``agent``'s critic of ``state`` (batch ``[1, n]``) as a message's arrays (:data:`CRITIC_ARRAYS`)."""
    return {name: x[0, agent].reshape(-1).detach().cpu().numpy().copy() for name, x in zip(CRITIC_ARRAYS, _critic_parts(state), strict=True)}


def critic_from_arrays(arrays: dict[str, np.ndarray], like: CriticState) -> CriticState:
    """The critic a message carries (:data:`CRITIC_ARRAYS`), batch ``[1, 1]`` on ``like``'s device and of
    its shapes and dtypes (``like``: batch ``[1, 1]``); ``ValueError`` when an array is missing, of
    another shape or dtype, or not finite."""
    parts = []
    for name, x in zip(CRITIC_ARRAYS, _critic_parts(like), strict=True):
        value = message_tensor(arrays, name, x)
        if value.dtype != x.dtype or value.numel() != x.numel():
            raise ValueError(f"{name} has {value.numel()} entries of {value.dtype}, expected {x.numel()} of {x.dtype}")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} is not finite")
        parts.append(value.reshape(x.shape).clone())
    return _critic_state(parts)


class AgentWorker:
    """One agent of a model, as a Flower client holds it: the model (its hyperparameters and
    update objects) and the agent's slice of the federation.

    :param model: the fedrl model
    :param agent: the agent's index
    """

    def __init__(self, model: Any, agent: int) -> None:
        n = int(model.n_agents)
        if not 0 <= int(agent) < n:
            raise ValueError(f"agent must be in [0, {n - 1}] (the model's agents), got {agent}")
        self.model = model
        self.agent = int(agent)
        self.federation = agent_federation(model, self.agent)

    @property
    def critic(self) -> CriticState | None:
        """The agent's critic (batch ``[1, 1]``: its row of the model's critic fields), ``None`` without ``baseline="critic"``."""
        state = self.model.critic_state if _uses_critic(self.model) else None
        if state is None:
            return None
        return _critic_state([x[:, self.agent : self.agent + 1].clone() for x in _critic_parts(state)])

    def keep_critic(self, state: CriticState) -> None:
        """Store the agent's critic ``state`` (batch ``[1, 1]``) in its row of the model's critic fields."""
        full = self.model.critic_state
        parts = []
        for x, value in zip(_critic_parts(full), _critic_parts(state), strict=True):
            x = x.clone()
            x[:, self.agent] = value.reshape(x[:, self.agent].shape).to(x)
            parts.append(x)
        self.model._keep_critic(_critic_state(parts))


def _counters(streams: RandomStreams, agent: int) -> np.ndarray:
    return streams.counters.reshape(-1)[agent : agent + 1].cpu().numpy().copy()


def _set_counters(streams: RandomStreams, value: np.ndarray) -> None:
    counters = torch.as_tensor(np.asarray(value, dtype=np.int64)).to(streams.device)
    if counters.numel() != streams.counters.numel():
        raise ValueError(f"stream counters must have {streams.counters.numel()} entries, got {counters.numel()}")
    streams.counters = counters.reshape(streams.counters.shape).clone()


def message_tensor(arrays: dict[str, np.ndarray], name: str, like: torch.Tensor) -> torch.Tensor:
    """The message's array ``name`` as a tensor on ``like``'s device (``ValueError`` when it is missing)."""
    if name not in arrays:
        raise ValueError(f"message lacks the array {name!r}")
    return torch.as_tensor(np.ascontiguousarray(arrays[name])).to(device=like.device)


@dataclass
class RoundReplies:
    """What came back in one round.

    :param asked: the agents the server sent the round to
    :param replies: the replies that arrived, by agent
    :param failures: why an asked agent sent nothing usable (its error, a timeout), by agent
    """

    asked: list[int]
    replies: dict[int, AgentReply]
    failures: dict[int, str] = field(default_factory=dict)


def stack_replies(
    round_: RoundReplies, name: str, n: int, like: torch.Tensor, extra_shape: tuple[int, ...]
) -> tuple[torch.Tensor, UpdateCheck]:
    """The agents' arrays ``name`` as ``[1, n, *extra_shape]`` in agent order, and which are usable.

    A missing reply of an asked agent, or an array that is missing, of the wrong shape or dtype, or
    not finite, is a zero row marked invalid with the reason (the server's state is never read from
    it). Agents that were not asked are invalid without a reason.
    """
    replies = round_.replies
    out = torch.zeros((1, n, *extra_shape), dtype=like.dtype, device=like.device)
    valid = torch.zeros((1, n), dtype=torch.bool, device=like.device)
    reasons: list[str] = []
    for agent in range(n):
        reply = replies.get(agent)
        if reply is None:
            if agent in round_.asked:
                reasons.append(f"agent {agent}: {round_.failures.get(agent, 'no reply')}")
            continue
        value = reply.arrays.get(name)
        if value is None:
            reasons.append(f"agent {agent}: reply lacks {name!r}")
            continue
        value = np.asarray(value)
        if tuple(value.shape) != extra_shape or value.dtype != np.dtype(str(like.dtype).removeprefix("torch.")):
            reasons.append(f"agent {agent}: {name} has shape {tuple(value.shape)} and dtype {value.dtype}, expected {extra_shape} and {like.dtype}")
            continue
        row = torch.as_tensor(np.ascontiguousarray(value)).to(like.device)
        if not bool(torch.isfinite(row).all()):
            reasons.append(f"agent {agent}: {name} is not finite")
            continue
        out[0, agent] = row
        valid[0, agent] = True
    return out, UpdateCheck(valid, tuple(reasons))


def merge_checks(a: UpdateCheck, b: UpdateCheck) -> UpdateCheck:
    """Both checks at once, each reason once (a missing reply fails every array of it)."""
    return UpdateCheck(a.valid & b.valid, tuple(dict.fromkeys(a.reasons + b.reasons)))


class RoundProtocol(ABC):
    """One algorithm's round by halves (see the module docstring).

    :param model: the server's model (the whole federation); the agent side receives its own copy
    """

    #: whether the server's aggregation may be replaced by a robust one (``aggregate=``, e.g. one
    #: of Flower's Krum/median strategies); protocols that take it accept ``aggregate`` in ``__init__``
    accepts_aggregate: ClassVar[bool] = False

    @classmethod
    def assumed_faulty_agents(cls, model: Any) -> int:
        """How many of ``model``'s agents a robust aggregation should assume faulty (f of Krum; default 0)."""
        return 0

    def __init__(self, model: Any) -> None:
        self.model = model
        #: the environments' random state of every agent of an env-backed federation, as its last
        #: reply returned it (kept for the session: like in one process, it is not saved with the model)
        self._env_states: dict[int, dict[str, Any]] = {}

    # --- streams ------------------------------------------------------------------------------
    def agent_streams(self, federation: Federation) -> list[RandomStreams]:
        """The streams an agent draws from in a round (their counters travel with the messages)."""
        return [federation.streams]

    def stream_counters(self, agent: int) -> np.ndarray:
        """The server's record of agent ``agent``'s stream positions."""
        return np.concatenate([_counters(s, agent) for s in self.agent_streams(self.model.federation)])

    def store_counters(self, agent: int, counters: np.ndarray) -> None:
        """Record agent ``agent``'s advanced stream positions from its reply."""
        streams = self.agent_streams(self.model.federation)
        counters = np.asarray(counters, dtype=np.int64).reshape(-1)
        if counters.shape[0] != len(streams):
            raise ValueError(f"agent {agent}: expected {len(streams)} stream counters, got {counters.shape[0]}")
        for s, c in zip(streams, counters, strict=True):
            flat = s.counters.reshape(-1).clone()
            flat[agent] = int(c)
            s.counters = flat.reshape(s.counters.shape)

    # --- a round --------------------------------------------------------------------------------
    def participants(self) -> list[int]:
        """The agents of this round (all; protocols with client sampling override it)."""
        return list(range(int(self.model.n_agents)))

    def train_message(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What the server sends agent ``agent``: arrays and config (the stream positions included)."""
        arrays, config = self._payload(agent)
        if _uses_critic(self.model):
            arrays.update(critic_arrays(self.model.critic_state, agent))
        arrays["stream-counters"] = self.stream_counters(agent)
        if self.model.is_generic:
            arrays["env-state"] = _encode_state(self._env_states.get(agent, {"seeded": False, "np_random": []}))
        return arrays, config

    def agent_round(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        """The agent's work (in the ClientApp): set the streams, compute, return the reply.

        :param state: the client's ``Context.state`` as a plain dict of NumPy arrays (read and updated)
        """
        streams = self.agent_streams(worker.federation)
        counters = np.asarray(arrays["stream-counters"], dtype=np.int64).reshape(-1)
        if counters.shape[0] != len(streams):
            raise ValueError(f"expected {len(streams)} stream counters, got {counters.shape[0]}")
        for s, c in zip(streams, counters, strict=True):
            _set_counters(s, np.array([c]))
        if "env-state" in arrays:
            set_env_random_state(worker.federation, 0, _decode_state(arrays["env-state"]))
        gradient = None
        if _uses_critic(worker.model):  # the server's record of this agent's critic, fitted in the local work
            worker.keep_critic(critic_from_arrays(arrays, worker.critic))
            gradient = self.agent_critic_gradient(worker)
            if gradient is not None:
                gradient.state = worker.critic
        reply = self._agent_update(worker, arrays, config, state)
        if gradient is not None:
            worker.keep_critic(gradient.state)
        if _uses_critic(worker.model):
            reply.arrays.update(critic_arrays(worker.model.critic_state, worker.agent))
        reply.arrays["stream-counters"] = np.array([int(s.counters.reshape(-1)[0]) for s in streams], dtype=np.int64)
        env_state = env_random_state(worker.federation, 0)
        if env_state is not None:
            reply.arrays["env-state"] = _encode_state(env_state)
        return reply

    def store_env_state(self, agent: int, value: np.ndarray) -> None:
        """Record agent ``agent``'s environments' advanced random state from its reply (env-backed federations)."""
        self._env_states[agent] = _decode_state(value)

    @abstractmethod
    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The algorithm's part of the message to ``agent``."""

    @abstractmethod
    def _agent_update(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        """The algorithm's agent side."""

    def server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        """The server side: update the model in place from the replies of this round's agents
        (:meth:`_server_update`); with ``baseline="critic"`` the returned critics are checked first
        (a bad one rejects that reply) and kept afterwards (:meth:`keep_critics`).

        :param replies: the round's replies, and why the missing ones are missing
        :param min_replies: fewer valid replies than this skip the round (the model unchanged)
        :return: diagnostics (``skipped``, ``rejected``, ``reasons``, ``accepted``: the agents whose
            replies the server used)
        """
        if not _uses_critic(self.model):
            return self._server_update(replies, min_replies)
        start = self.model.critic_state
        fitted, replies = self._critic_replies(replies, start)
        outcome = self._server_update(replies, min_replies)
        if not outcome["skipped"]:
            accepted = torch.zeros_like(start.mean, dtype=torch.bool)
            accepted[0, list(outcome["accepted"])] = True
            self.keep_critics(fitted, start, accepted)
        return outcome

    def _server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        """The algorithm's server side (see :meth:`server_update`); its diagnostics include
        ``accepted``, the agents whose replies it used. (A protocol that overrides
        :meth:`server_update` itself, as before the critic travelled, works without the critic.)"""
        raise NotImplementedError(f"{type(self).__name__} must define _server_update (or override server_update)")

    # --- the critic (baseline="critic") -----------------------------------------------------------
    def agent_critic_gradient(self, worker: AgentWorker) -> Any:
        """The :class:`~fedrl_algos.core.critic.CriticGradient` whose ``state`` holds the agent's critic
        during its local work (default: the one in the model's ``estimator``); ``None``: the
        algorithm's agent side passes the critic itself (:attr:`AgentWorker.critic`,
        :meth:`AgentWorker.keep_critic`)."""
        return worker.model._critic_gradient(getattr(worker.model, "estimator", None))

    def _critic_replies(self, replies: RoundReplies, start: CriticState) -> tuple[CriticState, RoundReplies]:
        """The returned critics ``[1, n]`` and the replies without those whose critic is unusable
        (missing, of the wrong shape or dtype, not finite, σ ≤ 0 or a negative second moment): such a
        reply becomes a failure with its reason, so the server treats that agent as failed."""
        n = int(self.model.n_agents)
        parts, reasons = [], {}
        for name, x in zip(CRITIC_ARRAYS, _critic_parts(start), strict=True):
            stacked, check = stack_replies(RoundReplies([], replies.replies), name, n, x[0, 0], tuple(x.shape[2:]) or (1,))
            value = stacked.reshape(x.shape)
            bad = torch.zeros_like(check.valid)
            if name == "critic-scale":
                bad = check.valid & (value <= 0)
            elif name in ("critic-adam-second", "critic-adam-step"):
                bad = check.valid & (value < 0).reshape(1, n, -1).any(-1)
            for agent in range(n):
                if agent in replies.replies and agent not in reasons and not bool(check.valid[0, agent]):
                    reasons[agent] = next((r.split(": ", 1)[1] for r in check.reasons if r.startswith(f"agent {agent}: ")), f"{name} unusable")
                elif agent in replies.replies and agent not in reasons and bool(bad[0, agent]):
                    reasons[agent] = f"{name} is out of range"
            parts.append(value)
        if not reasons:
            return _critic_state(parts), replies
        got = {a: r for a, r in replies.replies.items() if a not in reasons}
        return _critic_state(parts), RoundReplies(replies.asked, got, {**replies.failures, **reasons})

    def critic_weights(self, accepted: torch.Tensor) -> torch.Tensor | None:
        """The weights ``[1, n]`` of ``critic_aggregation="average"`` over the agents (default: the
        ``accepted`` ones; ``None``, the plain mean, when that is every agent, as in one process)."""
        return None if bool(accepted.all()) else accepted

    def keep_critics(self, fitted: CriticState, start: CriticState, accepted: torch.Tensor) -> None:
        """Keep the round's critics in the model as the in-process round does: the ``accepted`` agents
        ``[1, n]`` keep what they ``fitted``, the others their critic of the round's ``start``; with
        ``critic_aggregation="average"`` the server then averages them (:meth:`critic_weights`) and
        broadcasts the average to every agent."""
        model = self.model
        kept = select_critics(accepted, fitted, start)
        if model._critic_setting("critic_aggregation") == "average":
            weights = self.critic_weights(accepted)
            kept = average_critics(model.critic_network, kept, weights)
        model._keep_critic(kept)

    # --- helpers ----------------------------------------------------------------------------------
    def _theta_message(self, theta: torch.Tensor) -> np.ndarray:
        return theta.detach().cpu().numpy().copy()

    def _reject(self, check: UpdateCheck) -> None:
        self.model._reject_updates(check)

    def _merged_reject(self, check: UpdateCheck) -> Any:
        """An ``on_reject`` for the update functions that reports the replies' own reasons (wrong
        shape, missing array) where they are the cause, once per round."""

        def on_reject(inner: UpdateCheck) -> None:
            self._reject(UpdateCheck(inner.valid, check.reasons + tuple(r for r in inner.reasons if not check.reasons)))

        return on_reject

    def _enough(self, check: UpdateCheck, min_replies: int) -> bool:
        return int(check.valid.sum()) >= max(int(min_replies), 1)

    def _skip(self, check: UpdateCheck, min_replies: int) -> dict[str, Any]:
        """Skip the round: the model's parameters stay; the skip is warned about and logged."""
        self.model._round_skipped = 1
        reasons = (*check.reasons, f"round skipped: {int(check.valid.sum())} valid replies, fewer than min_train_nodes={min_replies}")
        self.model._reject_updates(UpdateCheck(torch.zeros_like(check.valid), reasons))
        return {"skipped": True, "rejected": int((~check.valid).sum()), "reasons": reasons, "accepted": []}


class AveragingProtocol(RoundProtocol):
    """A FedAvg-style round: this round's agents take local steps from the server's θ and return
    their local parameters; the server averages the valid ones
    (:func:`~fedrl_algos.core.aggregation.aggregate_valid`) and takes its step (:meth:`server_step`,
    by default θ ← the average). Client sampling follows the model's ``agents_per_round`` with the
    in-process round's draw, so that it picks the same agents. With ``baseline="critic"`` the
    in-process round computes every agent (their critics fit and their streams advance) and the
    sampling mask leaves the others out; so does this one: every agent is asked, the unsampled
    agents' replies only advance their streams, and they keep their critics of the round's start.

    A subclass says what the local steps are (:meth:`local_steps`) and, optionally, what else the
    agents need (:meth:`round_config`) and how the server steps from the average.
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        if model.__dict__.get("control_variates", False):
            raise ValueError("control_variates (SCAFFOLD) is not supported on Flower yet; train it in one process")
        if model.is_generic and model.__dict__.get("agents_per_round") not in (None, model.n_agents):
            raise ValueError("agents_per_round with a Gymnasium-env federation: in one process every agent's environments step "
                             "(masked), on Flower only the sampled agents' would; train it with all agents on Flower")
        self._mask: torch.Tensor | None = None
        self._sampled: list[int] = []

    @abstractmethod
    def local_steps(self, worker: AgentWorker, theta: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
        """The agent's local parameters ``[1, 1, d]`` after its local steps from the server's ``theta [1, 1, d]``.

        :param worker: the agent (its model's hyperparameters, its slice of the federation)
        :param theta: the server's parameters
        :param config: the round's config (:meth:`round_config`)
        """

    def round_config(self) -> dict[str, Any]:
        """What the agents need besides θ this round (plain numbers; default: nothing)."""
        return {}

    def server_step(self, theta: torch.Tensor, average: torch.Tensor, check: UpdateCheck) -> torch.Tensor:
        """The server's new parameters ``[1, d]`` from the average of the valid local ones (default: the average).

        :param theta: the server's parameters before the round ``[1, d]``
        :param average: the average ``[1, d]``
        :param check: which agents' parameters were valid
        """
        return average

    def participants(self) -> list[int]:
        self._mask = self.model.federation.participation(self.model.__dict__.get("agents_per_round"))
        everyone = list(range(int(self.model.n_agents)))
        self._sampled = everyone if self._mask is None else [int(i) for i in self._mask[0].nonzero().reshape(-1).tolist()]
        return everyone if _uses_critic(self.model) else self._sampled

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {"theta": self._theta_message(self.model.policy.theta)}, self.round_config()

    def _agent_update(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        theta = message_tensor(arrays, "theta", worker.model.policy.theta).reshape(1, 1, -1)
        local = self.local_steps(worker, theta, config)
        return AgentReply(worker.agent, {"theta": local[0, 0].cpu().numpy()}, {"num-trajectories": float(worker.model.trajectories_per_round)})

    def _server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        model = self.model
        theta = model.policy.theta.detach().unsqueeze(0)
        sampled = [a for a in replies.asked if a in self._sampled]
        # only the sampled agents' replies count (with the critic every agent was asked; see the class)
        replies = RoundReplies(sampled, {a: r for a, r in replies.replies.items() if a in sampled},
                               {a: f for a, f in replies.failures.items() if a in sampled})
        local, check = stack_replies(replies, "theta", int(model.n_agents), theta, (theta.shape[-1],))
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        present = torch.zeros_like(check.valid)
        present[0, sorted(replies.asked)] = True
        # Agents that were not asked (client sampling) count with weight 0, as in the in-process
        # masked round; asked agents that failed are rejected with their reasons.
        check = UpdateCheck(check.valid | ~present, check.reasons)
        average, check = aggregate_valid(local, theta, self._mask, check=check, on_reject=self._reject)
        model.policy.theta.data.copy_(self.server_step(theta, average, check)[0])
        accepted = present & check.valid
        return {"skipped": False, "rejected": int((present & ~check.valid).sum()), "reasons": check.reasons,
                "accepted": accepted[0].nonzero().reshape(-1).tolist()}


def protocol_for(model: Any, **options: Any) -> RoundProtocol:
    """The :class:`RoundProtocol` of ``model``'s algorithm: the class its ``round_protocol`` names.

    :param model: a federation whose class declares ``round_protocol``
    :param options: keyword arguments of that protocol (e.g. ``aggregate`` where it is accepted)
    :raise TypeError: for a model whose class declares none (e.g. the federated SB3 baselines)
    """
    protocol = getattr(type(model), "round_protocol", None)
    if protocol is None:
        raise TypeError(f"{type(model).__name__} declares no round_protocol, so it cannot run by halves (on Flower); "
                        "the algorithms that can are the classes with a round_protocol (fedrl_algos.flower.algorithm_classes())")
    if "aggregate" in options and not protocol.accepts_aggregate:
        if options["aggregate"] is None:
            options.pop("aggregate")
        else:
            raise ValueError(f"{type(model).__name__}'s round ({protocol.__name__}) takes no robust aggregation (aggregate=)")
    return protocol(model, **options)


def round_by_halves(protocol: RoundProtocol, workers: Sequence[AgentWorker], states: Sequence[dict[str, Any]] | None = None,
                    min_replies: int = 1) -> dict[str, Any]:
    """One round of ``protocol`` in this process, its messages handed over directly instead of sent:
    what a Flower Strategy and the ClientApps do, without Flower. With the same seed it equals the
    model's in-process round, which makes it the test of a new protocol.

    :param protocol: the server's protocol (it updates its model in place)
    :param workers: one :class:`AgentWorker` per agent (``AgentWorker(copy.deepcopy(model), i)``)
    :param states: each agent's state kept between rounds (a ClientApp's ``Context.state``; default: none kept)
    :param min_replies: fewer valid replies than this skip the round
    :return: the server side's diagnostics (``skipped``, ``rejected``, ``reasons``)
    """
    asked = protocol.participants()
    replies: dict[int, AgentReply] = {}
    for agent in asked:
        arrays, config = protocol.train_message(agent)
        reply = protocol.agent_round(workers[agent], arrays, config, {} if states is None else states[agent])
        protocol.store_counters(agent, reply.arrays.pop("stream-counters"))
        if "env-state" in reply.arrays:
            protocol.store_env_state(agent, reply.arrays.pop("env-state"))
        replies[agent] = reply
    return protocol.server_update(RoundReplies(asked, replies), min_replies)
