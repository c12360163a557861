"""What one request needs of the KV pool: its context plus one round's lookahead, in pages. The engine sizes and
checks its pool with these, and so do drivers (the verl replica) that must refuse a pool before any engine starts."""

from __future__ import annotations

import math
from collections.abc import Iterable

from fastrl.strategy.strategy import Strategy


def context_length(max_model_len: int | None, max_position_embeddings: int) -> int:
    """The context the engine serves: ``max_model_len`` (None: the model's), at most the model's positions."""
    return min(max_model_len or max_position_embeddings, max_position_embeddings)


def round_lookahead(strategies: Iterable[Strategy]) -> int:
    """Entries a round writes past a row's tokens: the deepest accepted path plus the policy's own token (1 when
    every strategy is plain decoding)."""
    return max((s.verify_depth + 1 for s in strategies if not s.is_disabled), default=1)


def pages_per_request(context: int, lookahead: int, page_size: int) -> int:
    """Pages one request of the whole context takes at its last round."""
    return math.ceil((context + lookahead) / page_size)


def check_kv_cache_tokens(key: str, kv_cache_tokens: int, context: int, lookahead: int, page_size: int) -> None:
    """ValueError naming ``key`` when a pool of ``kv_cache_tokens`` cannot hold one request of the context (it
    could never finish such a request, however long it waited)."""
    need = pages_per_request(context, lookahead, page_size)
    if math.ceil(kv_cache_tokens / page_size) < need:
        raise ValueError(
            f"{key} = {kv_cache_tokens} cannot hold one request of the context length {context} plus one round "
            f"({lookahead}): it needs >= {need * page_size}"
        )
