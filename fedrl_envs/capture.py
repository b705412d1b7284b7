"""Steps run as one program: a step function compiled whole, chunks of steps replayed as CUDA graphs.

The layer below the captured rollouts of the envs (``FederatedVecEnv.rollout(capture=...)``) and of
the algorithms' samplers (:mod:`fedrl_algos.core.capture`). A step function maps a *carry* (the
tensors one step hands the next: state, time indices, stream counters) and *inputs* (tensors that
stay fixed through a rollout: policy parameters, stream keys) to the next carry and the step's
*records* (observation, action, reward, flags). :class:`ChunkRunner` runs ``length`` steps of it:

* compiled once (``torch.compile(fullgraph=True, dynamic=False)``: one graph, no break);
* on CUDA, the ``length`` compiled steps recorded as one CUDA graph over static buffers and replayed
  (one launch per chunk instead of dozens per step), re-recorded only for a new shape or
  ``length``;
* elsewhere, the compiled step called ``length`` times.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from fedrl_envs.params import derived

__all__ = ["CAPTURE", "check_capture", "resolve_capture", "ChunkRunner"]

#: the ``capture=`` choices: ``"auto"`` (captured on CUDA, eager elsewhere), ``True``, ``False``
CAPTURE = ("auto", True, False)


def check_capture(capture: Any, name: str = "capture") -> Any:
    """``capture`` if it is one of :data:`CAPTURE` (``ValueError`` naming the argument otherwise)."""
    if not any(capture is c or (isinstance(c, str) and isinstance(capture, str) and capture == c) for c in CAPTURE):
        raise ValueError(f"{name} must be 'auto', True or False, got {capture!r}")
    return capture


def resolve_capture(capture: Any, device: torch.device | str) -> bool:
    """Whether a rollout on ``device`` is captured: ``"auto"`` means on CUDA (where launches dominate;
    on the CPU the eager and Numba paths are the fast ones, and keep their numbers)."""
    check_capture(capture)
    if capture == "auto":
        return torch.device(device).type == "cuda"
    return bool(capture)


Records = list[tuple[torch.Tensor, ...]]


class ChunkRunner:
    """Runs chunks of a step function ``step(*carry, *inputs) -> (*carry, *records)`` as one program.

    :param step: the step (pure in its tensors). Its inputs are tensors or dataclasses of tensors
        (a family's task parameters): new objects of the same shapes reuse the compiled program.
        What it closes over (a family, a policy) is constant for this runner
    :param n_carry: how many of its first arguments and outputs are the carry
    :param backend: ``torch.compile``'s backend (``"aot_eager"`` runs eager's operations, for checks)
    """

    def __init__(self, step: Callable[..., tuple[torch.Tensor, ...]], n_carry: int, backend: str = "inductor") -> None:
        # A fresh code object per runner: torch.compile keeps its compiled programs, and its limit
        # of recompilations, per code object, so runners of other families or policies (which the
        # step closes over) neither evict nor count against each other, and go when the runner goes.
        fresh = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__, step.__closure__)
        self.compiled = torch.compile(fresh, fullgraph=True, dynamic=False, backend=backend)
        self.n_carry = int(n_carry)
        self._graphs: dict[tuple[Any, ...], _ChunkGraph] = {}

    def run(self, carry: tuple[torch.Tensor, ...], inputs: tuple[Any, ...], length: int) -> tuple[tuple[torch.Tensor, ...], Records]:
        """``length`` steps from ``carry``: the carry after them and each step's records."""
        device = carry[0].device
        if device.type == "cuda":
            # A graph bakes in its device, the shapes and the dataclasses' non-tensor fields (a
            # gridworld's size): any of them new, a new graph.
            key = (length, device, _statics(inputs), *((tuple(x.shape), x.dtype) for x in (*carry, *_tensors(inputs))))
            with torch.cuda.device(device), torch.no_grad():
                graph = self._graphs.get(key)
                if graph is None:
                    graph = self._graphs[key] = _ChunkGraph(self.compiled, self.n_carry, carry, inputs, length)
                return graph.run(carry, inputs)
        records: Records = []
        for _ in range(length):
            out = self.compiled(*carry, *inputs)
            carry, step_records = tuple(out[: self.n_carry]), tuple(out[self.n_carry:])
            records.append(step_records)
        return carry, records


class _ChunkGraph:
    """``length`` compiled steps recorded as one CUDA graph over static input and output buffers."""

    def __init__(self, step: Any, n_carry: int, carry: tuple[torch.Tensor, ...], inputs: tuple[Any, ...], length: int) -> None:
        self.carry_in = tuple(x.clone() for x in carry)
        self.inputs_in = tuple(_static_copy(x) for x in inputs)
        _tensors(self.inputs_in)  # the derived quantities exist before the warm-up: inputs, refreshed by run()

        def steps() -> tuple[tuple[torch.Tensor, ...], Records]:
            c, records = self.carry_in, []
            for _ in range(length):
                out = step(*c, *self.inputs_in)
                c = tuple(out[:n_carry])
                records.append(tuple(out[n_carry:]))
            return c, records

        # Warm-up on a side stream (compilation, lazy allocations), then the recording. The second
        # warm-up pass turns host synchronizations into errors, so that a step that cannot be
        # captured (a .item(), a host copy) fails here, with its own message, not inside the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            steps()
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                steps()
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.carry_out, self.records_out = steps()

    def run(self, carry: tuple[torch.Tensor, ...], inputs: tuple[Any, ...]) -> tuple[tuple[torch.Tensor, ...], Records]:
        for buffer, value in zip((*self.carry_in, *_tensors(self.inputs_in)), (*carry, *_tensors(inputs)), strict=True):
            buffer.copy_(value)
        self.graph.replay()
        # The outputs are the graph's buffers, overwritten by the next replay: copies leave.
        return tuple(x.clone() for x in self.carry_out), [tuple(x.clone() for x in r) for r in self.records_out]


def _derived_names(cls: type) -> list[str]:
    """The :class:`~fedrl_envs.params.derived` quantities of a parameter dataclass, in a fixed order."""
    return [name for klass in reversed(cls.__mro__) for name, attr in vars(klass).items() if isinstance(attr, derived)]


def _tensors(inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    """The tensors of ``inputs``: tensors, and the tensor fields and derived quantities of
    dataclasses (computing and keeping those), in order. A derived quantity is cached on its object,
    so a compiled step reads it as an input: a CUDA graph must get each new object's, not keep the
    first's."""
    out: list[torch.Tensor] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif dataclasses.is_dataclass(x):
            names = [f.name for f in dataclasses.fields(x)] + _derived_names(type(x))
            out.extend(v for v in (getattr(x, n) for n in names) if isinstance(v, torch.Tensor))
        else:
            raise TypeError(f"inputs must be tensors or dataclasses of tensors, got {type(x).__name__}")
    return out


def _statics(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The non-tensor fields of the dataclasses among ``inputs`` (constants of a compiled step)."""
    return tuple(
        (type(x), tuple((f.name, getattr(x, f.name)) for f in dataclasses.fields(x) if not isinstance(getattr(x, f.name), torch.Tensor)))
        for x in inputs if dataclasses.is_dataclass(x)
    )


def _static_copy(x: Any) -> Any:
    """A copy a CUDA graph can own: a cloned tensor, or the dataclass with its tensor fields cloned."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    fields = {f.name: getattr(x, f.name).clone() for f in dataclasses.fields(x) if isinstance(getattr(x, f.name), torch.Tensor)}
    return dataclasses.replace(x, **fields)
