"""Each algorithm's round split into its agent side and its server side, for Flower.

A :class:`RoundProtocol` says, for one fedrl algorithm, what the server sends each agent, what the
agent computes from it (one Flower ClientApp's work on one SuperNode), and how the server turns the
replies into the next model. Both halves call the same functions as the in-process round —
``local_update`` and ``aggregate_valid`` (Per-FedAvg-PG, FedAvg-PG), independent steps
(independent PG), :meth:`~fedrl_algos.mfpo.update.MFPOUpdate.agent_phase` and
:meth:`~fedrl_algos.mfpo.update.MFPOUpdate.global_phase` (MFPO),
:meth:`~fedrl_algos.fedpg_br.update.FedPGBRUpdate.agent_gradients` and
:meth:`~fedrl_algos.fedpg_br.update.FedPGBRUpdate.server_phase` (FedPG-BR) — on one agent's slice
of the federation (:func:`agent_federation`) and on the stacked replies.

Random numbers: agent ``i``'s streams are keyed by ``(seed, i)`` as in one process; the server keeps
every stream's position (counter) and sends it with each message, and the agent returns it
advanced. A client therefore needs no state to draw the right numbers, a restarted server resumes
exactly, and a Flower round equals the in-process round bit for bit on CPU.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from fedrl_algos.core.aggregation import UpdateCheck, aggregate_valid
from fedrl_algos.core.attacks import attack_streams
from fedrl_algos.core.directions import local_update
from fedrl_algos.core.federation import Federation
from fedrl_algos.core.optim import AdamState
from fedrl_algos.fedavg_pg.update import fedavg_local_steps, fedavg_server_step, round_step_sizes
from fedrl_algos.independent_pg import independent_pg_steps
from fedrl_algos.mfpo.update import MFPOState
from fedrl_envs.params import index_params, params_to
from fedrl_envs.rng import RandomStreams
from fedrl_wrappers import FederatedVecEnv

__all__ = [
    "AgentReply",
    "RoundReplies",
    "AgentWorker",
    "RoundProtocol",
    "agent_federation",
    "env_random_state",
    "set_env_random_state",
    "protocol_for",
    "SUPPORTED_ALGORITHMS",
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
    venv = federation.env._venvs[row]
    return {"seeded": bool(federation.sampler._reset_seed_used),
            "np_random": [sub.np_random.bit_generator.state for sub in venv.envs] if federation.sampler._reset_seed_used else []}


def set_env_random_state(federation: Federation, row: int, state: dict[str, Any]) -> None:
    """Restore what :func:`env_random_state` returned into agent row ``row``'s environments."""
    if federation.env is None:
        return
    venv = federation.env._venvs[row]
    if not state.get("seeded", False):  # the next rollout makes the first, seeded reset
        federation.sampler._reset_seed_used = False
        return
    if len(state["np_random"]) != len(venv.envs):
        raise ValueError(f"env state has {len(state['np_random'])} sub-environments, the agent has {len(venv.envs)}")
    for sub, saved in zip(venv.envs, state["np_random"], strict=True):
        generator = np.random.Generator(getattr(np.random, saved["bit_generator"])())
        generator.bit_generator.state = saved
        sub.np_random = generator
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


def _counters(streams: RandomStreams, agent: int) -> np.ndarray:
    return streams.counters.reshape(-1)[agent : agent + 1].cpu().numpy().copy()


def _set_counters(streams: RandomStreams, value: np.ndarray) -> None:
    counters = torch.as_tensor(np.asarray(value, dtype=np.int64)).to(streams.device)
    if counters.numel() != streams.counters.numel():
        raise ValueError(f"stream counters must have {streams.counters.numel()} entries, got {counters.numel()}")
    streams.counters = counters.reshape(streams.counters.shape).clone()


def _tensor(arrays: dict[str, np.ndarray], name: str, like: torch.Tensor) -> torch.Tensor:
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


