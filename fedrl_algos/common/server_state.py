"""Server-side state saved with a federation's model: the server optimizer's, and SCAFFOLD's control variates."""

from __future__ import annotations

from typing import Any

import torch

from fedrl_algos.core.control_variates import ControlVariates
from fedrl_algos.core.optim import AdamState
from fedrl_envs.validation import check_bool

__all__ = ["ServerAdamStateMixin", "ControlVariateStateMixin", "check_control_variates"]


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


class ControlVariateStateMixin:
    """Keeps SCAFFOLD's control variates (``control_variates=True``) as two tensors that SB3 saves
    with the parameters and maps to the load device: the server's ``control_server [1, d]`` and the
    agents' ``control_agents [1, n, d]`` (both ``None``, and not in the file, without control variates).

    The class using it sets ``control_variates`` (checked by :func:`check_control_variates`) and
    calls :meth:`_setup_control_variates` from its ``_setup_model`` once the policy and the
    federation exist.
    """

    control_variates: bool

    def _setup_control_variates(self) -> None:
        self.control_variates = check_control_variates(self.control_variates)
        if not self.control_variates:
            self.control_server = self.control_agents = None
            return
        d, dtype, n = self.policy.n_params, self.policy.theta.dtype, self.n_agents
        if self.__dict__.get("control_server") is None or self.__dict__.get("control_agents") is None:
            zero = ControlVariates.zeros(1, n, d, dtype, self.device)
            self.control_server, self.control_agents = zero.server, zero.agents
        self.control_server, self.control_agents = (x.to(self.device) for x in (self.control_server, self.control_agents))

    @property
    def control_state(self) -> ControlVariates | None:
        """The control variates (batch shape ``[1]``) the next round updates; ``None`` without them."""
        if not self.control_variates:
            return None
        return ControlVariates(self.control_server, self.control_agents)

    def _store_control_state(self, control: ControlVariates | None) -> None:
        """Keep the controls a round updated (``None``: nothing to keep)."""
        if control is not None:
            self.control_server, self.control_agents = control.server, control.agents

    @property
    def allows_new_agent_count(self) -> bool:  # type: ignore[override]
        """A model with control variates keeps one per agent: :meth:`set_env` needs the same agents."""
        return not self.control_variates

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, variables = super()._get_torch_save_params()  # type: ignore[misc]
        if self.control_variates:
            variables = [*variables, "control_server", "control_agents"]
        return state_dicts, variables

    policy: Any
    device: Any
    n_agents: int


def check_control_variates(value: Any) -> bool:
    """``control_variates`` as a ``bool`` (``TypeError`` naming it otherwise)."""
    return check_bool("control_variates", value)
