"""One federation, batched over independent runs: state, the shared broadcast/select step, and adaptation.

A :class:`Federation` holds everything a run needs that is not a hyperparameter: the family, the
agents' stacked task parameters, the flat policy, and the random streams of every ``(run, agent)``
pair. Its methods are the batched programs the algorithm classes and the experiments share:
``R`` runs of ``n`` agents are one tensor program with batch ``[R, n]``. Each algorithm's round
lives in its own package (e.g. :func:`fedrl_algos.per_fedavg_pg.update.per_fedavg_pg_round`) and
calls :meth:`Federation.local_round` for the step every averaging round shares: broadcast θ,
select the round's agents, run their local loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedrl_algos.core.adaptation import adaptation_gradient
from fedrl_algos.core.aggregation import UpdateCheck
from fedrl_algos.core.env_sampling import EnvSampler
from fedrl_algos.core.sampling import KernelSampler
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.family import TaskFamily
from fedrl_envs.params import index_params
from fedrl_envs.rng import RandomStreams, derive_keys

__all__ = ["Federation", "AgentSelection", "LocalSteps", "participated", "run_keys", "run_env_stream_ids", "adapt_with_sampler", "combine_seed"]

#: a local loop ``steps(sampler, start [R, k, d], gather) -> [R, k, d]`` run by :meth:`Federation.local_round`
#: on the ``k`` computed agents of each run; ``gather`` maps a per-agent tensor ``[R, n, ...]`` to
#: those agents' rows ``[R, k, ...]`` (e.g. their control variates)
LocalSteps = Callable[[Any, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]

# Stream indices within a run's seed: agents use 0..n-1; these offsets keep other consumers apart.
_SERVER_STREAM = 1 << 40
_EVAL_STREAM = 1 << 41


def run_env_stream_ids(seeds: Any, n_agents: int, offset: int = 0) -> list[int]:
    """Stream ids of a ``FederatedVecEnv`` holding ``R`` runs × ``n`` agents run-major: agent ``i``
    of the run seeded ``s`` gets a non-negative id derived from ``(s, i)``, so a run's environments
    are seeded the same whether it runs alone or batched with others.

    :param seeds: one seed per run
    :param n_agents: agents per run
    :param offset: kept apart for other consumers (e.g. evaluation environments)
    """
    keys = run_keys(torch.as_tensor(seeds, dtype=torch.int64).reshape(-1), n_agents, offset)
    return [int(k) & ((1 << 62) - 1) for k in keys.reshape(-1).tolist()]


def run_keys(seeds: torch.Tensor, n_agents: int, offset: int = 0, agent_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Stream keys ``[R, n]`` for runs seeded ``seeds [R]`` (agent ``i`` of run ``r``).

    :param agent_ids: the agents' indices in their federation (default ``0..n-1``): a slice of a
        federation (one Flower client's agent) draws the same numbers as those rows of the whole
    """
    ids = torch.arange(n_agents) if agent_ids is None else torch.as_tensor(agent_ids, dtype=torch.int64).reshape(-1)
    return derive_keys(seeds.reshape(-1, 1), ids.reshape(1, -1) + offset)


