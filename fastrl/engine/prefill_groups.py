"""Prompts of one prefill cut into groups of similar lengths, so that padding does not cost what tokens do.

A batched prefill pads every prompt to the longest: 256 prompts of 20 to 60 tokens compute 60 positions each, a
third of them padding, and the prompts of an RL batch spread far wider. `length_groups` puts each prompt on a fixed
geometric ladder of lengths (ratio `LEVEL_RATIO`) and runs one forward per rung, padded to the longest prompt on
it and up to a multiple of `ROW_BLOCK` positions: a prompt is padded by less than a quarter of its length plus at
most `ROW_BLOCK` - 1 positions.

The rule looks only at which lengths are present, never at how many prompts have them, so a GRPO group's prompt
prefilled once (prefix sharing) runs in a forward of the same width as when each sibling prefills its own copy,
and its KV entries are bitwise the same (tests/engine/test_prefix_sharing.py). For that, forwards are also
padded to a multiple of `ROW_BLOCK` positions: a CPU BLAS matmul computes full blocks of 8 rows alike however many
rows the matrix has (measured here, float32 and float64), while a row in a partial block may round differently.
"""

from __future__ import annotations

import math

LEVEL_RATIO = 1.25
ROW_BLOCK = 8


def length_groups(lengths: list[int]) -> list[list[int]]:
    """Rows (indices into `lengths`) grouped for prefill, one group per rung of the ladder: shortest first, rows
    ascending within a group."""
    by_rung: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        by_rung.setdefault(math.ceil(math.log(max(length, 1), LEVEL_RATIO)), []).append(row)
    return [by_rung[rung] for rung in sorted(by_rung)]


def padded_width(longest: int, limit: int) -> int:
    """Positions a forward over prompts of at most `longest` tokens computes: a multiple of ROW_BLOCK, at most
    `limit` (the cache's entries per row)."""
    return min(-(-longest // ROW_BLOCK) * ROW_BLOCK, max(limit, longest))
