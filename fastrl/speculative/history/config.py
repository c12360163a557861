"""The sizes of a history index (``HistoryConfig``), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastrl.json_values import is_int, is_real


@dataclass(frozen=True)
class HistoryConfig:
    """Sizes of the history index.

    token_budget:   most tokens held once only live text would remain beyond it (see the module doc); the index
                    costs about 0.8 KB per token in CPython, so the default holds ~160 MB (and up to a quarter more
                    while dropped responses wait to be filtered out of a group's n-gram lists)
    max_key:        longest n-gram looked up (occurrence lists per n-gram length 1..max_key)
    max_match:      longest context match measured; a match of length L weighs ``match_base ** L``
    max_candidates: most occurrences (the most recent) whose continuations enter one draft
    match_base:     how strongly a longer context match outweighs a shorter one (1.0: plain counts)
    """

    token_budget: int = 200_000
    max_key: int = 4
    max_match: int = 16
    max_candidates: int = 16
    match_base: float = 2.0

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_key", "max_match", "max_candidates"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"history config: {name} must be an int >= 1, got {value!r}")
        if self.max_match < self.max_key:
            raise ValueError(f"history config: max_match ({self.max_match}) must be >= max_key ({self.max_key})")
        base = self.match_base
        if not is_real(base) or not base >= 1.0:
            raise ValueError(f"history config: match_base must be a number >= 1.0, got {base!r}")
        try:  # a draft node's weight, at most max_candidates longest matches summed, must stay a finite float
            finite = math.isfinite(float(base) ** self.max_match * self.max_candidates)
        except OverflowError:
            finite = False
        if not finite:
            raise ValueError(
                f"history config: match_base ** max_match * max_candidates must be finite, got {base!r} ** "
                f"{self.max_match} * {self.max_candidates} (a smaller match_base, or a shorter max_match)"
            )
