"""Kinds of values read from JSON files and dicts (configs, checkpoints' metadata, prompts lines)."""

from __future__ import annotations

import json
import numbers
from pathlib import Path


def is_int(value: object) -> bool:
    """A JSON integer: an ``int`` and not a ``bool`` (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A JSON number: an ``int`` or a ``float``, not a ``bool`` (NaN and infinities included: callers bound it)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integral(value: object) -> bool:
    """An integer of any kind a caller may hand over (Python, numpy), not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def read_json(file: Path, label: str | None = None) -> object:
    """The JSON value in ``file``. A file that is missing, unreadable or not JSON is a ValueError naming ``label``
    (the file's path unless given, e.g. ``key=path``): ``LABEL is missing``, ``... is not valid JSON: ...``."""
    name = str(file) if label is None else label
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{name} is missing") from None
    except IsADirectoryError:
        raise ValueError(f"{name} is a directory, not a JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{name} is not valid JSON: {err}") from None
    except OSError as err:
        raise ValueError(f"{name} cannot be read: {err.strerror or err}") from None
