"""One arithmetic-chain problem: the numbers to add, the prompt that states them, and the answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A sum of `size` small numbers.

    `prompt` is the text the policy is conditioned on (e.g. ``"sum 23 5 81 4 ="``), `answer` the correct total,
    `size` the number of terms (the difficulty and length driver), `numbers` the terms in prompt order.
    """

    prompt: str
    answer: int
    size: int
    numbers: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.size != len(self.numbers):
            raise ValueError(f"Problem.size must equal len(numbers) (got {self.size} != {len(self.numbers)})")
        if self.answer != sum(self.numbers):
            raise ValueError(f"Problem.answer must equal sum(numbers) (got {self.answer} != {sum(self.numbers)})")