@dataclass
class Federation:
    """``R`` independent runs of an ``n``-agent federation on one device.

    The agents are either a fedrl family's tasks (``family`` and ``agent_params``: every run and
    agent sampled through the family's kernels in one program) or the agents of any Gymnasium
    environment (:meth:`from_env`: a :class:`~fedrl_wrappers.FederatedVecEnv`, one run).

    :param family: task family (``None`` with ``env``)
    :param agent_params: per-agent task parameters stacked ``[n]`` (``None`` with ``env``)
    :param policy: flat policy shared by all agents
    :param seeds: one integer seed per run ``[R]``
    :param gamma: discount
    :param env: the federated env of a Gymnasium-env federation (see :meth:`from_env`)
    :param eval_env: a second env for evaluation rollouts (so that evaluating never changes the
        training episodes); ``None``: evaluation shares ``env``
    :param horizon_override: last time index H of an episode (default: the family's or the env's)
    :param stop_when_done: rollouts stop once every episode of the batch ended (see
        :func:`~fedrl_algos.core.sampling.rollout` and
        :class:`~fedrl_algos.core.env_sampling.EnvSampler`; the trajectories are the same but shorter)
    :param normalizer: observation normalizer shared by the samplers (only the training sampler
        adds to its moments; :mod:`fedrl_algos.core.normalization`)
    :param env_reset_seed: seed of the env's first reset (``None``: the seed the env was made with)
    :param agent_ids: each agent's index in the whole federation, for a federation that holds only
        some of its agents (a Flower client's one agent): their random streams are keyed by these
        indices, so the slice draws exactly what those rows of the whole federation draw (default
        ``0..n-1``)
    :param capture: the family samplers' captured rollouts (:mod:`fedrl_algos.core.capture`):
        ``"auto"`` (on CUDA), ``True`` or ``False``
    """

    family: TaskFamily | None
    agent_params: Any
    policy: Any
    seeds: torch.Tensor
    gamma: float = 0.9
    env: Any = None
    eval_env: Any = None
    horizon_override: int | None = None
    stop_when_done: bool = False
    normalizer: Any = None
    env_reset_seed: int | None = None
    agent_ids: Any = None
    capture: Any = "auto"

    def __post_init__(self) -> None:
        self.seeds = torch.as_tensor(self.seeds, dtype=torch.int64).reshape(-1)
        self.n_runs = int(self.seeds.shape[0])
        self.device = self.policy.theta.device
        if self.env is not None:
            if self.env.n_agents % self.n_runs:
                raise ValueError(f"env must hold runs x agents environments: {self.env.n_agents} agents for {self.n_runs} runs")
            self.n_agents = int(self.env.n_agents) // self.n_runs
        else:
            first = next(v for v in vars(self.agent_params).values() if isinstance(v, torch.Tensor))
            self.n_agents = int(first.shape[0])
        if self.agent_ids is not None:
            self.agent_ids = torch.as_tensor(self.agent_ids, dtype=torch.int64).reshape(-1)
            if self.agent_ids.shape[0] != self.n_agents:
                raise ValueError(f"agent_ids must have one index per agent ({self.n_agents}), got {self.agent_ids.shape[0]}")
        self._capture_cache: dict[Any, Any] = {}  # the samplers' compiled rollouts, shared (fedrl_algos.core.capture)
        self.streams = RandomStreams(run_keys(self.seeds, self.n_agents, agent_ids=self.agent_ids), self.device)
        self.server_streams = RandomStreams(derive_keys(self.seeds, _SERVER_STREAM), self.device)
        self.eval_streams = RandomStreams(run_keys(self.seeds, self.n_agents, _EVAL_STREAM, self.agent_ids), self.device)
        if self.env is not None:
            seed = self.env_reset_seed
            self.sampler = EnvSampler(self.env, self.policy, self.streams, self.horizon_override, env_seed=seed,
                                      normalizer=self.normalizer, update_normalizer=True, stop_when_done=self.stop_when_done)
            self.eval_sampler = EnvSampler(
                self.eval_env if self.eval_env is not None else self.env, self.policy, self.eval_streams, self.horizon_override,
                env_seed=None if seed is None else combine_seed(seed, _EVAL_STREAM), normalizer=self.normalizer,
                stop_when_done=self.stop_when_done,
            )
            self.row_params = None
            return
        first = next(v for v in vars(self.agent_params).values() if isinstance(v, torch.Tensor))
        rows = torch.arange(self.n_agents).repeat(self.n_runs)
        self.row_params = index_params(self.agent_params, rows.to(first.device))
        self.sampler = KernelSampler(self.family, self.row_params, self.policy, self.streams, self.horizon_override, self.stop_when_done,
                                     self.normalizer, update_normalizer=True, capture=self.capture, capture_cache=self._capture_cache)
        self.eval_sampler = KernelSampler(
            self.family, self.row_params, self.policy, self.eval_streams, self.horizon_override, self.stop_when_done, self.normalizer,
            capture=self.capture, capture_cache=self._capture_cache,
        )

    @classmethod
    def from_env(
        cls, env: Any, policy: Any, seed: int | Any, gamma: float, horizon: int | None = None, eval_env: Any = None,
        normalizer: Any = None, agent_ids: Any = None, stop_when_done: bool = False,
    ) -> Federation:
        """A federation over the agents of a :class:`~fedrl_wrappers.FederatedVecEnv` (any backend).

        :param env: the federated env (``n_envs`` environments per agent); for ``R`` runs it holds
            the ``R·n`` agents run-major, each seeded by its own stream id (:func:`run_env_stream_ids`)
        :param policy: the flat policy
        :param seed: the run's seed (action streams, and the envs' first reset), or one seed per run
        :param gamma: discount
        :param horizon: last time index H (default: the env's ``max_episode_steps − 1``)
        :param eval_env: a separate env for evaluation rollouts (default: ``env``)
        :param normalizer: observation normalizer
        :param agent_ids: the agents' indices in the whole federation (see the class), for an env
            that holds only some of its agents
        :param stop_when_done: the samplers return the steps up to the last one an episode ran
            (:class:`~fedrl_algos.core.env_sampling.EnvSampler`)
        """
        # One run (an int seed): the envs' first reset is seeded by it. Seeds of several runs: the env
        # holds every run's agents, each seeded from its own stream id when the env was made.
        reset_seed = int(seed) if isinstance(seed, int) else None
        seeds = torch.as_tensor(seed, dtype=torch.int64).reshape(-1)
        return cls(None, None, policy, seeds, gamma, env=env, eval_env=eval_env, horizon_override=horizon, normalizer=normalizer,
                   env_reset_seed=reset_seed, agent_ids=agent_ids, stop_when_done=stop_when_done)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """Random-stream state of every consumer (training, server sampling, evaluation)."""
        return {
            "streams": self.streams.state_dict(),
            "server_streams": self.server_streams.state_dict(),
            "eval_streams": self.eval_streams.state_dict(),
        }

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Restore the random-stream state saved by :meth:`state_dict`."""
        self.streams.load_state_dict(state["streams"])
        self.server_streams.load_state_dict(state["server_streams"])
        self.eval_streams.load_state_dict(state["eval_streams"])

    def env_random_state(self) -> dict[str, Any] | None:
        """The random state of an env-backed federation's Gymnasium environments, as plain data: its
        training and evaluation samplers' (:meth:`~fedrl_algos.core.env_sampling.EnvSampler.random_state`).
        ``None`` for a family-backed federation, whose environments are pure functions of the streams."""
        if self.env is None:
            return None
        return {"train": self.sampler.random_state(), "eval": self.eval_sampler.random_state()}

    def load_env_random_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`env_random_state` returned (the evaluation sampler's after the training
        one's: when they share the environments, the evaluation rollouts were the later draws)."""
        if self.env is None:
            raise ValueError("env_random_state is for an env-backed federation; this one steps a family's kernels")
        self.sampler.set_random_state(state["train"])
        self.eval_sampler.set_random_state(state["eval"])

    @property
    def horizon(self) -> int:
        """Last time index H of an episode."""
        if self.env is not None:
            return int(self.sampler.horizon)
        if self.horizon_override is not None:
            return int(self.horizon_override)
        return int(self.family.horizon(self.agent_params))

    def broadcast(self, theta: torch.Tensor) -> torch.Tensor:
        """Server parameters ``[R, d]`` → every agent's copy ``[R, n, d]``."""
        return theta.unsqueeze(-2).expand(self.n_runs, self.n_agents, theta.shape[-1])

    def sample_agents(self, agents_per_round: int | None) -> torch.Tensor | None:
        """Agents sampled without replacement for one round, ``[R, r]`` in increasing order (``None``: all).

        Each run draws ``n`` uniforms from its server stream and keeps the ``r`` smallest (a uniformly
        random ``r``-subset); nothing is drawn for full participation.
        """
        if agents_per_round is None or agents_per_round >= self.n_agents:
            return None
        u = self.server_streams.uniform((self.n_agents,))
        return torch.argsort(u, dim=-1)[..., :agents_per_round].sort(dim=-1).values

    def participation(self, agents_per_round: int | None) -> torch.Tensor | None:
        """Mask ``[R, n]`` of agents sampled without replacement for one round (``None`` = all);
        the same draw as :meth:`sample_agents`."""
        agents = self.sample_agents(agents_per_round)
        return None if agents is None else self.agent_mask(agents)

    def agent_mask(self, agents: torch.Tensor) -> torch.Tensor:
        """The participation mask ``[R, n]`` (1.0 for the agents ``agents [R, r]``, else 0.0)."""
        return torch.zeros(self.n_runs, self.n_agents, device=agents.device).scatter_(-1, agents, 1.0)

    @property
    def can_select(self) -> bool:
        """Whether :meth:`select` can compute a subset of the agents on its own (family-backed
        federations; an env-backed one steps every agent's environments together)."""
        return self.env is None

    def select(self, agents: torch.Tensor) -> AgentSelection:
        """The agents ``agents [R, r]`` of every run as a federation batch of their own.

        The selection's sampler rolls out only those ``R·r`` rows: their task parameters and
        *copies* of their training streams (keys and counters), so what it draws for an agent is
        bitwise what this federation's sampler would draw for it at the same counters.
        :meth:`AgentSelection.write_back` moves the copies' counters back into this federation's
        streams; the other agents' streams do not advance. One agent of one run is ``select(torch.tensor([[i]]))``.

        :param agents: int64 agent indices ``[R, r]``, distinct within each run, in ``[0, n)``
        :raise ValueError: for an env-backed federation, or indices of the wrong shape, range or
            with repeats
        :raise TypeError: for indices that are not an integer tensor
        """
        if not self.can_select:
            raise ValueError("select needs a family-backed federation: an env-backed one (Federation.from_env) "
                             "steps every agent's environments together")
        if not isinstance(agents, torch.Tensor) or agents.is_floating_point() or agents.dtype == torch.bool or agents.is_complex():
            raise TypeError(f"agents must be an integer tensor [R, r], got {type(agents).__name__}"
                            + (f" of dtype {agents.dtype}" if isinstance(agents, torch.Tensor) else ""))
        if agents.dim() != 2 or agents.shape[0] != self.n_runs or agents.shape[1] < 1:
            raise ValueError(f"agents must have shape [{self.n_runs}, r] with r >= 1 (one row per run), got {list(agents.shape)}")
        agents = agents.to(device=self.streams.device, dtype=torch.int64)
        if bool(((agents < 0) | (agents >= self.n_agents)).any()):
            raise ValueError(f"agents must be agent indices in [0, {self.n_agents - 1}], got {agents.tolist()}")
        ordered = agents.sort(dim=-1).values
        if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
            raise ValueError(f"agents must be distinct within each run, got {agents.tolist()}")
        runs = torch.arange(self.n_runs, device=agents.device).unsqueeze(-1).expand_as(agents)
        streams = self.streams[(runs, agents)]
        first = next(v for v in vars(self.row_params).values() if isinstance(v, torch.Tensor))
        rows = index_params(self.row_params, (runs * self.n_agents + agents).reshape(-1).to(first.device))
        sampler = KernelSampler(self.family, rows, self.policy, streams, self.horizon_override, self.stop_when_done,
                                self.normalizer, update_normalizer=True, capture=self.capture, capture_cache=self._capture_cache)
        return AgentSelection(self, agents, streams, sampler)

    def local_round(
        self, theta: torch.Tensor, steps: LocalSteps, agents_per_round: int | None = None, per_agent_state: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Broadcast θ and run the local loop ``steps`` on the round's participating agents.

        * all agents (``agents_per_round`` ``None`` or ``>= n``): ``steps(sampler, broadcast(θ), identity)``;
        * ``r < n`` agents: only the sampled ``r`` per run are computed (:meth:`select`: ``R·r``
          rows, a round costs ``r/n`` of a full one) and only their streams advance;
        * ``r < n`` on an env-backed federation, or with ``per_agent_state`` (an estimator that holds
          per-agent settings, e.g. which agents are Byzantine): every agent is computed and the
          mask leaves the others out of the aggregate (their streams advance too).

        :param theta: server parameters ``[R, d]``
        :param steps: the local loop (:data:`LocalSteps`)
        :param agents_per_round: agents sampled per run (``None``: all)
        :param per_agent_state: compute every agent (see above)
        :return: the agents' parameters ``[R, n, d]`` (agents not computed hold θ) and the
            participation mask ``[R, n]`` (``None``: every agent)
        """
        agents = self.sample_agents(agents_per_round)
        if agents is None:
            return steps(self.sampler, self.broadcast(theta), _identity), None
        mask = self.agent_mask(agents)
        if not self.can_select or per_agent_state:
            return steps(self.sampler, self.broadcast(theta), _identity), mask
        chosen = self.select(agents)
        local = steps(chosen.sampler, chosen.broadcast(theta), chosen.gather)
        chosen.write_back()
        return chosen.scatter(local, self.broadcast(theta)), mask

    def evaluate(self, theta: torch.Tensor, n_trajectories: int) -> torch.Tensor:
        """Monte Carlo discounted return of every agent ``[R, n]`` (evaluation streams).

        :param theta: shared ``[R, d]`` or per-agent ``[R, n, d]`` parameters
        :param n_trajectories: rollouts per agent
        """
        if theta.dim() == 2:
            theta = self.broadcast(theta)
        traj = self.eval_sampler(theta, n_trajectories)
        return traj.returns(self.gamma).mean(-1)

    def adapted(self, theta: torch.Tensor, alpha: float, n_trajectories: int, baseline: str | None = None,
                critic: Any = None) -> torch.Tensor:
        """One policy-gradient adaptation step per agent from the evaluation streams: ``[R, n, d]``.

        :param theta: shared ``[R, d]`` or per-agent ``[R, n, d]`` parameters
        :param alpha: adaptation step size
        :param n_trajectories: trajectories of the step (0 returns ``theta`` per agent)
        :param baseline: baseline of the adaptation gradient (:mod:`fedrl_algos.core.adaptation`;
            ``None``: the paper's eq. (2))
        :param critic: with ``baseline="critic"``, every agent's critic (a
            :class:`~fedrl_algos.core.critic.CriticBaseline` of batch ``[R, n]``), used as it is (not fitted)
        """
        if theta.dim() == 2:
            theta = self.broadcast(theta)
        if alpha == 0 or n_trajectories == 0:
            return theta
        traj = self.eval_sampler(theta, n_trajectories)
        return theta + alpha * adaptation_gradient(self.policy, theta, traj, self.gamma, baseline, critic)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def participated(check: UpdateCheck, mask: torch.Tensor | None) -> torch.Tensor:
    """The agents ``[R, n]`` (bool) whose update the server used: sampled (``mask``; ``None``: all) and valid."""
    return check.valid if mask is None else check.valid & (mask > 0)


@dataclass
class AgentSelection:
    """Some agents of every run of a :class:`Federation`, as a batch of their own (:meth:`Federation.select`).

    :param federation: the federation the agents belong to
    :param agents: agent indices ``[R, r]``
    :param streams: copies of those agents' training streams (batch shape ``[R, r]``), advanced
        by :attr:`sampler`; :meth:`write_back` copies their counters into the federation's streams
    :param sampler: samples the ``R·r`` selected rows (a :class:`~fedrl_algos.core.sampling.KernelSampler`)
    """

    federation: Federation
    agents: torch.Tensor
    streams: RandomStreams
    sampler: KernelSampler

    @property
    def n_runs(self) -> int:
        return int(self.agents.shape[0])

    @property
    def n_agents(self) -> int:
        """Agents per run in the selection (``r``)."""
        return int(self.agents.shape[1])

    def broadcast(self, theta: torch.Tensor) -> torch.Tensor:
        """Server parameters ``[R, d]`` → the selected agents' copies ``[R, r, d]``."""
        return theta.unsqueeze(-2).expand(self.n_runs, self.n_agents, theta.shape[-1])

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The selected agents' rows ``[R, r, ...]`` of a per-agent tensor ``[R, n, ...]``."""
        index = self.agents.to(x.device).reshape(*self.agents.shape, *([1] * (x.dim() - 2)))
        return torch.take_along_dim(x, index, dim=1)

    def scatter(self, x: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        """A copy of ``into [R, n, ...]`` with the selected agents' rows replaced by ``x [R, r, ...]``."""
        index = self.agents.to(x.device).reshape(*self.agents.shape, *([1] * (x.dim() - 2))).expand_as(x)
        return torch.clone(into, memory_format=torch.contiguous_format).scatter_(1, index, x)

    def write_back(self) -> None:
        """Move the selected agents' stream counters back into the federation's training streams."""
        streams = self.federation.streams
        streams.counters = self.scatter(self.streams.counters, streams.counters)


def adapt_with_sampler(
    sampler: Any,
    policy: Any,
    theta: torch.Tensor,
    n_trajectories: int,
    steps: int = 1,
    step_size: float = 1.0,
    gamma: float = 0.9,
    baseline: str | None = None,
    critic: Any = None,
) -> tuple[torch.Tensor, list[Trajectories]]:
    """Personalize ``theta [*B, d]`` with ``steps`` policy-gradient steps (eq. (2)) drawn from ``sampler``.

    :param sampler: draws ``sampler(theta, m)`` trajectories of the tasks to adapt to
    :param policy: the flat policy
    :param theta: starting parameters ``[*B, d]``
    :param n_trajectories: trajectories per step
    :param steps: number of steps
    :param step_size: step size α
    :param gamma: discount
    :param baseline: baseline of the adaptation gradient: ``None`` (eq. (2)), ``"loo"`` (unbiased
        leave-one-out time-dependent mean), ``"mean"``, ``"linear"`` or ``"critic"`` (:mod:`fedrl_algos.core.adaptation`)
    :param critic: with ``baseline="critic"``, the rows' critics (a
        :class:`~fedrl_algos.core.critic.CriticBaseline` of batch ``[*B]``), used as they are (not fitted)
    :return: adapted parameters ``[*B, d]`` and the trajectories used
    """
    used = []
    for _ in range(steps):
        traj = sampler(theta, n_trajectories)
        theta = theta + step_size * adaptation_gradient(policy, theta, traj, gamma, baseline, critic)
        used.append(traj)
    return theta, used


def combine_seed(seed: int, salt: int) -> int:
    """A deterministic non-negative 62-bit seed derived from ``(seed, salt)`` (no overflow for any int64 seed)."""
    return int(derive_keys(int(seed), int(salt)).item()) & ((1 << 62) - 1)
