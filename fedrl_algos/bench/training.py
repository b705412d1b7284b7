"""``fedrl bench training``: env steps per second of whole training rounds against the bare env.

For each configuration (the paper settings' defaults of MFPO and FedPG-BR on ``fedrl/CartPole-v0``
and Per-FedAvg-PG on ``fedrl/ArcNavigation-v0``, the latter also with ``FastMlpPolicy(kernels="numba")``,
when Numba is installed) it times ``learn`` over whole rounds, after one
warm-up round, ``repeats`` times, and reports the median. Everything a round does (policy forwards
in the rollout, sampling, the estimators, aggregation) is in that figure.

**Env steps** are the steps taken inside episodes: every trajectory the algorithm's samplers return
(the agents' and, for FedPG-BR, the server's) counts its steps up to and including the one that
terminated it, or all ``H + 1`` when it ran to the horizon (the sum of its ``mask``). The
samplers are wrapped for the timed rounds to add these up (:class:`CountingSampler`). The model's
own ``num_timesteps`` is reported next to them as **budget steps**: it charges the full horizon to
every trajectory (``trajectories × (H + 1)``), so on CartPole, whose episodes under a fresh policy
end after about 20 of 500 steps, it is about 25 times the steps that ran.

Next to it, the bare native vector env of the same agents at the batch the algorithm samples at
(its trajectories per agent per sampling call) steps with random actions drawn before the clock
starts, with autoreset: every one of its steps is a step inside an episode, counted the same way.
The fraction is training / bare: 1.0 would mean the learner costs nothing beyond stepping its envs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

from fedrl_algos.cli.args import finish_bench, positive_int, print_columns, set_threads
from fedrl_algos.core.capture import resolve_capture
from fedrl_algos.core.sampling import Sampler

__all__ = ["TrainingBenchRecord", "CountingSampler", "bench_training", "add_training_target", "agent_kwargs_for", "CONFIGS"]

#: name -> (algorithm class name, policy, env id, policy kwargs)
CONFIGS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "mfpo-cartpole": ("MFPO", "MlpPolicy", "fedrl/CartPole-v0", {}),
    "fedpg_br-cartpole": ("FedPGBR", "MlpPolicy", "fedrl/CartPole-v0", {}),
    "per_fedavg_pg-arc": ("PerFedAvgPG", "MlpPolicy", "fedrl/ArcNavigation-v0", {}),
    # the compiled rollouts and gradients of FastMlpPolicy (fedrl_algos.policies.mlp.compiled); needs Numba
    "per_fedavg_pg-arc-numba": ("PerFedAvgPG", "FastMlpPolicy", "fedrl/ArcNavigation-v0", {"kernels": "numba"}),
}


@dataclasses.dataclass
class TrainingBenchRecord:
    """One row of ``fedrl bench training`` (medians over the repeats)."""

    config: str
    n_agents: int
    envs_per_agent: int
    rounds: int
    repeats: int
    #: steps inside episodes of one timed block of ``rounds`` rounds (median over the repeats)
    env_steps: int
    #: ``num_timesteps`` of the same block: trajectories × (H + 1)
    budget_steps: int
    #: the model's own count of steps inside episodes of the trajectories it used, where it keeps
    #: one (MFPO, FedPG-BR: ``env_steps_per_agent · n + server_env_steps``; FedPG-BR's agents use
    #: B_t of the B_max trajectories they sample); ``None`` otherwise
    algorithm_env_steps: int | None
    seconds: float
    training_steps_per_s: float
    bare_env_steps_per_s: float
    #: whether the rollouts ran captured (:mod:`fedrl_algos.core.capture`)
    captured: bool = False

    @property
    def fraction(self) -> float:
        """Training env steps/s over the bare env's at the same batch."""
        return self.training_steps_per_s / self.bare_env_steps_per_s

    @property
    def budget_over_env_steps(self) -> float:
        """How many times ``num_timesteps`` overstates the steps inside episodes."""
        return self.budget_steps / self.env_steps


