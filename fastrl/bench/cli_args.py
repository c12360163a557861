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


def strategy_name(text: str) -> str:
    """An argparse ``type``: one strategy string (``Strategy.parse``), as given."""
    from fastrl.strategy.strategy import Strategy

    try:
        Strategy.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


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


def number_at_least(low: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number >= ``low`` (a temperature, a learning rate's floor, a fraction)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low}, got {text}")
        return value

    return parse


def sampling_temperature(text: str) -> float:
    """An argparse ``type``: a sampling temperature, by the one rule of every temperature (``check_temperature``: 0
    for greedy, else a finite number >= 1e-6)."""
    from fastrl.sampling.params import check_temperature

    try:
        value = float(text)
        check_temperature("temperature", value)
    except ValueError as err:
        said = str(err).removeprefix("temperature ") if "temperature" in str(err) else f"{text!r} is not a number"
        raise argparse.ArgumentTypeError(said) from None
    return value


def new_dir(text: str) -> Path:
    """An argparse ``type``: a directory to create, or an empty one, checked before any work (``check_output_dir``:
    its parent takes new directories); a directory holding files is refused, so finished results are never mixed
    with new ones or overwritten."""
    from fastrl.commands.output_guard import check_output_dir

    try:
        check_output_dir("dir", text, {}, overwrite=False)
    except ValueError as err:
        said = str(err).removeprefix("dir=")
        said = said.split(";")[0] + "; choose a new one" if "not empty" in said else said
        raise argparse.ArgumentTypeError(said) from None
    return Path(text)


def existing_file(text: str) -> Path:
    """An argparse ``type``: a file that exists (an input)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{path} is {'a directory' if path.is_dir() else 'missing'}; give a file")
    return path


def existing_dir(text: str) -> Path:
    """An argparse ``type``: a directory that exists (a checkpoint, a run directory)."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is {'a file' if path.exists() else 'missing'}; give a directory")
    return path
