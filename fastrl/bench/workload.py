"""Benchmark prompts with a fixed seed: the bundled task's, or chat questions for chat models (`model=smollm2`)."""

from __future__ import annotations

import random
from typing import Any

from fastrl.models.tokenizer import chat_token_ids, has_chat_template
from fastrl.rl.tasks.task import ArithChainTask

WORKLOADS = ("auto", "task", "chat")
CHAT_QUESTIONS = (
    "What is 48 times 17? Show your steps.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain photosynthesis in simple terms.",
    "Solve for x: 7x + 12 = 61.",
    "How do I read a CSV file in Python?",
    "Give me three tips for sleeping better.",
    "A train travels at 80 km per hour for 3 hours. How far does it go?",
    "What is the difference between a list and a tuple in Python?",
    "Why is the sky blue?",
    "Write a short poem about the ocean.",
    "What is 15 percent of 240?",
    "Write a JavaScript function that returns the largest number in an array.",
    "What causes earthquakes?",
    "Explain recursion with a small example.",
    "What are the main causes of inflation?",
    "Tom has 35 apples and gives away 12. How many are left?",
)


def task_prompts(tokenizer: Any, count: int, seed: int) -> list[list[int]]:
    """`count` task prompts as token ids (the tokenizer adds its special tokens)."""
    task = ArithChainTask()
    rng = random.Random(seed)
    return [tokenizer(task.sample_problem(rng).prompt)["input_ids"] for _ in range(count)]


def chat_prompts(tokenizer: Any, count: int, seed: int) -> list[list[int]]:
    """`count` chat questions (math, coding, general; repeated past the list) as one user turn each, through the
    tokenizer's chat template, in a seeded order."""
    order = list(CHAT_QUESTIONS)
    random.Random(seed).shuffle(order)
    return [chat_token_ids(tokenizer, [{"role": "user", "content": order[i % len(order)]}]) for i in range(count)]


def bench_prompts(tokenizer: Any, workload: str, count: int, seed: int) -> list[list[int]]:
    """Prompts of `workload`: task, chat, or auto (chat when the tokenizer has a chat template, else task)."""
    if workload not in WORKLOADS:
        raise ValueError(f"bench.workload must be one of {list(WORKLOADS)}, got {workload!r}")
    if workload == "chat" or (workload == "auto" and has_chat_template(tokenizer)):
        return chat_prompts(tokenizer, count, seed)
    return task_prompts(tokenizer, count, seed)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-pad prompts to one length for HF generate; returns (ids, attention_mask)."""
    width = max(len(p) for p in prompts)
    ids = [[pad_id] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask
