"""Which kernels a policy runs: its ``kernels=`` argument (``FastMlpPolicy``, ``TabularPolicy``) and what it resolves to.

``"torch"`` runs the torch kernels everywhere; ``"numba"`` the compiled loops where they apply
(:mod:`fedrl_algos.policies.mlp.compiled`, :mod:`fedrl_algos.policies.tabular_compiled`: float32 on
the CPU with Numba installed) and the torch kernels elsewhere; ``"auto"`` is ``"numba"`` where Numba
is installed. A vector environment's ``kernels=`` is another argument with other choices
(:func:`fedrl_envs.validation.check_kernels`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from fedrl_envs.fused import numba_available

__all__ = ["KERNELS", "check_policy_kernels", "resolve_kernels"]

#: a policy's kernel choices: ``"torch"``, ``"numba"`` (the compiled loops where they apply, the torch
#: kernels elsewhere) and ``"auto"`` (``"numba"`` when Numba is installed)
KERNELS = ("torch", "numba", "auto")


def check_policy_kernels(kernels: Any) -> str:
    """``kernels`` if it is one of :data:`KERNELS` (``ValueError`` naming the argument otherwise)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {list(KERNELS)}, got {kernels!r}")
    return kernels


def resolve_kernels(kernels: str, device: str | torch.device = "cpu") -> str:
    """The kernels that run: ``"numba"`` on a CPU with Numba installed when ``kernels`` is ``"numba"``
    or ``"auto"``, else ``"torch"`` (what the experiments record in ``settings.kernels``).

    An explicit ``"numba"`` that cannot run (no Numba, or not a CPU) warns once and runs the torch
    kernels, as ``FastMlpPolicy`` does.
    """
    check_policy_kernels(kernels)
    if kernels == "torch":
        return "torch"
    if torch.device(device).type == "cpu" and numba_available():
        return "numba"
    if kernels == "numba":
        warnings.warn(f'kernels="numba" runs only on a CPU with Numba installed (pip install "fedrl[fast]"); '
                      f"the torch kernels run on {torch.device(device)}", stacklevel=2)
    return "torch"
