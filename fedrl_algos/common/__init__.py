"""What every fedrl federation shares: the SB3 shell, ``learn`` set-up, env resolution, evaluation.

The base class :class:`FederatedAlgorithm` takes only what every federation has (policy, env,
gamma, seed, device, logging); each algorithm package (``fedrl_algos.<algo>``) adds its own
hyperparameters and its update.
"""

from fedrl_algos.common.base_class import FederatedAlgorithm
from fedrl_algos.common.env_util import resolve_federation_env
from fedrl_algos.common.learn import EnvFreeLearnMixin, FederatedProgressBar

__all__ = ["EnvFreeLearnMixin", "FederatedAlgorithm", "FederatedProgressBar", "resolve_federation_env"]
