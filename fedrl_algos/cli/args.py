"""Argument types shared by the ``fedrl`` sub-commands."""

from __future__ import annotations

import argparse
import resource
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple


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


class PeakRSS(NamedTuple):
    """Peak resident set sizes (``getrusage``'s ``ru_maxrss``), in bytes.

    :param self_bytes: this process's peak so far
    :param children_bytes: the largest peak of the child processes waited for so far (0 when
        none; processes that are not waited for, such as daemons a library leaves running, are
        not in it)
    """

    self_bytes: int
    children_bytes: int


def peak_rss() -> PeakRSS:
    """This process's and its waited-for children's peak resident set size (see :class:`PeakRSS`)."""
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return PeakRSS(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale,
    )


def peak_rss_fields(peak: PeakRSS) -> dict[str, float]:
    """The JSON fields every benchmark record carries: ``peak_rss_mb`` and ``children_peak_rss_mb`` (MiB)."""
    return {"peak_rss_mb": peak.self_bytes / 2**20, "children_peak_rss_mb": peak.children_bytes / 2**20}


def peak_rss_footer(peak: PeakRSS) -> str:
    """The footer line a benchmark prints under its table."""
    children = f"{peak.children_bytes / 2**20:.0f} MiB" if peak.children_bytes else "none"
    return f"peak RSS (ru_maxrss): this process {peak.self_bytes / 2**20:.0f} MiB; largest child process {children}"


def with_peak_rss(records: Any, peak: PeakRSS) -> Any:
    """``records`` (one record or a list; dataclasses or dicts) as dicts with :func:`peak_rss_fields` added."""
    import dataclasses

    if isinstance(records, list | tuple):
        return [with_peak_rss(r, peak) for r in records]
    if dataclasses.is_dataclass(records) and not isinstance(records, type):
        records = dataclasses.asdict(records)
    if not isinstance(records, dict):
        raise TypeError(f"records must be dataclasses or dicts, got {type(records).__name__}")
    return {**records, **peak_rss_fields(peak)}


def finish_bench(path: str | None, records: Any, groups: bool = False) -> PeakRSS:
    """End a ``fedrl bench`` run: print the peak-RSS footer and write ``--json`` with the fields added.

    :param path: the ``--json`` path (``None``: print only)
    :param records: the run's records (see :func:`with_peak_rss`)
    :param groups: ``records`` is a dict of name -> records (each tagged; ``None`` values kept)
    :return: the peak RSS reported
    """
    peak = peak_rss()
    print(peak_rss_footer(peak))
    if groups:
        payload = {k: None if v is None else with_peak_rss(v, peak) for k, v in records.items()}
    else:
        payload = with_peak_rss(records, peak)
    write_json(path, payload)
    return peak


def print_columns(lines: Sequence[Sequence[str]]) -> None:
    """Print a table of strings, the header first: the first column left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))))
