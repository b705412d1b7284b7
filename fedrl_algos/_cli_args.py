"""Argument types shared by the ``fedrl`` sub-commands."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """``argparse`` type: an integer >= 1 (the error names the offending value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """``argparse`` type: a finite number > 0, e.g. ``1e6`` (the error names the offending value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
