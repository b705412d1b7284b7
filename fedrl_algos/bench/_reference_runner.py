"""Run a reference implementation's own training loop for a fixed number of rounds and time it.

Used by ``fedrl bench reference`` (:mod:`fedrl_algos.bench.reference`), always in a fresh
subprocess: the reference code imports top-level modules with generic names (``util``, ``agent``,
``worker``, ``options``), seeds the global RNGs and keeps settings in module globals, so it must not
share an interpreter with fedrl or with the other reference. Nothing of the reference is copied
here: its files are imported from the directory given on the command line and run unchanged, with
only these substitutions (each documented in ``docs/benchmarks.md``):

* ``gym`` is Gymnasium's ``CartPole-v1`` behind the old ``gym`` API both references were written
  for (``reset() -> obs``, ``step() -> (obs, reward, done, info)``, ``env.seed(s)``), since
  ``gym`` itself does not install next to Gymnasium 1.x; the wrapper counts every env step.
* ``wandb`` (imported, never used by MFPO) and ``sklearn`` (FedPG-BR: metrics of the
  TensorBoard logging, which is off) are empty modules when they are not installed.
* Evaluation and checkpointing are left out of the timed rounds, as ``learn()`` does not do them:
  MFPO's ``Server.log`` (10 test episodes a round) and ``Server.save_model``; FedPG-BR's
  ``Agent.start_validating`` (10 validation episodes a round) becomes the round boundary that stops
  the run after the requested rounds.
* FedPG-BR's ``torch.multiprocessing.Pool(num_worker)`` becomes an in-process ``starmap``, so
  both sides run on one core with one torch thread.

Usage: ``python -m fedrl_algos.bench._reference_runner {mfpo,fedpg_br} DIR --rounds R --warmup W --out JSON``,
from a scratch directory: the references write their logs and reports into the working directory.
The JSON holds ``rounds``, ``seconds`` and ``env_steps`` of the timed rounds (after the warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import itertools
import json
import runpy
import sys
import time
import types
from pathlib import Path
from typing import Any

#: env steps taken by every env the reference made, since the start of the process
_STEPS = [0]


class _OldGymEnv:
    """A Gymnasium env behind the pre-0.26 ``gym`` API, counting its steps."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self._seed: int | None = None
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.unwrapped = env.unwrapped
        self.spec = env.spec

    def seed(self, seed: int | None = None) -> list[int | None]:
        # The old API seeded the next reset; Gymnasium takes the seed at reset.
        self._seed = seed
        return [seed]

    def reset(self) -> Any:
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None
        return obs

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        _STEPS[0] += 1
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, float(reward), bool(terminated or truncated), info

    def render(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        self._env.close()


class _AbsentModule(types.ModuleType):
    """Stands in for a package the timed code path imports but never calls; any use raises."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def absent(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{self.__name__}.{attr} was called, but {self.__name__} is not installed (stubbed by the benchmark)")

        return absent


def _install_shims() -> None:
    import gymnasium

    gym = types.ModuleType("gym")
    gym.make = lambda env_id, **kwargs: _OldGymEnv(gymnasium.make(env_id, **kwargs))  # type: ignore[attr-defined]
    gym.spaces = gymnasium.spaces  # type: ignore[attr-defined]
    gym.Env = gymnasium.Env  # type: ignore[attr-defined]
    sys.modules["gym"] = gym
    sys.modules["gym.spaces"] = gymnasium.spaces
    for name, submodules in (("wandb", ()), ("sklearn", ("metrics", "linear_model"))):
        if importlib.util.find_spec(name) is not None:
            continue
        module = _AbsentModule(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
        for sub in submodules:
            child = _AbsentModule(f"{name}.{sub}")
            child.__spec__ = importlib.machinery.ModuleSpec(f"{name}.{sub}", None)
            setattr(module, sub, child)
            sys.modules[f"{name}.{sub}"] = child


class _Done(Exception):
    """Raised at the round boundary after the last timed round."""


class _Clock:
    """Time and env-step marks at round boundaries."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, int]] = []

    def mark(self) -> None:
        self.marks.append((time.perf_counter(), _STEPS[0]))

    def result(self, warmup: int) -> dict[str, Any]:
        (t0, s0), (t1, s1) = self.marks[warmup], self.marks[-1]
        rounds = len(self.marks) - 1 - warmup
        return {"rounds": rounds, "seconds": t1 - t0, "env_steps": s1 - s0}


def run_mfpo(code_dir: Path, rounds: int, warmup: int, n_agents: int, trajectories: int, local_steps: int, seed: int) -> dict[str, Any]:
    """MFPO-INFOCOM24's ``code/main.py`` training loop: a round is ``local_steps`` iterations (the
    first one ``Server.share_model``), each ``n_agents`` workers × ``trajectories`` episodes."""
    sys.path.insert(0, str(code_dir))
    from server.server import Server  # the reference's own module

    clock = _Clock()
    share_model = Server.share_model

    def timed_share_model(self: Any, step: int) -> Any:
        clock.mark()
        return share_model(self, step)

    Server.share_model = timed_share_model
    Server.log = lambda self: None
    Server.save_model = lambda self, agent: None
    sys.argv = [
        str(code_dir / "main.py"), "--env_name", "CartPole-v1", "--num_worker", str(n_agents),
        "--batch_size", str(trajectories), "--local_update", str(local_steps),
        "--max_iteration", str(local_steps * (warmup + rounds)), "--seed", str(seed),
    ]  # fmt: skip
    runpy.run_path(str(code_dir / "main.py"), run_name="__main__")
    clock.mark()
    return clock.result(warmup)


class _InProcessPool:
    """``Pool.starmap`` in this process (one core, like the fedrl side)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def starmap(self, fn: Any, args: Any) -> list[Any]:
        return list(itertools.starmap(fn, args))


def run_fedpg_br(
    codes_dir: Path, rounds: int, warmup: int, n_agents: int, batch_range: tuple[int, int], gamma: float, seed: int
) -> dict[str, Any]:
    """Byzantine-Federated-RL's ``codes/run.py`` with ``--FedPG_BR``: a round is one epoch of
    ``Agent.start_training`` (``n_agents`` workers × ``B_t`` episodes, then the server's SCSG loop)."""
    sys.path.insert(0, str(codes_dir))
    import agent as ref_agent  # the reference's own modules
    import options as ref_options
    import run as ref_run

    clock = _Clock()

    def round_boundary(self: Any, *args: Any, **kwargs: Any) -> float:
        clock.mark()
        if len(clock.marks) > warmup + rounds:
            raise _Done
        return 0.0

    ref_agent.Pool = _InProcessPool
    ref_agent.Agent.start_validating = round_boundary
    opts = ref_options.get_options(
        ["--env_name", "CartPole-v1", "--FedPG_BR", "--no_saving", "--no_tb", "--num_worker", str(n_agents), "--seed", str(seed)]
    )
    opts.Bmin, opts.Bmax = batch_range
    opts.gamma = gamma
    opts.max_trajectories = float("inf")
    clock.mark()
    with contextlib.suppress(_Done):
        ref_run.run(opts)
    return clock.result(warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impl", choices=["mfpo", "fedpg_br"])
    parser.add_argument("dir", help="the reference's code directory (MFPO: code/, FedPG-BR: codes/)")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--trajectories", type=int, default=20, help="MFPO: episodes per worker and iteration")
    parser.add_argument("--local-steps", type=int, default=10, help="MFPO: iterations per round")
    parser.add_argument("--batch-range", type=int, nargs=2, default=(14, 18), help="FedPG-BR: B_min B_max")
    parser.add_argument("--gamma", type=float, default=0.99, help="FedPG-BR: discount (its CartPole setting: 0.999)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    _install_shims()
    code_dir = Path(args.dir).resolve()
    out = Path(args.out).resolve()
    if args.impl == "mfpo":
        result = run_mfpo(code_dir, args.rounds, args.warmup, args.agents, args.trajectories, args.local_steps, args.seed)
    else:
        result = run_fedpg_br(code_dir, args.rounds, args.warmup, args.agents, tuple(args.batch_range), args.gamma, args.seed)
    result |= {"impl": args.impl, "threads": torch.get_num_threads()}
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
