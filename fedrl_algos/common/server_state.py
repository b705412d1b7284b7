"""The server optimizer's state as part of a federation's saved model."""

from __future__ import annotations

from typing import Any

import torch

from fedrl_algos.core.optim import AdamState

__all__ = ["ServerAdamStateMixin"]


class ServerAdamStateMixin:
    """Keeps the server's Adam state (``server_optimizer="adam"``) as three tensors that SB3 saves
    with the parameters and maps to the load device: ``adam_step [1]``, ``adam_first [1, d]``,
    ``adam_second [1, d]`` (kept, at zero, for ``"sgd"`` too, so every file has the same fields).

    The class using it sets ``server_optimizer`` and calls :meth:`_setup_server_state` from its
    ``_setup_model`` once the policy exists.
    """

    server_optimizer: str

    def _setup_server_state(self) -> None:
        d, dtype = self.policy.n_params, self.policy.theta.dtype
        if self.__dict__.get("adam_step") is None:
            self.adam_step = torch.zeros(1, dtype=dtype)
            self.adam_first = torch.zeros(1, d, dtype=dtype)
            self.adam_second = torch.zeros(1, d, dtype=dtype)
        self.adam_step, self.adam_first, self.adam_second = (x.to(self.device) for x in (self.adam_step, self.adam_first, self.adam_second))

    @property
    def optimizer_state(self) -> AdamState | None:
        """The server's Adam state (``server_optimizer="adam"``), batch shape ``[1]``; ``None`` for ``"sgd"``."""
        if self.server_optimizer != "adam":
            return None
        return AdamState(self.adam_step, self.adam_first, self.adam_second)

    def _store_server_state(self, state: AdamState | None) -> None:
        """Keep the state an update returned (``None``: plain SGD, nothing to keep)."""
        if state is not None:
            self.adam_step, self.adam_first, self.adam_second = state

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()  # type: ignore[misc]
        return state_dicts, [*variables, "adam_step", "adam_first", "adam_second"]

    policy: Any
    device: Any
