"""Kinds of values read from JSON files and dicts (configs, checkpoints' metadata, prompts lines)."""

from __future__ import annotations

import json
import math
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
    if type(value) is int:  # the common case, without the ABC's subclass check (~0.4 us a value)
        return True
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


def finite_json(value: object, where: str = "") -> tuple[object, list[str]]:
    """``value`` (dicts, lists, numbers) with every NaN or infinite float replaced by None, and the dotted keys
    replaced: ``json.dumps`` would write them as the bare tokens ``NaN`` / ``Infinity``, which are not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, [where]
    if isinstance(value, dict):
        out: dict = {}
        replaced: list[str] = []
        for key, item in value.items():
            out[key], inner = finite_json(item, f"{where}.{key}" if where else str(key))
            replaced += inner
        return out, replaced
    if isinstance(value, list | tuple):
        pairs = [finite_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return [item for item, _ in pairs], [key for _, keys in pairs for key in keys]
    return value, []