def _stack_replies(
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


def _merge(a: UpdateCheck, b: UpdateCheck) -> UpdateCheck:
    """Both checks at once, each reason once (a missing reply fails every array of it)."""
    return UpdateCheck(a.valid & b.valid, tuple(dict.fromkeys(a.reasons + b.reasons)))


class RoundProtocol(ABC):
    """One algorithm's round on Flower (see the module docstring).

    :param model: the server's model (the whole federation); the agent side receives its own copy
    """

    #: the algorithm classes this protocol runs (by class name)
    algorithms: ClassVar[tuple[str, ...]] = ()

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
        reply = self._agent_update(worker, arrays, config, state)
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

    @abstractmethod
    def server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        """The server side: update the model in place from the replies of this round's agents.

        :param replies: the round's replies, and why the missing ones are missing
        :param min_replies: fewer valid replies than this skip the round (the model unchanged)
        :return: diagnostics (``skipped``, ``rejected``, ``reasons``)
        """

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
        return {"skipped": True, "rejected": int((~check.valid).sum()), "reasons": reasons}


class AveragingProtocol(RoundProtocol):
    """Per-FedAvg-PG and FedAvg-PG: local steps from the server's θ, then the average of the valid
    local parameters (FedAvg-PG optionally with its server Adam step)."""

    algorithms = ("PerFedAvgPG", "FedAvgPG")

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        if model.__dict__.get("control_variates", False):
            raise ValueError("control_variates (SCAFFOLD) is not supported on Flower yet; train it in one process")
        if model.is_generic and model.__dict__.get("agents_per_round") not in (None, model.n_agents):
            raise ValueError("agents_per_round with a Gymnasium-env federation: in one process every agent's environments step "
                             "(masked), on Flower only the sampled agents' would; train it with all agents on Flower")
        self._mask: torch.Tensor | None = None

    def participants(self) -> list[int]:
        # The in-process round's draw (Federation.sample_agents), so that client sampling picks the same agents.
        self._mask = self.model.federation.participation(self.model.__dict__.get("agents_per_round"))
        if self._mask is None:
            return list(range(int(self.model.n_agents)))
        return [int(i) for i in self._mask[0].nonzero().reshape(-1).tolist()]

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        config = {"local-step": int(self.model.__dict__.get("local_step", 0))}
        return {"theta": self._theta_message(self.model.policy.theta)}, config

    def _agent_update(self, worker, arrays, config, state) -> AgentReply:
        model = worker.model
        theta = _tensor(arrays, "theta", model.policy.theta).reshape(1, 1, -1)
        if type(model).__name__ == "FedAvgPG":
            sizes, _ = round_step_sizes(model.step_size, int(config["local-step"]), model.local_steps)
            local = fedavg_local_steps(model.estimator, worker.federation.sampler, theta, sizes)
        else:
            local = local_update(model.estimator, worker.federation.sampler, theta, model.step_size, model.local_steps)
        return AgentReply(worker.agent, {"theta": local[0, 0].cpu().numpy()}, {"num-trajectories": float(model.trajectories_per_round)})

    def server_update(self, replies, min_replies) -> dict[str, Any]:
        model = self.model
        theta = model.policy.theta.detach().unsqueeze(0)
        n = int(model.n_agents)
        local, check = _stack_replies(replies, "theta", n, theta, (theta.shape[-1],))
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        present = torch.zeros_like(check.valid)
        present[0, sorted(replies.asked)] = True
        # Agents that were not asked (client sampling) count with weight 0, as in the in-process
        # masked round; asked agents that failed are rejected with their reasons.
        weights = self._mask
        check = UpdateCheck(check.valid | ~present, check.reasons)
        average, check = aggregate_valid(local, theta, weights, check=check, on_reject=self._reject)
        if type(model).__name__ == "FedAvgPG":
            _, step_sum = round_step_sizes(model.step_size, model.local_step, model.local_steps)
            average, state = fedavg_server_step(theta, average, check, step_sum, model.optimizer_state, model.server_step_size)
            model._store_server_state(state)
            model.local_step += model.local_steps
        model.policy.theta.data.copy_(average[0])
        return {"skipped": False, "rejected": int((present & ~check.valid).sum()), "reasons": check.reasons}


class IndependentProtocol(RoundProtocol):
    """Independent PG: every agent steps on its own parameters; the server only keeps them."""

    algorithms = ("IndependentPG",)

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {"theta": self._theta_message(self.model.agent_theta[agent])}, {}

    def _agent_update(self, worker, arrays, config, state) -> AgentReply:
        model = worker.model
        theta = _tensor(arrays, "theta", model.policy.theta).reshape(1, 1, -1)
        local = independent_pg_steps(worker.federation, theta, model.estimator, model.step_size, model.local_steps)
        return AgentReply(worker.agent, {"theta": local[0, 0].cpu().numpy()}, {"num-trajectories": float(model.trajectories_per_round)})

    def server_update(self, replies, min_replies) -> dict[str, Any]:
        model = self.model
        like = model.agent_theta.unsqueeze(0)
        local, check = _stack_replies(replies, "theta", int(model.n_agents), like[0, 0], (like.shape[-1],))
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        if not check.all_valid:
            self._reject(check)
        model.agent_theta = torch.where(check.valid[0].unsqueeze(-1), local[0], model.agent_theta)
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons}


class MFPOProtocol(RoundProtocol):
    """MFPO: K − 1 local momentum steps and the K-th direction on the agent (its θ^(t−1) kept in
    ``Context.state`` across rounds); the server's global phase (eq. 6–8) on the replies. With
    ``optimizer="adam"`` the agent's Adam moments travel both ways too (``adam-first``,
    ``adam-second``; the step count is the local step, which the server knows)."""

    algorithms = ("MFPO",)

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        model = self.model
        arrays = {"theta": self._theta_message(model.policy.theta), "direction": self._theta_message(model.agent_direction[agent])}
        synced = model.__dict__.get("_flower_prev_from_agent")
        # The agent's θ^(t−1) is its own last θ^(K) unless the server replaced it (first round,
        # a rejected or skipped round, a restarted server): then it travels with the message.
        if synced is None or not bool(synced[agent]):
            arrays["theta-prev"] = self._theta_message(model.agent_theta_prev[agent])
        if model.update.optimizer == "adam":
            arrays["adam-first"] = self._theta_message(model.agent_adam_first[agent])
            arrays["adam-second"] = self._theta_message(model.agent_adam_second[agent])
        return arrays, {"local-step": int(model.local_step), "round": int(model.rounds_done)}

    def _agent_update(self, worker, arrays, config, state) -> AgentReply:
        model = worker.model
        like = model.policy.theta
        theta = _tensor(arrays, "theta", like).reshape(1, 1, -1)
        direction = _tensor(arrays, "direction", like).reshape(1, 1, -1)
        if "theta-prev" in arrays:
            prev = _tensor(arrays, "theta-prev", like)
        else:
            if state.get("mfpo-round") is None or int(np.asarray(state["mfpo-round"]).reshape(-1)[0]) != int(config["round"]) - 1:
                raise ValueError("MFPO agent state lost: the server did not send θ^(t-1) and this client's Context.state does not hold it")
            prev = torch.as_tensor(np.asarray(state["mfpo-theta-prev"])).to(like.device)
        step = int(config["local-step"])
        moments = None
        if model.update.optimizer == "adam":
            moments = AdamState(torch.full((1, 1), float(step), dtype=like.dtype, device=like.device),
                                _tensor(arrays, "adam-first", like).reshape(1, 1, -1), _tensor(arrays, "adam-second", like).reshape(1, 1, -1))
        start = MFPOState(theta, direction, prev.reshape(1, 1, -1), step, moments)
        theta_k, direction_k, _, info = model.update.agent_phase(worker.federation.sampler, start)
        state["mfpo-theta-prev"] = theta_k[0, 0].cpu().numpy()
        state["mfpo-round"] = np.array([int(config["round"])], dtype=np.int64)
        metrics = {"num-trajectories": float(info["trajectories"]), "return": float(info["return"].mean()),
                   "env-steps": float(info["env_steps"].sum())}
        reply = {"theta": theta_k[0, 0].cpu().numpy(), "direction": direction_k[0, 0].cpu().numpy()}
        if moments is not None:
            reply.update({"adam-first": info["moments"].first[0, 0].cpu().numpy(), "adam-second": info["moments"].second[0, 0].cpu().numpy()})
        return AgentReply(worker.agent, reply, metrics)

    def server_update(self, replies, min_replies) -> dict[str, Any]:
        model = self.model
        start = model.state
        like = start.theta[0, 0]
        n = int(model.n_agents)
        theta, check_t = _stack_replies(replies, "theta", n, like, (like.shape[-1],))
        direction, check_d = _stack_replies(replies, "direction", n, like, (like.shape[-1],))
        check = _merge(check_t, check_d)
        adam = model.update.optimizer == "adam"
        if adam:
            first, check_f = _stack_replies(replies, "adam-first", n, like, (like.shape[-1],))
            second, check_s = _stack_replies(replies, "adam-second", n, like, (like.shape[-1],))
            check = _merge(_merge(check, check_f), check_s)
        if not self._enough(check, min_replies):
            self._flower_prev(torch.zeros(n, dtype=torch.bool))
            return self._skip(check, min_replies)

        def usable(x: torch.Tensor) -> torch.Tensor:  # unusable rows become NaN, which the global phase rejects as in one process
            return x if check.all_valid else torch.where(check.valid.unsqueeze(-1), x, torch.full_like(x, float("nan")))

        theta, direction = usable(theta), usable(direction)
        step = model.local_step + model.local_steps
        moments = None
        if adam:  # the agents took K − 1 Adam steps since the last global phase
            moments = AdamState(torch.full((1, n), float(step - 1), dtype=like.dtype, device=like.device), usable(first), usable(second))
        new = model.update.global_phase(theta, direction, step, start, on_reject=self._merged_reject(check), moments=moments)
        got = replies.replies
        steps = [got[a].metrics.get("env-steps", 0.0) for a in sorted(got)]
        alpha = float(model.update.step_size(step))
        returns = torch.tensor([got[a].metrics.get("return", float("nan")) for a in sorted(got)])
        info = {"return": returns, "alpha": alpha, "nu": float(model.update.momentum(step, alpha)),
                "weight_mean": None, "weight_max": None, "clipped_fraction": None}
        model._store_round(new, info, float(np.mean(steps)) if steps else 0.0)
        self._flower_prev(check.valid[0].cpu())
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons}

    def _flower_prev(self, from_agent: torch.Tensor) -> None:
        self.model._flower_prev_from_agent = [bool(v) for v in from_agent.tolist()]


