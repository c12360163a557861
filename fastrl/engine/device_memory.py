"""The parts of an engine's device memory that can be given back between rollouts (`Engine.release_memory`)."""

from __future__ import annotations

from collections.abc import Iterable

MEMORY_PARTS = frozenset({"kv_cache", "weights"})
"""``kv_cache``: the policy's and the drafter's KV pools (and the drafter's pending entries); ``weights``: the policy
and the drafter, moved to the CPU. CUDA graphs hold the addresses of both and go with either."""


def memory_parts(key: str, parts: Iterable[str]) -> frozenset[str]:
    """``parts`` as a set, checked: ValueError naming ``key`` and the first name that is not a part (a bare string
    is one part's name, not a sequence of letters)."""
    if isinstance(parts, str):
        names = [parts]
    elif isinstance(parts, Iterable) and not isinstance(parts, bytes | bytearray):
        names = list(parts)
    else:
        raise ValueError(f"{key}: parts must be a part's name or a list of them, got {type(parts).__name__}")
    for name in names:
        if not isinstance(name, str) or name not in MEMORY_PARTS:
            raise ValueError(f"{key}: {name!r} is not a part of the engine's memory; parts are {sorted(MEMORY_PARTS)}")
    return frozenset(names)
