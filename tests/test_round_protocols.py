"""Each algorithm owns its round by halves (``round_protocol``), and Flower builds everything from it.

* Every algorithm class names its protocol, defined in its own package without Flower; the Flower
  side (Strategy, ClientApp, ``load_model``, the ``--algo`` table) has no table of class names.
* A user's subclass that declares nothing new trains through ``simulate`` exactly as in one process.
* A toy algorithm defined here (agents take one policy-gradient step, the server keeps the
  coordinate-wise median) runs on Flower by declaring a protocol, and equals its in-process run.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from fedrl_algos import ALGORITHMS, MFPO, FedAvgPG, FedAvgSB3, FedPGBR, IndependentPG, PerFedAvgPG
from fedrl_algos.common import FederatedAlgorithm
from fedrl_algos.common.round_protocol import (
    AgentReply,
    AgentWorker,
    RoundProtocol,
    RoundReplies,
    message_tensor,
    protocol_for,
    round_by_halves,
    stack_replies,
)
from fedrl_algos.core.directions import PolicyGradient, local_update

ROOT = Path(__file__).resolve().parent.parent
GRID = "fedrl/GridWorld-v0"


# --- a toy algorithm, defined outside the library -------------------------------------------------
def median_of_valid(local: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median ``[R, d]`` of the valid rows of ``local [R, n, d]`` (``valid [R, n]``)."""
    out = []
    for run in range(local.shape[0]):
        out.append(local[run][valid[run]].median(dim=0).values)
    return torch.stack(out)


class MedianPGProtocol(RoundProtocol):
    """The toy's round by halves: the agent's one step, the server's median."""

    def _payload(self, agent: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {"theta": self._theta_message(self.model.policy.theta)}, {}

    def _agent_update(self, worker: AgentWorker, arrays: dict[str, np.ndarray], config: dict[str, Any], state: dict[str, Any]) -> AgentReply:
        model = worker.model
        theta = message_tensor(arrays, "theta", model.policy.theta).reshape(1, 1, -1)
        local = local_update(model.estimator, worker.federation.sampler, theta, model.step_size, 1)
        return AgentReply(worker.agent, {"theta": local[0, 0].cpu().numpy()}, {"num-trajectories": float(model.n_trajectories)})

    def server_update(self, replies: RoundReplies, min_replies: int) -> dict[str, Any]:
        theta = self.model.policy.theta.detach().unsqueeze(0)
        local, check = stack_replies(replies, "theta", int(self.model.n_agents), theta, (theta.shape[-1],))
        if not self._enough(check, min_replies):
            return self._skip(check, min_replies)
        self.model.policy.theta.data.copy_(median_of_valid(local, check.valid)[0])
        return {"skipped": False, "rejected": int((~check.valid).sum()), "reasons": check.reasons}


class MedianPG(FederatedAlgorithm):
    """Each round every agent takes one policy-gradient step from θ; the server keeps the median."""

    round_protocol: ClassVar[type[RoundProtocol] | None] = MedianPGProtocol

    def __init__(self, policy: Any, env: Any, step_size: float = 0.5, n_trajectories: int = 8, gamma: float = 0.9,
                 seed: int | None = None, device: str = "auto", _init_setup_model: bool = True) -> None:
        self.step_size = step_size
        self.n_trajectories = n_trajectories
        super().__init__(policy, env, gamma=gamma, seed=seed, device=device, _init_setup_model=_init_setup_model)

    def _setup_model(self) -> None:
        super()._setup_model()
        self.estimator = PolicyGradient(self.policy, self.gamma, self.n_trajectories, name="median")

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "estimator"]

    @property
    def trajectories_per_round(self) -> int:
        return self.n_trajectories

    @property
    def updates_per_round(self) -> int:
        return 1

    def evaluate_round(self) -> dict[str, float]:
        return {} if self.evaluator is None else {"return": float(self.evaluator.returns(self.policy.theta.to(torch.float64).cpu()).mean())}

    def _train_round(self) -> None:
        theta = self.policy.theta.detach().unsqueeze(0)
        local = local_update(self.estimator, self.federation.sampler, self.federation.broadcast(theta), self.step_size, 1)
        self.policy.theta.data.copy_(median_of_valid(local, torch.ones(local.shape[:2], dtype=torch.bool))[0])


