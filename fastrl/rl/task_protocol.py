"""What the GRPO trainer needs from a task and from a tokenizer (ArithChainTask and HF tokenizers fit)."""

from __future__ import annotations

import random
from typing import Any, Protocol


class PromptProblem(Protocol):
    """A problem carries the text the policy is conditioned on."""

    @property
    def prompt(self) -> str: ...


class RewardTask(Protocol):
    """A task with verifiable rewards: samples problems, scores response texts, names size buckets."""

    def sample_problem(self, rng: random.Random) -> Any:
        """One problem (with a `.prompt` string), drawn from `rng` only."""
        ...

    def reward(self, problem: Any, response_text: str) -> float:
        """The reward of `response_text` for `problem`."""
        ...

    def size_bucket(self, problem: Any) -> str:
        """The reporting bucket of the problem."""
        ...


class TextTokenizer(Protocol):
    """The two tokenizer calls the trainer makes (transformers tokenizers satisfy it)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special tokens (e.g. BOS) included as the model expects them."""
        ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str:
        """Text of `token_ids`."""
        ...
