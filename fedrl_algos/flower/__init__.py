"""fedrl on Flower: every federation as Flower ClientApps (one agent per SuperNode) and a ServerApp
whose Strategy is the algorithm's server side (both halves are the ``round_protocol`` its class
declares, :mod:`fedrl_algos.common.round_protocol`) — in Flower's simulation engine or deployed as real
``flower-superlink``/``flower-supernode`` processes (``docs/flower.md``).

Needs the ``flower`` extra (``pip install "fedrl[flower]"``; Flower >= 1.20 needs Python >= 3.11).
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - the extra is not installed
    raise ImportError('fedrl_algos.flower needs Flower: pip install "fedrl[flower]" (Python >= 3.11)') from err

from fedrl_algos.common.round_protocol import (
    AgentReply,
    AgentWorker,
    AveragingProtocol,
    RoundProtocol,
    RoundReplies,
    agent_federation,
    protocol_for,
    round_by_halves,
)
from fedrl_algos.flower.server_app import FederationStrategy, discover_agents, run_federation, strategy_for
from fedrl_algos.flower.simulation import default_backend_config, simulate
from fedrl_algos.flower.task import algorithm_classes, load_model, model_to_bytes

__all__ = [
    "AgentReply",
    "AgentWorker",
    "AveragingProtocol",
    "RoundProtocol",
    "RoundReplies",
    "agent_federation",
    "algorithm_classes",
    "protocol_for",
    "round_by_halves",
    "FederationStrategy",
    "strategy_for",
    "discover_agents",
    "run_federation",
    "simulate",
    "default_backend_config",
    "load_model",
    "model_to_bytes",
]
