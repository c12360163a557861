"""Kinds of values read from JSON files and dicts (configs, checkpoints' metadata, prompts lines)."""

from __future__ import annotations

import numbers


def is_int(value: object) -> bool:
    """A JSON integer: an ``int`` and not a ``bool`` (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_integral(value: object) -> bool:
    """An integer of any kind a caller may hand over (Python, numpy), not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
