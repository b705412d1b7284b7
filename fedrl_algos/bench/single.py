"""``fedrl bench single``: one step of each family's single env against a reference, side by side.

How the numbers are made (also printed under the table):

* **µs/step**: ``env.step`` of ``gym.make(id)`` (so both sides carry Gymnasium's checker and
  order-enforcing wrappers), cycling through 64 actions drawn before the clock starts, with
  ``env.reset()`` whenever an episode ends (resets are part of the cost, as in training). The two
  envs of a row are timed in alternation, ``--repeats`` blocks each, and the fastest block of each
  is kept: on a machine shared with other processes, the minimum is the least disturbed figure;
* **references**: Gymnasium's ``CartPole-v1`` and ``Pendulum-v1`` for the two classic-control
  families; for the gridworld and arc navigation, which Gymnasium has no version of, a plain
  NumPy Gymnasium env written here (:class:`NumpyGridWorld`, :class:`NumpyArcNavigation`: a
  next-cell table and ``np.clip`` of the position, with the action check Gymnasium's own envs do);
* **SB3 PPO**: wall time of ``PPO("MlpPolicy", env, seed=0, device="cpu").learn(T)`` (SB3's
  default hyperparameters) on ``gym.make("fedrl/CartPole-v0")`` (agent 0) and on
  ``gym.make("CartPole-v1")``, alternated, fastest of ``--ppo-repeats`` each, with one torch
  thread by default (``--threads``): PPO's 64-unit MLP gains nothing from more, and on cores shared
  with other processes the waits of torch's intra-op threads vary a backward pass by 10× and more
  from one run to the next, which would swamp the environments' share.

A ratio is fedrl's time over the reference's (lower is better); the targets are 2× for one step
and 1.2× for PPO. No test asserts a timing: they depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

from fedrl_algos.cli.args import finish_bench, non_negative_int, positive_int
from fedrl_algos.common.learn import make_logger
from fedrl_envs.validation import check_int

__all__ = [
    "NumpyArcNavigation",
    "NumpyGridWorld",
    "SingleStepRecord",
    "PPORecord",
    "bench_single",
    "add_single_target",
]

_N_ACTIONS = 64
STEP_TARGET = 2.0
PPO_TARGET = 1.2


class NumpyGridWorld(gym.Env):
    """Plain NumPy reference of ``fedrl/GridWorld-v0`` (agent 0 by default): the benchmark's yardstick.

    :param goal: goal cell ``(x, y)``
    :param size: side of the grid
    :param horizon: last time index (``horizon + 1`` steps per episode)
    """

    metadata = {"render_modes": []}

    def __init__(self, goal: tuple[int, int] = (0, 0), size: int = 5, horizon: int = 15) -> None:
        self.observation_space = gym.spaces.Discrete(size * size)
        self.action_space = gym.spaces.Discrete(4)
        self._goal = goal[1] * size + goal[0]
        x, y = np.meshgrid(np.arange(size), np.arange(size))  # cell y * size + x
        moves = np.array([(0, -1), (0, 1), (-1, 0), (1, 0)])
        nx = np.clip(x.reshape(-1, 1) + moves[:, 0], 0, size - 1)
        ny = np.clip(y.reshape(-1, 1) + moves[:, 1], 0, size - 1)
        self._next = ny * size + nx  # [cell, action]
        self._starts = np.array([c for c in range(size * size) if c != self._goal])
        self._horizon = horizon
        self._s, self._t = 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self._s, self._t = int(self.np_random.choice(self._starts)), 0
        return self._s, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} ({type(action)}) invalid"
        reward = 1.0 if self._s == self._goal else 0.0
        self._s = int(self._next[self._s, action])
        self._t += 1
        return self._s, reward, False, self._t > self._horizon, {}


class NumpyArcNavigation(gym.Env):
    """Plain NumPy reference of ``fedrl/ArcNavigation-v0``: compass moves clipped to the box.

    :param goal: goal position
    :param goal_radius: reward radius
    :param step_size: length of a move
    :param horizon: last time index
    """

    metadata = {"render_modes": []}

    def __init__(self, goal: tuple[float, float] = (0.8 * math.cos(-0.5), 0.8 * math.sin(-0.5)), goal_radius: float = 0.2, step_size: float = 0.15, horizon: int = 20) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(8)
        angles = 2 * np.pi * np.arange(8) / 8
        self._moves = (step_size * np.stack([np.cos(angles), np.sin(angles)], 1)).astype(np.float32)
        self._goal = np.array(goal, np.float32)
        self._r2 = goal_radius**2
        self._horizon = horizon
        self._pos = np.zeros(2, np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self._t = 0
        return self._pos.copy(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} ({type(action)}) invalid"
        diff = self._pos - self._goal
        reward = float(diff @ diff <= self._r2)
        self._pos = np.clip(self._pos + self._moves[action], -1.0, 1.0)
        self._t += 1
        return self._pos.copy(), reward, False, self._t > self._horizon, {}


def _reference_spec(name: str, entry_point: Callable[..., gym.Env]) -> gym.envs.registration.EnvSpec:
    # gym.make of a spec that is not registered: the same wrappers as a registered id gets.
    return gym.envs.registration.EnvSpec(f"fedrl-bench/{name}-v0", entry_point=entry_point)


@dataclasses.dataclass
class SingleStepRecord:
    """One row of ``fedrl bench single``: one step of a fedrl single env against its reference."""

    env_id: str
    reference: str
    #: µs per ``env.step`` of ``gym.make(env_id)`` (resets at episode ends included)
    fedrl_us: float
    reference_us: float
    #: fedrl_us / reference_us
    ratio: float
    target: float


@dataclasses.dataclass
class PPORecord:
    """SB3 PPO on fedrl/CartPole-v0 against CartPole-v1, same steps and settings."""

    timesteps: int
    fedrl_s: float
    reference_s: float
    ratio: float
    target: float


def _actions(space: gym.Space, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return [int(a) for a in rng.integers(space.start, space.start + space.n, _N_ACTIONS)]
    return [rng.uniform(space.low, space.high).astype(space.dtype) for _ in range(_N_ACTIONS)]


def _step_block(env: gym.Env, actions: Sequence[Any], n_steps: int) -> float:
    """Seconds per step of ``n_steps`` steps, resetting at episode ends."""
    step, reset = env.step, env.reset
    start = time.perf_counter()
    for k in range(n_steps):
        _, _, terminated, truncated, _ = step(actions[k % _N_ACTIONS])
        if terminated or truncated:
            reset()
    return (time.perf_counter() - start) / n_steps


def _alternate(timers: Sequence[Callable[[], float]], repeats: int) -> list[float]:
    """Fastest of ``repeats`` calls of each timer, called in alternation (so load hits both alike)."""
    best = [float("inf")] * len(timers)
    for _ in range(repeats):
        for i, timer in enumerate(timers):
            best[i] = min(best[i], timer())
    return best


def bench_single(
    n_steps: int = 20000,
    repeats: int = 5,
    ppo_timesteps: int = 4096,
    ppo_repeats: int = 3,
    quick: bool = False,
    seed: int = 0,
    threads: int | None = 1,
    show: bool = True,
) -> tuple[list[SingleStepRecord], PPORecord | None]:
    """Time one step of every family's single env against its reference, and SB3 PPO on CartPole.

    :param n_steps: steps per timed block
    :param repeats: timed blocks per env (the fastest is kept)
    :param ppo_timesteps: PPO's ``total_timesteps`` on each side; 0 skips PPO
    :param ppo_repeats: PPO runs per side (the fastest is kept)
    :param quick: a smoke run (short blocks, a 256-step PPO with 128-step rollouts)
    :param seed: seed of the envs, the actions and PPO
    :param threads: torch intra-op threads while timing (restored after); ``None`` keeps torch's setting
    :param show: print the table
    """
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads))
    try:
        return _bench_single(n_steps, repeats, ppo_timesteps, ppo_repeats, quick, seed, show)
    finally:
        torch.set_num_threads(before)


def _bench_single(
    n_steps: int, repeats: int, ppo_timesteps: int, ppo_repeats: int, quick: bool, seed: int, show: bool
) -> tuple[list[SingleStepRecord], PPORecord | None]:
    import fedrl_envs  # noqa: F401  (registers the fedrl ids)

    n_steps, repeats = check_int("n_steps", n_steps), check_int("repeats", repeats)
    ppo_timesteps, ppo_repeats = check_int("ppo_timesteps", ppo_timesteps, 0), check_int("ppo_repeats", ppo_repeats)
    if quick:
        n_steps, repeats, ppo_timesteps, ppo_repeats = 500, 1, min(ppo_timesteps, 256), 1
    pairs = [
        ("fedrl/CartPole-v0", "CartPole-v1", "CartPole-v1"),
        ("fedrl/Pendulum-v0", "Pendulum-v1", "Pendulum-v1"),
        ("fedrl/GridWorld-v0", "plain NumPy", _reference_spec("NumpyGridWorld", NumpyGridWorld)),
        ("fedrl/ArcNavigation-v0", "plain NumPy", _reference_spec("NumpyArcNavigation", NumpyArcNavigation)),
    ]
    records = []
    for env_id, reference_name, reference in pairs:
        ours, ref = gym.make(env_id), gym.make(reference)
        actions = _actions(ours.action_space, seed)
        for env in (ours, ref):
            env.reset(seed=seed)
            _step_block(env, actions, min(n_steps, 1000))  # warm-up (and the checker's first-call checks)
        timers = [partial(_step_block, env, actions, n_steps) for env in (ours, ref)]
        fedrl_s, ref_s = _alternate(timers, repeats)
        records.append(SingleStepRecord(env_id, reference_name, fedrl_s * 1e6, ref_s * 1e6, fedrl_s / ref_s, STEP_TARGET))
        ours.close()
        ref.close()
    ppo = _bench_ppo(ppo_timesteps, ppo_repeats, seed, quick) if ppo_timesteps > 0 else None
    if show:
        print_single_table(records, ppo)
    return records, ppo


def _bench_ppo(timesteps: int, repeats: int, seed: int, quick: bool) -> PPORecord:
    from stable_baselines3 import PPO

    kwargs = {"n_steps": 128, "batch_size": 64, "n_epochs": 2} if quick else {}

    def run(env_id: str) -> float:
        model = PPO("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0, **kwargs)
        # SB3's default logger makes an empty SB3-<time> folder in the temp directory per learn call.
        model.set_logger(make_logger(0, None, "PPO", True))
        start = time.perf_counter()
        model.learn(total_timesteps=timesteps)
        return time.perf_counter() - start

    fedrl_s, ref_s = _alternate([lambda: run("fedrl/CartPole-v0"), lambda: run("CartPole-v1")], repeats)
    return PPORecord(timesteps, fedrl_s, ref_s, fedrl_s / ref_s, PPO_TARGET)


def print_single_table(records: Sequence[SingleStepRecord], ppo: PPORecord | None) -> None:
    """Print the records (plain text: the table is small)."""
    import torch

    header = ["fedrl env", "reference", "fedrl µs/step", "reference µs/step", "ratio", "target"]
    rows = [
        [r.env_id, r.reference, f"{r.fedrl_us:.2f}", f"{r.reference_us:.2f}", f"{r.ratio:.2f}x", f"<= {r.target:g}x"]
        for r in records
    ]
    if ppo is not None:
        rows.append([
            "SB3 PPO fedrl/CartPole-v0",
            f"PPO CartPole-v1, {ppo.timesteps} steps",
            f"{ppo.fedrl_s:.2f} s",
            f"{ppo.reference_s:.2f} s",
            f"{ppo.ratio:.2f}x",
            f"<= {ppo.target:g}x",
        ])
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    for line in [header, *rows]:
        print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))))
    print(
        f"fastest block of each side, timed in alternation; gym.make on both sides; {torch.get_num_threads()} torch thread(s); "
        "method: fedrl_algos/bench/single.py"
    )


def _cmd_bench_single(args: argparse.Namespace) -> int:
    records, ppo = bench_single(
        threads=args.threads,
        n_steps=args.steps,
        repeats=args.repeats,
        ppo_timesteps=args.ppo_timesteps,
        ppo_repeats=args.ppo_repeats,
        quick=args.quick,
        seed=args.seed,
    )
    finish_bench(args.json, {"steps": records, "ppo": ppo}, groups=True)
    return 0


def add_single_target(targets: Any) -> None:
    """Add ``fedrl bench single`` (see :func:`fedrl_algos.cli.bench.register`)."""
    p = targets.add_parser(
        "single",
        help="one step of each single env vs Gymnasium / plain NumPy, and SB3 PPO on CartPole",
        description="Microseconds per env.step of gym.make of each fedrl family next to Gymnasium's CartPole-v1 "
        "and Pendulum-v1 and plain NumPy gridworld and arc navigation envs, timed in the same process, and SB3 "
        "PPO on fedrl/CartPole-v0 against CartPole-v1; prints the ratios.",
    )
    p.add_argument("--steps", type=positive_int, default=20000, help="steps per timed block (default 20000)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed blocks per env; the fastest is kept (default 5)")
    p.add_argument("--ppo-timesteps", type=non_negative_int, default=4096, help="PPO total_timesteps per side; 0 skips PPO (default 4096)")
    p.add_argument("--ppo-repeats", type=positive_int, default=3, help="PPO runs per side; the fastest is kept (default 3)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads while timing (default 1)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    p.add_argument("--seed", type=int, default=0, help="seed of the envs, the actions and PPO (default 0)")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.set_defaults(func=_cmd_bench_single)
