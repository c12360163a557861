"""Argument types of the standalone benchmark scripts (``python -m fastrl.bench.*``) and the GPU recipes: a bad value
is argparse's one-line usage error naming the flag, not a traceback from an empty median later."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable


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
