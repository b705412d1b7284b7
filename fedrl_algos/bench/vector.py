"""``fedrl bench vector``: fedrl's batched classic-control envs against the vector envs users pick instead.

Every row times, in the same process and on the same random actions, env steps per second of

* **fedrl**: :class:`wrappers.FederatedVecEnv` on ``fedrl/CartPole-v0`` or ``fedrl/Pendulum-v0``
  with the family's 10 heterogeneous default agents (``n_envs / 10`` environments each), autoreset
  and action checks on;
* **gymnasium**: Gymnasium's own vector env: the NumPy ``CartPoleVectorEnv`` (``gym.make_vec(
  "CartPole-v1", n, vectorization_mode="vector_entry_point")``); Gymnasium ships no NumPy vector
  Pendulum, so Pendulum's baseline is ``SyncVectorEnv`` over ``Pendulum-v1`` (timed at
  ``min(n, sync_max_envs)`` envs: its cost is linear in the number of envs);
* **gymnax** (when installed): ``jax.jit(jax.vmap(env.step))`` of gymnax's ``CartPole-v1`` /
  ``Pendulum-v1`` (gymnax steps auto-reset), JAX on the CPU, called once per step and timed with
  ``block_until_ready``;
* **gymnax-scan** (when installed): gymnax as its users run it: one ``jax.jit`` of ``lax.scan``
  over :data:`SCAN_STEPS` steps of ``vmap(env.step)``, the random actions drawn inside the scan and
  the steps' observations, rewards and done flags returned stacked (a rollout's record), so one
  call is one XLA program per 128 steps;
* **envpool** (when installed): ``envpool.make_gymnasium(id, num_envs=n)`` with one thread per core.

All of them start from their own reset and take uniformly random actions drawn before the clock
starts (a block of 16 steps' worth, cycled). Ratios are fedrl / baseline. The optional ``bench``
extra installs gymnax and EnvPool; gymnax pins its own Gymnasium, so put it in a separate
environment (``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from fedrl_algos.cli.args import finish_bench, positive_int, set_threads

__all__ = ["VectorBenchRecord", "bench_vector", "add_vector_target", "BASELINES"]

_ACTION_BLOCK = 16
#: fedrl id -> the Gymnasium id its default agent reproduces
_GYMNASIUM_ID = {"fedrl/CartPole-v0": "CartPole-v1", "fedrl/Pendulum-v0": "Pendulum-v1"}
BASELINES = ("gymnasium", "gymnax", "gymnax-scan", "envpool")
#: steps of one ``lax.scan`` call of the ``gymnax-scan`` baseline
SCAN_STEPS = 128


@dataclasses.dataclass
class VectorBenchRecord:
    """One row of ``fedrl bench vector``: steps/s of fedrl and of each baseline at ``n_envs`` envs."""

    env_id: str
    n_envs: int
    device: str
    fedrl_steps_per_s: float
    #: baseline name -> steps/s (``None``: not installed or failed, see ``notes``)
    baseline_steps_per_s: dict[str, float | None]
    #: baseline name -> what was timed (e.g. the size SyncVectorEnv ran at) or why it is missing
    notes: dict[str, str]
    #: what fedrl's step kernel ran on (``FederatedVecEnv(kernels=)``)
    kernels: str = "torch"
    #: steps/s of fedrl's captured rollout (``rollout(capture=True)``: 128 steps of a policy in the
    #: loop and the step as one program, CUDA graphs on CUDA); ``None``: not timed
    captured_steps_per_s: float | None = None

    def ratio(self, baseline: str) -> float | None:
        """fedrl's steps/s over ``baseline``'s, or ``None`` when the baseline did not run."""
        rate = self.baseline_steps_per_s.get(baseline)
        return None if not rate else self.fedrl_steps_per_s / rate


def _rate(step: Callable[[int], Any], n_envs: int, min_time: float, sync: Callable[[Any], Any] | None = None) -> float:
    """Env steps/s of ``step(k)`` (one vector step of ``n_envs`` envs): the fastest block over ``min_time`` s.

    The calls run in blocks of about 20 ms (at least 16 steps, so that a block covers many
    episode ends), and the fastest block gives the rate: on cores that other processes share,
    the mean mostly measures how often the scheduler took the core away, and fedrl and every
    baseline are timed the same way.
    """
    import time

    out = None
    for k in range(3):
        out = step(k)
    if sync is not None:
        sync(out)
    start = time.perf_counter()
    out = step(3)
    if sync is not None:
        sync(out)
    block = max(16, int(0.02 / max(time.perf_counter() - start, 1e-7)))
    best, calls, begin = math.inf, 0, time.perf_counter()
    while calls < 2 * block or time.perf_counter() - begin < min_time:
        t0 = time.perf_counter()
        for _ in range(block):
            out = step(calls)
            calls += 1
        if sync is not None:
            sync(out)
        best = min(best, time.perf_counter() - t0)
    return block * n_envs / best


def _fedrl_rate(env_id: str, n_envs: int, device: str, min_time: float, seed: int, kernels: str = "torch") -> float:
    import torch

    import fedrl_envs
    from fedrl_wrappers import FederatedVecEnv

    family = fedrl_envs.get_family(env_id)
    n_agents = len(family.train_tasks)
    per_agent = max(n_envs // n_agents, 1)
    venv = FederatedVecEnv(env_id, per_agent, agents=list(range(n_agents)), device=device, seed=seed, kernels=kernels)
    try:
        venv.reset()
        space = venv.single_action_space
        gen = torch.Generator().manual_seed(seed)
        if hasattr(space, "n"):
            actions = torch.randint(0, int(space.n), (_ACTION_BLOCK, venv.num_envs), generator=gen)
        else:
            low, high = float(space.low.min()), float(space.high.max())
            actions = low + (high - low) * torch.rand((_ACTION_BLOCK, venv.num_envs, *space.shape), generator=gen)
        actions = actions.to(device)
        sync = (lambda _: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else None
        return _rate(lambda k: venv.step(actions[k % _ACTION_BLOCK]), venv.num_envs, min_time, sync)
    finally:
        venv.close()


def _hash_policy(space: Any) -> Callable[[Any], Any]:
    """A policy that is a hash of the observation (cheap, deterministic, spread over the actions):
    what the captured rollout runs in its loop, as gymnax-scan draws its actions inside the scan."""
    if hasattr(space, "n"):
        n = int(space.n)

        def discrete(obs: Any) -> Any:
            return (obs.reshape(*obs.shape[:2], -1).float() * 9973.1).sum(-1).floor().long() % n

        return discrete
    low, high = float(space.low.min()), float(space.high.max())

    def continuous(obs: Any) -> Any:
        import torch

        x = (obs.reshape(*obs.shape[:2], -1) * 9973.1).sum(-1, keepdim=True)
        return low + (high - low) * (torch.sin(x) * 0.5 + 0.5)

    return continuous


def _fedrl_captured_rate(env_id: str, n_envs: int, device: str, min_time: float, seed: int) -> float:
    """Env steps/s of fedrl's captured rollouts of ``SCAN_STEPS`` steps (after one that compiles)."""
    import torch

    import fedrl_envs
    from fedrl_wrappers import FederatedVecEnv

    n_agents = len(fedrl_envs.get_family(env_id).train_tasks)
    venv = FederatedVecEnv(env_id, max(n_envs // n_agents, 1), agents=list(range(n_agents)), device=device, seed=seed, kernels="torch")
    try:
        policy = _hash_policy(venv.single_action_space)
        venv.rollout(policy, n_steps=SCAN_STEPS, capture=True)  # compiles (and records the CUDA graphs)
        sync = (lambda _: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else None
        return SCAN_STEPS * _rate(lambda k: venv.rollout(policy, n_steps=SCAN_STEPS, capture=True).rewards, venv.num_envs, min_time, sync)
    finally:
        venv.close()


def _numpy_actions(space: Any, n_envs: int, seed: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(seed)
    if hasattr(space, "n"):
        return rng.integers(0, int(space.n), size=(_ACTION_BLOCK, n_envs))
    return rng.uniform(space.low, space.high, size=(_ACTION_BLOCK, n_envs, *space.shape)).astype(space.dtype)


def _gymnasium_rate(env_id: str, n_envs: int, min_time: float, seed: int, sync_max_envs: int) -> tuple[float, str]:
    import gymnasium as gym

    gym_id = _GYMNASIUM_ID[env_id]
    if gym.spec(gym_id).vector_entry_point is not None:
        venv = gym.make_vec(gym_id, n_envs, vectorization_mode="vector_entry_point")
        note = f"{type(venv.unwrapped).__name__} x {n_envs}"
    else:
        n_envs = min(n_envs, sync_max_envs)
        venv = gym.make_vec(gym_id, n_envs, vectorization_mode="sync")
        note = f"SyncVectorEnv x {n_envs}"
    try:
        venv.reset(seed=seed)
        actions = _numpy_actions(venv.single_action_space, n_envs, seed)
        return _rate(lambda k: venv.step(actions[k % _ACTION_BLOCK]), n_envs, min_time), note
    finally:
        venv.close()


def _gymnax_rate(env_id: str, n_envs: int, min_time: float, seed: int) -> tuple[float, str]:
    import gymnax
    import jax

    env, env_params = gymnax.make(_GYMNASIUM_ID[env_id])
    keys = jax.random.split(jax.random.PRNGKey(seed), n_envs)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, env_params)
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    space = env.action_space(env_params)
    action_keys = jax.random.split(jax.random.PRNGKey(seed + 1), _ACTION_BLOCK * n_envs).reshape(_ACTION_BLOCK, n_envs, -1)
    actions = jax.vmap(jax.vmap(space.sample))(action_keys)
    step_keys = jax.random.split(jax.random.PRNGKey(seed + 2), _ACTION_BLOCK * n_envs).reshape(_ACTION_BLOCK, n_envs, -1)
    carry = {"state": state}

    def one(k: int) -> Any:
        out = step(step_keys[k % _ACTION_BLOCK], carry["state"], actions[k % _ACTION_BLOCK], env_params)
        carry["state"] = out[1]
        return out[0]

    return _rate(one, n_envs, min_time, sync=lambda out: out.block_until_ready()), f"jit(vmap) on {jax.devices()[0].platform}"


def _gymnax_scan_rate(env_id: str, n_envs: int, min_time: float, seed: int) -> tuple[float, str]:
    import gymnax
    import jax

    env, env_params = gymnax.make(_GYMNASIUM_ID[env_id])
    _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.PRNGKey(seed), n_envs), env_params)
    space = env.action_space(env_params)
    step, sample = jax.vmap(env.step, in_axes=(0, 0, 0, None)), jax.vmap(space.sample)

    def body(carry: Any, _: Any) -> Any:
        state, key = carry
        key, action_key, step_key = jax.random.split(key, 3)
        actions = sample(jax.random.split(action_key, n_envs))
        # (obs, state, reward, done, info), or from gymnax 1.0 (obs, state, reward, terminated, truncated, info)
        out = step(jax.random.split(step_key, n_envs), state, actions, env_params)
        return (out[1], key), (out[0], out[2], *out[3:-1])

    @jax.jit
    def run(state: Any, key: Any) -> Any:
        return jax.lax.scan(body, (state, key), None, length=SCAN_STEPS)

    carry = {"value": (state, jax.random.PRNGKey(seed + 1))}

    def block(_: int) -> Any:
        carry["value"], record = run(*carry["value"])
        return record[1]

    rate = _rate(block, n_envs * SCAN_STEPS, min_time, sync=lambda out: out.block_until_ready())
    return rate, f"jit(lax.scan of {SCAN_STEPS} vmap steps, actions drawn inside) on {jax.devices()[0].platform}"


def _envpool_rate(env_id: str, n_envs: int, min_time: float, seed: int) -> tuple[float, str]:
    import envpool

    threads = os.cpu_count() or 1
    venv = envpool.make_gymnasium(_GYMNASIUM_ID[env_id], num_envs=n_envs, num_threads=threads, seed=seed)
    try:
        venv.reset()
        actions = _numpy_actions(venv.action_space, n_envs, seed)
        return _rate(lambda k: venv.step(actions[k % _ACTION_BLOCK]), n_envs, min_time), f"{threads} threads"
    finally:
        venv.close()


def bench_vector(
    sizes: Sequence[int] = (1_000, 10_000, 100_000),
    env_ids: Sequence[str] = ("fedrl/CartPole-v0", "fedrl/Pendulum-v0"),
    baselines: Sequence[str] = BASELINES,
    device: str = "cpu",
    min_time: float = 1.0,
    sync_max_envs: int = 1_000,
    seed: int = 0,
    show: bool = True,
    kernels: str = "auto",
    captured: bool = False,
) -> list[VectorBenchRecord]:
    """Time fedrl's federated env against each installed baseline; one record per env and size.

    :param sizes: total environments (fedrl's are split evenly over the family's 10 default agents)
    :param env_ids: ``fedrl/CartPole-v0`` and/or ``fedrl/Pendulum-v0``
    :param baselines: any of ``"gymnasium"``, ``"gymnax"``, ``"gymnax-scan"``, ``"envpool"``; one not installed is
        reported as missing, not an error
    :param device: torch device of fedrl's env (the baselines run where they run: CPU)
    :param min_time: seconds per timing
    :param sync_max_envs: the largest size Gymnasium's SyncVectorEnv (Pendulum) is timed at
    :param seed: seed of the envs and of the random actions
    :param show: print the table
    :param kernels: what fedrl's step kernel runs on, ``"torch"``, ``"numpy"`` or ``"numba"``
        (``FederatedVecEnv(kernels=)``); ``"numba"`` (the fused step) where the family has one, torch
        for the others; ``"auto"`` (default): fedrl's fastest path, the fused step where the family
        has one, the device is the CPU and Numba is installed, torch otherwise. Each record's
        ``kernels`` says what ran
    """
    import fedrl_envs
    from fedrl_envs.fused import numba_available

    if kernels not in ("auto", "torch", "numpy", "numba"):
        raise ValueError(f'kernels must be "auto", "torch", "numpy" or "numba", got {kernels!r}')

    for env_id in env_ids:
        if env_id not in _GYMNASIUM_ID:
            raise ValueError(f"env_ids must be among {sorted(_GYMNASIUM_ID)}, got {env_id!r}")
    for name in baselines:
        if name not in BASELINES:
            raise ValueError(f"baselines must be among {list(BASELINES)}, got {name!r}")
    runners: dict[str, Callable[[str, int], tuple[float, str]]] = {
        "gymnasium": lambda e, n: _gymnasium_rate(e, n, min_time, seed, sync_max_envs),
        "gymnax": lambda e, n: _gymnax_rate(e, n, min_time, seed),
        "gymnax-scan": lambda e, n: _gymnax_scan_rate(e, n, min_time, seed),
        "envpool": lambda e, n: _envpool_rate(e, n, min_time, seed),
    }
    records = []
    for env_id in env_ids:
        fused = fedrl_envs.get_family(env_id).fused_kernels
        if kernels == "auto":
            row_kernels = "numba" if fused and device == "cpu" and numba_available() else "torch"
        else:
            row_kernels = "torch" if kernels == "numba" and not fused else kernels
        for n_envs in sizes:
            fedrl_rate = _fedrl_rate(env_id, n_envs, device, min_time, seed, row_kernels)
            captured_rate = _fedrl_captured_rate(env_id, n_envs, device, min_time, seed) if captured else None
            rates: dict[str, float | None] = {}
            notes: dict[str, str] = {}
            for name in baselines:
                try:
                    rates[name], notes[name] = runners[name](env_id, n_envs)
                except ImportError as err:
                    rates[name], notes[name] = None, f"not installed ({err.name})"
            records.append(VectorBenchRecord(env_id, n_envs, device, fedrl_rate, rates, notes, row_kernels, captured_rate))
    if show:
        print_vector_table(records)
    return records


def print_vector_table(records: Sequence[VectorBenchRecord]) -> None:
    """Print the records: steps/s of fedrl and each baseline, and fedrl's ratio to each."""
    import torch

    names = list(dict.fromkeys(n for r in records for n in r.baseline_steps_per_s))
    captured = any(r.captured_steps_per_s is not None for r in records)
    header = ["env", "envs", "kernels", "fedrl/s", *(["captured/s"] if captured else []), *[f"{n}/s" for n in names],
              *[f"vs {n}" for n in names], *([f"captured vs {n}" for n in names] if captured else [])]
    lines = [header]
    for r in records:
        rates = [r.baseline_steps_per_s.get(n) for n in names]
        ratios = [r.ratio(n) for n in names]
        fast = r.captured_steps_per_s
        captured_ratios = [None if not (x and fast) else fast / x for x in rates]
        lines.append(
            [
                r.env_id.split("/")[-1],
                str(r.n_envs),
                r.kernels,
                f"{r.fedrl_steps_per_s:.3g}",
                *(["-" if fast is None else f"{fast:.3g}"] if captured else []),
                *["-" if x is None else f"{x:.3g}" for x in rates],
                *["-" if x is None else f"{x:.2f}x" for x in ratios],
                *(["-" if x is None else f"{x:.2f}x" for x in captured_ratios] if captured else []),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
    notes = sorted({f"{r.env_id.split('/')[-1]} {n}: {note}" for r in records for n, note in r.notes.items()})
    print(f"env steps per second, random actions, autoreset; fedrl on {records[0].device if records else '-'} "
          f"with {torch.get_num_threads()} torch threads; method: fedrl_algos/bench/vector.py")
    for note in notes:
        print(f"  {note}")


def _cmd(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    sizes = args.sizes or ((1_000,) if args.quick else (1_000, 10_000, 100_000))
    records = bench_vector(
        sizes=sizes,
        env_ids=[f"fedrl/{e}-v0" for e in args.envs],
        baselines=args.baselines,
        device=args.device,
        min_time=0.05 if args.quick else args.min_time,
        seed=args.seed,
        kernels=args.kernels,
        captured=args.captured,
    )
    finish_bench(args.json, records)
    return 0


def add_vector_target(targets: argparse._SubParsersAction) -> None:
    """Add ``fedrl bench vector`` to the bench sub-commands."""
    p = targets.add_parser(
        "vector",
        help="fedrl's CartPole/Pendulum vs Gymnasium's vector envs, gymnax and EnvPool",
        description="Env steps per second of fedrl's heterogeneous CartPole and Pendulum federations next to "
        "Gymnasium's own vector env, gymnax (jit) and EnvPool when installed, timed in the same process.",
    )
    p.add_argument("--sizes", type=positive_int, nargs="+", help="total envs (default 1000 10000 100000)")
    p.add_argument("--envs", nargs="+", choices=["CartPole", "Pendulum"], default=["CartPole", "Pendulum"], help="families to time")
    p.add_argument("--baselines", nargs="+", choices=list(BASELINES), default=list(BASELINES), help="baselines to time (missing ones are reported)")
    p.add_argument("--device", default="cpu", help="torch device of fedrl's env")
    p.add_argument("--kernels", choices=["auto", "torch", "numpy", "numba"], default="auto",
                   help="what fedrl's step kernel runs on (numpy, numba: CPU only; numba: the fused step where the family has "
                        "one; auto, the default: numba where it applies and Numba is installed, else torch)")
    p.add_argument("--captured", action="store_true",
                   help=f"also time fedrl's captured rollout: {SCAN_STEPS} steps of a policy in the loop and the step as one program "
                   "(CUDA graphs on CUDA), the way gymnax-scan runs")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds per timing (default 1)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1000 envs, tiny timings")
    p.add_argument("--seed", type=int, default=0, help="seed of the envs and the random actions")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd)