class FedPGBRProtocol(RoundProtocol):
    """FedPG-BR: every agent reports its gradient estimate and spread at the server's θ̃ (a
    Byzantine agent runs its attack); the server filters, averages and runs the SCSG loop on its
    own environment."""

    algorithms = ("FedPGBR",)

    def __init__(self, model: Any, aggregate: Any = None) -> None:
        super().__init__(model)
        #: a robust aggregation replacing FedPG-BR's filter (:func:`fedrl_algos.flower.robust.flower_aggregator`); ``None``: the filter
        self.aggregate = aggregate

    def agent_streams(self, federation: Federation) -> list[RandomStreams]:
        noise = federation.__dict__.get("_flower_noise_streams")
        if noise is None:
            noise = self.model.noise_streams if federation is self.model.federation else attack_streams(federation.streams)
            federation._flower_noise_streams = noise
        return [federation.streams, noise]

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        model = self.model
        if model.update.attack.colluding:
            raise ValueError(f"attack {model.update.attack.name!r} pools the Byzantine agents' gradients; one Flower client cannot run it")
        if "_flower_uniform" not in model.__dict__:
            model._flower_uniform = model.federation.server_streams.uniform((2,), dtype=torch.float64)
        batch = model.update.batch_size(model._flower_uniform)
        config = {"batch-size": int(batch[0]), "byzantine": bool(model.byzantine_mask[agent])}
        return {"theta": self._theta_message(model.policy.theta)}, config

    def _agent_update(self, worker, arrays, config, state) -> AgentReply:
        model = worker.model
        theta = _tensor(arrays, "theta", model.policy.theta).reshape(1, -1)
        batch = torch.tensor([int(config["batch-size"])], device=theta.device)
        byzantine = torch.tensor([bool(config["byzantine"])], device=theta.device)
        noise = self.agent_streams(worker.federation)[1]
        grads, spread, returns, env_steps = model.update.agent_gradients(worker.federation.sampler, theta, batch, byzantine, noise)
        metrics = {"num-trajectories": float(config["batch-size"]), "return": float(returns[0, 0]), "env-steps": float(env_steps[0, 0])}
        return AgentReply(worker.agent, {"gradient": grads[0, 0].cpu().numpy(), "spread": spread[0, :1].cpu().numpy()}, metrics)

    def server_update(self, replies, min_replies) -> dict[str, Any]:
        model = self.model
        theta = model.policy.theta.detach().unsqueeze(0)
        n = int(model.n_agents)
        uniform = model.__dict__.pop("_flower_uniform")
        grads, check_g = _stack_replies(replies, "gradient", n, theta, (theta.shape[-1],))
        spread, check_s = _stack_replies(replies, "spread", n, theta, (1,))
        check = _merge(check_g, check_s)
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        spread = torch.where(check.valid, spread[..., 0], torch.ones_like(spread[..., 0]))
        got = replies.replies
        returns = torch.tensor([[got[a].metrics.get("return", 0.0) if a in got else 0.0 for a in range(n)]], dtype=theta.dtype)
        env_steps = torch.tensor([[got[a].metrics.get("env-steps", 0.0) if a in got else 0.0 for a in range(n)]], dtype=theta.dtype)
        batch = model.update.batch_size(uniform)
        if not check.all_valid:
            grads = torch.where(check.valid.unsqueeze(-1), grads, torch.full_like(grads, float("nan")))  # server_phase rejects them
        new_theta, info = model.update.server_phase(
            theta, grads, spread, returns, env_steps, batch, uniform, model.server_sampler, model.optimizer_state, self._merged_reject(check),
            aggregate=self.aggregate,
        )
        model._store_round(new_theta, info)
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons}


_PROTOCOLS: tuple[type[RoundProtocol], ...] = (AveragingProtocol, IndependentProtocol, MFPOProtocol, FedPGBRProtocol)
#: the fedrl algorithm classes that run on Flower
SUPPORTED_ALGORITHMS: tuple[str, ...] = tuple(name for p in _PROTOCOLS for name in p.algorithms)


def protocol_for(model: Any) -> RoundProtocol:
    """The :class:`RoundProtocol` of ``model``'s algorithm.

    :raise TypeError: for a model of another class (e.g. the federated SB3 baselines)
    """
    name = type(model).__name__
    for protocol in _PROTOCOLS:
        if name in protocol.algorithms:
            return protocol(model)
    raise TypeError(f"model must be one of {', '.join(SUPPORTED_ALGORITHMS)} to run on Flower, got {name}")
