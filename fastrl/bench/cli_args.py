"""Argument types of the standalone benchmark scripts (``python -m fastrl.bench.*``) and the GPU recipes: a bad value
is argparse's one-line usage error naming the flag, not a traceback from an empty median later."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path


def at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0 (seconds, bytes/s)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def int_list(low: int) -> Callable[[str], list[int]]:
    """An argparse ``type``: integers >= ``low`` separated by commas (at least one)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"integers separated by commas, got {text!r}") from None
        if any(v < low for v in values):
            raise argparse.ArgumentTypeError(f"each must be >= {low}, got {text!r}")
        return values

    return parse


def name_list(known: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse ``type``: names from ``known`` separated by commas (at least one)."""
    choices = tuple(known)

    def parse(text: str) -> list[str]:
        names = text.split(",")
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown} in {text!r}; known: {', '.join(choices)}")
        return names

    return parse


def strategy_list(text: str) -> list[str]:
    """An argparse ``type``: strategy strings separated by commas (at least one, no duplicates), as given."""
    from fastrl.strategy.strategy import parse_strategy_space

    names = text.split(",")
    try:
        parse_strategy_space(names)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return names


def index_range(text: str) -> range:
    """An argparse ``type``: ``LOW-HIGH`` (HIGH excluded, LOW < HIGH) or one index ``K``, all >= 0."""
    low, dash, high = text.partition("-")
    try:
        start = int(low)
        stop = int(high) if dash else start + 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"LOW-HIGH or one index, got {text!r}") from None
    if start < 0 or stop <= start:
        raise argparse.ArgumentTypeError(f"LOW-HIGH needs 0 <= LOW < HIGH, got {text!r}")
    return range(start, stop)


def new_file(text: str) -> Path:
    """An argparse ``type``: a file to create, checked before any work (``check_output``: its directory is made and
    takes new files); it must not exist, so finished results are never overwritten."""
    from fastrl.commands.output_guard import check_output

    path = Path(text)
    if path.exists() or path.is_symlink():
        raise argparse.ArgumentTypeError(f"{path} exists; choose a new file")
    try:
        check_output("file", text, {})
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("file=")) from None
    return path
