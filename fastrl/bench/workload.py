"""Benchmark prompts drawn from the bundled task with a fixed seed."""

from __future__ import annotations

import random
from typing import Any

from fastrl.rl.tasks.task import ArithChainTask


def task_prompts(tokenizer: Any, count: int, seed: int) -> list[list[int]]:
    """`count` task prompts as token ids (the tokenizer adds its special tokens)."""
    task = ArithChainTask()
    rng = random.Random(seed)
    return [tokenizer(task.sample_problem(rng).prompt)["input_ids"] for _ in range(count)]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-pad prompts to one length for HF generate; returns (ids, attention_mask)."""
    width = max(len(p) for p in prompts)
    ids = [[pad_id] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask
