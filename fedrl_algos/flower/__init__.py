"""fedrl on Flower: every federation as Flower ClientApps (one agent per SuperNode) and a ServerApp
whose Strategy is the algorithm's server side — in Flower's simulation engine or deployed as real
``flower-superlink``/``flower-supernode`` processes (``docs/flower.md``).

Needs the ``flower`` extra (``pip install "fedrl[flower]"``; Flower >= 1.20 needs Python >= 3.11).
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - the extra is not installed
    raise ImportError('fedrl_algos.flower needs Flower: pip install "fedrl[flower]" (Python >= 3.11)') from err

from fedrl_algos.flower.protocol import (
    SUPPORTED_ALGORITHMS,
    AgentReply,
    AgentWorker,
    RoundProtocol,
    RoundReplies,
    agent_federation,
    protocol_for,
)
from fedrl_algos.flower.server_app import (
    FedAvgPGStrategy,
    FederationStrategy,
    FedPGBRStrategy,
    IndependentPGStrategy,
    MFPOStrategy,
    PerFedAvgPGStrategy,
    discover_agents,
    run_federation,
    strategy_for,
)
from fedrl_algos.flower.simulation import default_backend_config, simulate
from fedrl_algos.flower.task import load_model, model_to_bytes

__all__ = [
    "SUPPORTED_ALGORITHMS",
    "AgentReply",
    "AgentWorker",
    "RoundProtocol",
    "RoundReplies",
    "agent_federation",
    "protocol_for",
    "FederationStrategy",
    "PerFedAvgPGStrategy",
    "FedAvgPGStrategy",
    "IndependentPGStrategy",
    "MFPOStrategy",
    "FedPGBRStrategy",
    "strategy_for",
    "discover_agents",
    "run_federation",
    "simulate",
    "default_backend_config",
    "load_model",
    "model_to_bytes",
]