class MyPerFedAvgPG(PerFedAvgPG):
    """A user's subclass (say, for its own logging): it declares nothing about Flower."""


# --- the declarations -------------------------------------------------------------------------------
def test_every_algorithm_names_its_protocol_from_its_own_package():
    for cls in (PerFedAvgPG, FedAvgPG, IndependentPG, MFPO, FedPGBR):
        package = cls.__module__.rpartition(".")[0]
        assert cls.round_protocol.__module__ == f"{package}.protocol", cls
    assert FedAvgSB3.__dict__.get("round_protocol") is None  # trains in one process only
    assert MyPerFedAvgPG.round_protocol is PerFedAvgPG.round_protocol  # inherited
    with pytest.raises(TypeError, match="declares no round_protocol"):
        protocol_for(FederatedAlgorithm.__new__(FedAvgSB3))


def test_the_flower_side_holds_no_table_of_algorithm_names():
    """No string naming an algorithm class in ``fedrl_algos/flower`` or the ``fedrl flower`` command,
    and the protocols (``fedrl_algos/common/round_protocol.py``, ``<algorithm>/protocol.py``) import no Flower."""
    names = {cls.__name__ for cls in ALGORITHMS.values()}
    flower_side = [*sorted((ROOT / "fedrl_algos" / "flower").glob("*.py")), ROOT / "fedrl_algos" / "cli" / "flower.py"]
    quoted = []
    for path in flower_side:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                quoted.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not quoted, quoted
    protocols = [ROOT / "fedrl_algos" / "common" / "round_protocol.py", *sorted((ROOT / "fedrl_algos").glob("*/protocol.py"))]
    assert len(protocols) == 6
    for path in protocols:
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(m == "flwr" or m.startswith("flwr.") or m.startswith("fedrl_algos.flower") for m in modules), path


def test_the_toy_algorithm_by_halves_equals_its_own_round():
    def make() -> MedianPG:
        return MedianPG("TabularPolicy", GRID, seed=3, device="cpu")

    reference = make().learn(total_rounds=3)
    server = make()
    protocol = protocol_for(server)
    workers = [AgentWorker(make(), agent) for agent in range(server.n_agents)]
    for _ in range(3):
        assert round_by_halves(protocol, workers)["skipped"] is False
    assert torch.equal(server.policy.theta, reference.policy.theta)
    assert not torch.equal(reference.policy.theta, make().policy.theta)  # it trained


# --- on Flower's simulation engine ------------------------------------------------------------------
flower = pytest.importorskip("fedrl_algos.flower")
pytest.importorskip("ray")


def test_a_subclass_that_declares_nothing_trains_through_simulate():
    def make() -> MyPerFedAvgPG:
        return MyPerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu", local_steps=2)

    reference = make().learn(total_rounds=2)
    trained = flower.simulate(make(), num_rounds=2)
    assert type(trained) is MyPerFedAvgPG
    assert torch.equal(trained.policy.theta, reference.policy.theta)
    assert MyPerFedAvgPG in flower.algorithm_classes().values()


def test_a_toy_algorithm_runs_on_flower_by_declaring_a_protocol():
    reference = MedianPG("TabularPolicy", GRID, seed=1, device="cpu").learn(total_rounds=2)
    rounds: list[dict[str, Any]] = []
    trained = flower.simulate(MedianPG("TabularPolicy", GRID, seed=1, device="cpu"), num_rounds=2, round_stats=rounds)
    assert [r["replies"] for r in rounds] == [8, 8] and not any(r["skipped"] for r in rounds)
    assert torch.equal(trained.policy.theta, reference.policy.theta)
    assert trained.rounds_done == 2
