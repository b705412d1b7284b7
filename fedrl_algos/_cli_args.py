"""Argument types shared by the ``fedrl`` sub-commands."""

from __future__ import annotations

import argparse
from typing import Any


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """``argparse`` type: an integer >= 1 (the error names the offending value)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """``argparse`` type: an integer >= 0 (the error names the offending value)."""
    return _int_at_least(text, 0)


def set_threads(threads: int | None) -> None:
    """Set torch's intra-op threads for a benchmark's ``--threads`` (``None``: leave torch's default)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def write_json(path: str | None, payload: Any) -> None:
    """Write a benchmark's ``--json`` records (dataclasses become dicts); nothing when ``path`` is ``None``."""
    if path is None:
        return
    import dataclasses
    import json

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    with open(path, "w") as f:
        json.dump(plain(payload), f, indent=2)


def positive_float(text: str) -> float:
    """``argparse`` type: a finite number > 0, e.g. ``1e6`` (the error names the offending value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