class CountingSampler(Sampler):
    """A sampler that adds up the steps inside episodes of every trajectory batch it returns.

    It delegates to ``inner`` (reading any other attribute from it), and the samplers made by
    :meth:`with_policy` (FedPG-BR's agents act through one) share its count.

    :param inner: the sampler to count
    :param count: the running count to share (default: a new one)
    """

    def __init__(self, inner: Any, count: list[Any] | None = None) -> None:
        self.inner = inner
        self._count = [0] if count is None else count

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (e.g. while unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def steps(self) -> int:
        """Steps inside episodes of every batch returned so far."""
        return int(self._count[0])

    def __call__(self, theta: Any, n_trajectories: int) -> Any:
        import torch

        traj = self.inner(theta, n_trajectories)
        # Kept as a tensor (no device synchronization per call); float64 so the sum stays exact.
        self._count[0] = self._count[0] + traj.mask.sum(dtype=torch.float64)
        return traj

    def with_policy(self, policy: Any) -> CountingSampler:
        return CountingSampler(self.inner.with_policy(policy), self._count)


def _count_steps(model: Any) -> list[CountingSampler]:
    """Wrap the model's samplers that training draws from (the agents'; FedPG-BR's server's)."""
    counters = [CountingSampler(model.federation.sampler)]
    model.federation.sampler = counters[0]
    if getattr(model, "server_sampler", None) is not None:
        counters.append(CountingSampler(model.server_sampler, counters[0]._count))
        model.server_sampler = counters[1]
    return counters


def agent_kwargs_for(env_id: str, n_agents: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n_agents`` heterogeneous agents of a family, drawn with ``seed`` (the GPU issue's settings):
    CartPole's pole ``length`` ~ U(0.3, 0.9) and ``masscart`` ~ U(0.5, 1.5); arc navigation's goals
    at uniform angles on the arc of radius 0.8."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if env_id == "fedrl/CartPole-v0":
        return [{"length": float(a), "masscart": float(b)} for a, b in zip(rng.uniform(0.3, 0.9, n_agents), rng.uniform(0.5, 1.5, n_agents), strict=True)]
    if env_id == "fedrl/ArcNavigation-v0":
        angles = rng.uniform(-np.pi / 2, np.pi / 2, n_agents)
        return [{"goal": (float(0.8 * np.cos(a)), float(0.8 * np.sin(a)))} for a in angles]
    raise ValueError(f"agents are drawn for fedrl/CartPole-v0 and fedrl/ArcNavigation-v0, not {env_id}")


def _sampling_batch(model: Any) -> int:
    """Trajectories per agent the model's agents sample in one call."""
    batch = getattr(model, "trajectories_per_call", None)
    if batch is None:
        raise ValueError(f"cannot tell the sampling batch of {type(model).__name__}")
    return int(batch)


def _bare_rate(model: Any, envs_per_agent: int, min_time: float, seed: int) -> float:
    """Env steps/s of the native vector env of the model's agents (autoreset, random actions)."""
    import torch

    from fedrl_envs.vector import FamilyVectorEnv

    venv = FamilyVectorEnv(model.family, model.agent_params, n_envs=envs_per_agent, device=model.device, seed=seed)
    venv.reset()
    space = venv.single_action_space
    gen = torch.Generator().manual_seed(seed)
    if hasattr(space, "n"):
        actions = torch.randint(0, int(space.n), (16, venv.num_envs), generator=gen)
    else:
        actions = torch.rand((16, venv.num_envs, *space.shape), generator=gen) * 2 - 1
    actions = actions.to(venv.device)
    for k in range(3):
        venv.step(actions[k])
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < min_time:
        venv.step(actions[calls % 16])
        calls += 1
    rate = calls * venv.num_envs / (time.perf_counter() - start)
    venv.close()
    return rate


def _model_env_steps(model: Any) -> float | None:
    """The model's own count of steps inside used episodes so far (``None`` when it keeps none)."""
    per_agent = getattr(model, "env_steps_per_agent", None)
    if per_agent is None:
        return None
    return per_agent * model.n_agents + getattr(model, "server_env_steps", 0.0)


def _time_rounds(model: Any, rounds: int, counter: CountingSampler) -> tuple[float, int, int, int | None]:
    """Seconds, steps inside episodes, budget steps and the model's own count of ``rounds`` rounds."""
    steps0, budget0, own0 = counter.steps, model.num_timesteps, _model_env_steps(model)
    start = time.perf_counter()
    model.learn(total_rounds=rounds, reset_num_timesteps=False)
    steps = counter.steps  # also the synchronization point on an accelerator
    elapsed = time.perf_counter() - start
    own1 = _model_env_steps(model)
    own = None if own0 is None or own1 is None else round(own1 - own0)
    return elapsed, steps - steps0, int(model.num_timesteps - budget0), own


def bench_training(
    configs: Sequence[str] = tuple(CONFIGS),
    rounds: int = 2,
    repeats: int = 3,
    device: str = "cpu",
    min_time: float = 1.0,
    seed: int = 0,
    show: bool = True,
    capture: Any = "auto",
    n_agents: int | None = None,
) -> list[TrainingBenchRecord]:
    """Time whole training rounds of each configuration and the bare env at the same batch.

    :param configs: names from :data:`CONFIGS`
    :param rounds: rounds per timed block (after one warm-up round)
    :param repeats: timed blocks (training continues from one to the next) and bare-env timings;
        the medians are reported
    :param device: torch device
    :param min_time: seconds of each bare-env timing
    :param seed: seed of the models and envs
    :param show: print the table
    :param capture: the models' ``capture`` (:mod:`fedrl_algos.core.capture`: ``"auto"`` is on on CUDA)
    :param n_agents: that many heterogeneous agents (:func:`agent_kwargs_for`) instead of the family's
        training tasks
    """
    import fedrl_algos
    from fedrl_envs.fused import numba_available
    from fedrl_envs.validation import check_int

    for name in configs:
        if name not in CONFIGS:
            raise ValueError(f"configs must be among {list(CONFIGS)}, got {name!r}")
    rounds = check_int("rounds", rounds, 1)
    repeats = check_int("repeats", repeats, 1)
    records = []
    for name in configs:
        cls_name, policy, env_id, policy_kwargs = CONFIGS[name]
        if policy_kwargs.get("kernels") == "numba" and not numba_available():
            print(f"fedrl bench training: {name} skipped (it needs Numba: pip install 'fedrl[fast]')")
            continue
        policy_class = getattr(fedrl_algos, policy) if policy == "FastMlpPolicy" else policy
        agents = None if n_agents is None else agent_kwargs_for(env_id, n_agents, seed)
        model = getattr(fedrl_algos, cls_name)(policy_class, env_id, seed=seed, device=device, policy_kwargs=dict(policy_kwargs),
                                               agent_kwargs=agents)
        model.capture = capture
        model.learn(total_rounds=1)  # the warm-up round also compiles a captured rollout
        counter = _count_steps(model)[0]
        blocks = [_time_rounds(model, rounds, counter) for _ in range(repeats)]
        batch = _sampling_batch(model)
        bare = [_bare_rate(model, batch, min_time, seed) for _ in range(repeats)]
        # The median block by rate, and its own step counts (not medians taken field by field).
        elapsed, steps, budget, own = sorted(blocks, key=lambda b: b[1] / b[0])[(repeats - 1) // 2]
        records.append(
            TrainingBenchRecord(
                config=name,
                n_agents=model.n_agents,
                envs_per_agent=batch,
                rounds=rounds,
                repeats=repeats,
                env_steps=steps,
                budget_steps=budget,
                algorithm_env_steps=own,
                seconds=elapsed,
                training_steps_per_s=steps / elapsed,
                bare_env_steps_per_s=statistics.median(bare),
                captured=resolve_capture(capture, model.device),
            )
        )
    if show:
        print_training_table(records)
    return records


def print_training_table(records: Sequence[TrainingBenchRecord]) -> None:
    """Print the records with the training / bare-env fraction."""
    import torch

    header = ["config", "agents x envs", "rounds", "budget steps", "env steps", "training/s", "bare env/s", "fraction"]
    lines = [header] + [
        [r.config + (" (captured)" if r.captured else ""), f"{r.n_agents} x {r.envs_per_agent}", str(r.rounds), str(r.budget_steps), str(r.env_steps),
         f"{r.training_steps_per_s:.3g}", f"{r.bare_env_steps_per_s:.3g}", f"{r.fraction:.3f}"]
        for r in records
    ]
    print_columns(lines)
    repeats = records[0].repeats if records else 0
    print(f"env steps = steps inside episodes (the trajectories' masks), budget steps = num_timesteps (trajectories x (H+1)); "
          f"median of {repeats} timings of whole learn() rounds vs the bare native vector env (autoreset) at the same batch; "
          f"{torch.get_num_threads()} torch threads; method: fedrl_algos/bench/training.py")


def _cmd(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    records = []
    for n_agents in args.agents or [None]:
        records += bench_training(configs=args.configs, rounds=1 if args.quick else args.rounds, repeats=1 if args.quick else args.repeats,
                                  device=args.device, min_time=0.05 if args.quick else 1.0, seed=args.seed,
                                  capture={"auto": "auto", "on": True, "off": False}[args.capture], n_agents=n_agents)
    finish_bench(args.json, [dataclasses.asdict(r) | {"fraction": r.fraction, "budget_over_env_steps": r.budget_over_env_steps}
                             for r in records])
    return 0


def add_training_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench training`` to the bench sub-commands."""
    p = targets.add_parser(
        "training",
        help="env steps/s of whole training rounds vs the bare env at the same batch",
        description="Env steps per second of MFPO and FedPG-BR on CartPole and Per-FedAvg-PG on arc navigation, "
        "whole learn() rounds, next to the bare native vector env of the same agents at the same batch.",
    )
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="configurations to time")
    p.add_argument("--rounds", type=positive_int, default=2, help="rounds per timed block, after one warm-up round (default 2)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed blocks and bare-env timings; medians shown (default 3)")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="a smoke run: one timed round once, tiny env timing")
    p.add_argument("--seed", type=int, default=0, help="seed of the models and envs")
    p.add_argument("--agents", type=positive_int, nargs="+", metavar="N",
                   help="time federations of N heterogeneous agents each (CartPole: pole length and cart mass drawn; arc: goals on "
                   "the arc of radius 0.8) instead of the families' training tasks")
    p.add_argument("--capture", choices=("auto", "on", "off"), default="auto",
                   help="captured rollouts (one compiled step, CUDA graphs on CUDA): auto = on CUDA only (default auto)")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)
