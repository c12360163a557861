"""What differs between the config a selector's state was saved with and the selector's own: the one check behind
``BanditSelector.load_state_dict`` and ``EmaSelector.load_state_dict``, naming every differing key and both values."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


def config_changes(saved: object, own: object, changeable: Iterable[str] = ()) -> list[str]:
    """``"key: saved X, this selector's Y"`` for every field of the dataclasses ``saved`` and ``own`` (of one class)
    that differs, in field order, leaving out the ``changeable`` ones (keys a state does not depend on)."""
    skipped = set(changeable)
    changes = []
    for field in dataclasses.fields(own):
        if field.name in skipped:
            continue
        before, now = getattr(saved, field.name), getattr(own, field.name)
        if before != now:
            changes.append(f"{field.name}: saved {before!r}, this selector's {now!r}")
    return changes


def check_same_config(kind: str, saved: object, own: object, changeable: Iterable[str] = ()) -> None:
    """ValueError naming every key (but the ``changeable`` ones) where the config a ``kind`` state was saved with
    differs from the selector's own, with both values."""
    changes = config_changes(saved, own, changeable)
    if changes:
        name = type(own).__name__
        raise ValueError(f"{kind} state_dict was saved with a different {name}: {'; '.join(changes)}")
