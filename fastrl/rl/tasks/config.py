"""Configuration of the arithmetic-chain task, validated on construction."""

from __future__ import annotations

import string
from dataclasses import dataclass
from itertools import pairwise

from fastrl.rl.tasks.reward import MAX_ANSWER_DIGITS

TERM_LABELS = string.ascii_lowercase + string.ascii_uppercase  # one-character names of the terms, in prompt order
DEFAULT_BUCKET_EDGES: tuple[int, ...] = (2, 4, 8, 16)


@dataclass
class TaskConfig:
    """Knobs of `ArithChainTask`.

    Every term has a one-letter name (``a``..``z``, ``A``..``Z``), so there are at most 52 terms.
    Problem size (number of terms) is drawn from a truncated discrete power law ``P(n) ∝ n^-size_exponent`` on
    ``[n_min, n_max]``; terms are uniform integers in ``[value_min, value_max]``. The written solution varies in
    valid ways: the whole chain is added right-to-left with probability `p_reverse`, adjacent terms are swapped
    with probability `p_swap`, each step is followed by a subtraction check with probability `p_check` (at most
    `max_checks` per solution, which bounds the worst-case length).
    `bucket_edges` are the lower edges of the size buckets used for reporting (the last bucket is open).
    `context_length` is the model context the longest prompt + response (+ bos/eos) must fit in.
    `pool_size` > 0 turns the task into a data set: problems are drawn uniformly from a fixed pool of that many
    (made from `pool_seed`), so a run of many steps meets the same prompts again, epoch after epoch, as RL on a
    fixed prompt set does; 0 draws a fresh problem every time.
    """

    n_min: int = 2
    n_max: int = 40
    size_exponent: float = 1.8
    value_min: int = 1
    value_max: int = 99
    p_reverse: float = 0.25
    p_swap: float = 0.15
    p_check: float = 0.1
    max_checks: int = 3
    bucket_edges: tuple[int, ...] = DEFAULT_BUCKET_EDGES
    context_length: int = 1024
    pool_size: int = 0
    pool_seed: int = 0

    def __post_init__(self) -> None:
        if self.n_min < 2:
            raise ValueError(f"TaskConfig.n_min must be >= 2 (got {self.n_min})")
        if not self.n_min <= self.n_max <= len(TERM_LABELS):
            raise ValueError(f"TaskConfig.n_max must be in [n_min={self.n_min}, {len(TERM_LABELS)}] (got {self.n_max})")
        if self.size_exponent < 0:
            raise ValueError(f"TaskConfig.size_exponent must be >= 0 (got {self.size_exponent})")
        if self.value_min < 0:
            raise ValueError(f"TaskConfig.value_min must be >= 0 (got {self.value_min})")
        if self.value_max < self.value_min:
            raise ValueError(f"TaskConfig.value_max must be >= value_min={self.value_min} (got {self.value_max})")
        if self.n_max * self.value_max >= 10**MAX_ANSWER_DIGITS:  # a correct answer the reward could not read
            raise ValueError(
                f"TaskConfig.value_max={self.value_max} with n_max={self.n_max} makes answers of up to "
                f"{self.n_max * self.value_max} (the reward reads answers below 10**{MAX_ANSWER_DIGITS})"
            )
        for key in ("p_reverse", "p_swap", "p_check"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"TaskConfig.{key} must be in [0, 1] (got {value})")
        if self.max_checks < 0:
            raise ValueError(f"TaskConfig.max_checks must be >= 0 (got {self.max_checks})")
        edges = tuple(self.bucket_edges)
        if not edges or any(b <= a for a, b in pairwise(edges)) or edges[0] > self.n_min:
            raise ValueError(f"TaskConfig.bucket_edges must be strictly increasing and start <= n_min (got {edges})")
        self.bucket_edges = edges
        if self.pool_size < 0:
            raise ValueError(f"TaskConfig.pool_size must be >= 0 (0 = fresh problems; got {self.pool_size})")
        if self.context_length < 16:
            raise ValueError(f"TaskConfig.context_length must be >= 16 (got {self.context_length})")
