"""``wrappers.sb3`` is the module ``fedrl_wrappers.sb3`` itself (one module object, two names)."""

import sys

import fedrl_wrappers.sb3 as _implementation

# Replacing this module in sys.modules makes ``import wrappers.sb3`` bind fedrl_wrappers.sb3, so
# classes, module state and monkeypatches are shared, never duplicated.
sys.modules[__name__] = _implementation
