"""``wrappers.federated`` is the module ``fedrl_wrappers.federated`` itself (one module object, two names)."""

import sys

import fedrl_wrappers.federated as _implementation

# Replacing this module in sys.modules makes ``import wrappers.federated`` bind fedrl_wrappers.federated, so
# classes, module state and monkeypatches are shared, never duplicated.
sys.modules[__name__] = _implementation
