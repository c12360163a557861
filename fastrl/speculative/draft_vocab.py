"""The reduced draft vocabulary (FR-Spec, EAGLE-3's `d2t`): the K tokens the policy emits most often.

A drafter restricted to them computes K-row LM-head logits instead of V-row ones (the head is most of a drafter
step when V is large: 49k for SmolLM2, 152k for Qwen). A token outside the set is never drafted, but the policy
still samples it: verification keeps the full vocabulary, so outputs do not change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from fastrl.strategy.strategy import Strategy


def most_frequent_tokens(sequences: Iterable[list[int]], k: int, vocab_size: int) -> torch.Tensor:
    """The `k` most frequent token ids of `sequences`, sorted by id; ties and unseen ids fill by ascending id so
    the result is a pure function of the counts. ValueError when k is not in [1, vocab_size].  # -> [k] long"""
    if not 1 <= k <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab_size}], got {k}")
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(seq)
    bad = [t for t in counts if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token ids outside the vocabulary [0, {vocab_size}): {sorted(bad)[:8]}")
    frequency = torch.zeros(vocab_size, dtype=torch.float64)
    if counts:
        ids = torch.tensor(list(counts.keys()), dtype=torch.long)
        frequency[ids] = torch.tensor(list(counts.values()), dtype=torch.float64)
    # Descending count, ascending id on ties: a stable sort of ids (ascending) by -count.
    order = torch.sort(-frequency, stable=True).indices
    return order[:k].sort().values


def coverage(sequences: Iterable[list[int]], vocab: torch.Tensor) -> float:
    """Fraction of the tokens of `sequences` that lie in `vocab` (1.0 for no tokens)."""
    member = set(vocab.tolist())
    total = hit = 0
    for seq in sequences:
        total += len(seq)
        hit += sum(1 for t in seq if t in member)
    return hit / total if total else 1.0


def wider_than(strategies: Iterable[Strategy], width: int) -> list[Strategy]:
    """The strategies whose drafter steps keep more candidates (``topk``) than ``width`` tokens hold: what a draft
    vocabulary (or a vocabulary) of ``width`` tokens cannot draft."""
    return [s for s in strategies if s.uses_drafter and s.topk > width]
