"""Flower's own robust aggregation (Krum, MultiKrum, FedMedian, FedTrimmedAvg) in place of
FedPG-BR's filter, and the comparison of the two under the same attacks.

The aggregators call Flower's functions (``select_multikrum``, ``trim_mean``, and FedMedian's
coordinate-wise median) on the agents' reported gradients packed as Flower records, so what is
compared is Flower's code, not a re-implementation. :func:`compare_robust_aggregators` runs
FedPG-BR federations through the Flower round (:class:`~fedrl_algos.fedpg_br.protocol.FedPGBRProtocol`,
the Strategy's code path, here without the messaging) with each aggregator and attack.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

__all__ = ["FLOWER_AGGREGATORS", "flower_aggregator", "compare_robust_aggregators", "gridworld_comparison", "comparison_table"]

#: the Flower strategies whose aggregation can replace FedPG-BR's filter
FLOWER_AGGREGATORS = ("krum", "multikrum", "fedmedian", "fedtrimmedavg")

Aggregate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def flower_aggregator(name: str, num_malicious_nodes: int = 0, num_nodes_to_select: int | None = None, beta: float = 0.2) -> Aggregate:
    """``aggregate(grads [*R, n, d], usable [*R, n]) -> (μ [*R, d], kept [*R, n])`` by a Flower strategy's rule.

    :param name: ``"krum"``, ``"multikrum"``, ``"fedmedian"`` or ``"fedtrimmedavg"``
    :param num_malicious_nodes: f of (Multi)Krum
    :param num_nodes_to_select: m of MultiKrum (default ``n − f``)
    :param beta: the fraction FedTrimmedAvg cuts at each end
    """
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
    from flwr.serverapp.strategy.multikrum import select_multikrum

    if name not in FLOWER_AGGREGATORS:
        raise ValueError(f"name must be one of {FLOWER_AGGREGATORS}, got {name!r}")

    def one_run(grads: np.ndarray, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.flatnonzero(usable)
        kept = np.zeros(usable.shape, dtype=bool)
        if rows.size == 0:
            return np.zeros(grads.shape[-1], dtype=grads.dtype), kept
        if name in ("krum", "multikrum"):
            contents = [RecordDict({"arrays": ArrayRecord({"g": Array(np.ascontiguousarray(grads[i]))}),
                                    "metrics": MetricRecord({"num-examples": 1})}) for i in rows]
            select = 1 if name == "krum" else (num_nodes_to_select or max(rows.size - num_malicious_nodes, 1))
            chosen = select_multikrum(contents, num_malicious_nodes=num_malicious_nodes, num_nodes_to_select=select)
            picked = [int(rows[next(k for k, c in enumerate(contents) if c is s)]) for s in chosen]
            kept[picked] = True
            return grads[picked].mean(0), kept
        kept[rows] = True
        if name == "fedmedian":
            return np.median(grads[rows], axis=0), kept
        return np.asarray(trim_mean(grads[rows], beta)), kept

    def aggregate(grads: torch.Tensor, usable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = grads.detach().cpu().numpy().reshape(-1, *grads.shape[-2:])
        u = usable.cpu().numpy().reshape(-1, usable.shape[-1])
        results = [one_run(g[r], u[r]) for r in range(g.shape[0])]  # runs, not agents: one in a federation
        mu = torch.as_tensor(np.stack([m for m, _ in results])).to(grads).reshape(*grads.shape[:-2], grads.shape[-1])
        kept = torch.as_tensor(np.stack([k for _, k in results])).to(usable.device).reshape(usable.shape)
        return mu, kept

    return aggregate


def compare_robust_aggregators(
    make_model: Callable[[str | None, int], Any],
    attacks: Sequence[str | None],
    aggregators: Sequence[str],
    seeds: Sequence[int],
    rounds: int,
    num_malicious_nodes: int,
    metric: Callable[[Any], float],
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Train FedPG-BR federations through the Flower round with each aggregator under each attack.

    :param make_model: ``(attack, seed) -> FedPGBR`` model (its Byzantine agents set)
    :param attacks: attack names (``None``: no attack)
    :param aggregators: ``"fedpg_br"`` (its own filter) and names of :data:`FLOWER_AGGREGATORS`
    :param seeds: seeds
    :param rounds: rounds per run
    :param num_malicious_nodes: f given to (Multi)Krum
    :param metric: the model's score after training (e.g. its exact return)
    :param progress: called with a line per finished run
    :return: one record per (attack, aggregator, seed): ``attack``, ``aggregator``, ``seed``, ``score``
    """
    from fedrl_algos.common.round_protocol import AgentWorker, protocol_for, round_by_halves

    records = []
    for attack in attacks:
        for aggregator in aggregators:
            for seed in seeds:
                model = make_model(attack, seed)
                aggregate = None if aggregator == "fedpg_br" else flower_aggregator(aggregator, num_malicious_nodes)
                protocol = protocol_for(model, aggregate=aggregate)
                workers = [AgentWorker(copy.deepcopy(model), a) for a in range(model.n_agents)]
                for _ in range(rounds):
                    round_by_halves(protocol, workers)
                    model.rounds_done += 1
                score = float(metric(model))
                records.append({"attack": attack or "none", "aggregator": aggregator, "seed": seed, "score": score})
                if progress is not None:
                    progress(f"{attack or 'none'} / {aggregator} / seed {seed}: {score:.3f}")
    return records


def gridworld_comparison(
    attacks: Sequence[str | None] = (None, "sign_flip", "random_noise", "random_action", "reward_flip", "zero_gradient", "huge_spread"),
    aggregators: Sequence[str] = ("fedpg_br", *FLOWER_AGGREGATORS),
    seeds: Sequence[int] = (0, 1, 2),
    rounds: int = 50,
    byzantine_agents: Sequence[int] = (5, 6, 7),
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """The comparison on the gridworld: FedPG-BR (step size 0.5, batches of 4–6 trajectories, as in
    its docstring example) with 3 of its 8 agents Byzantine, scored by the exact return of the
    server's policy averaged over the 8 tasks after ``rounds`` rounds.
    """
    from fedrl_algos import FedPGBR

    def make(attack: str | None, seed: int) -> Any:
        return FedPGBR("TabularPolicy", "fedrl/GridWorld-v0", step_size=0.5, batch_range=(4, 6), seed=seed, device="cpu",
                       byzantine_agents=list(byzantine_agents) if attack else [], attack=attack)

    def exact_return(model: Any) -> float:
        return float(model.evaluator.returns(model.theta.to(torch.float64)).mean())

    return compare_robust_aggregators(make, attacks, aggregators, seeds, rounds, len(byzantine_agents), exact_return, progress)


def comparison_table(records: Sequence[dict[str, Any]]) -> str:
    """A markdown table: mean ± std over seeds of the score, attacks as rows, aggregators as columns."""
    attacks = list(dict.fromkeys(r["attack"] for r in records))
    aggregators = list(dict.fromkeys(r["aggregator"] for r in records))
    lines = ["| attack | " + " | ".join(aggregators) + " |", "|---|" + "---:|" * len(aggregators)]
    for attack in attacks:
        cells = []
        for aggregator in aggregators:
            scores = np.array([r["score"] for r in records if r["attack"] == attack and r["aggregator"] == aggregator])
            cells.append(f"{scores.mean():.3f} ± {scores.std():.3f}" if scores.size else "")
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
