"""``wrappers.heterogeneity`` is the module ``fedrl_wrappers.heterogeneity`` itself (one module object, two names)."""

import sys

import fedrl_wrappers.heterogeneity as _implementation

# Replacing this module in sys.modules makes ``import wrappers.heterogeneity`` bind fedrl_wrappers.heterogeneity, so
# classes, module state and monkeypatches are shared, never duplicated.
sys.modules[__name__] = _implementation
