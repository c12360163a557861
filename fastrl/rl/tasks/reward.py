"""The verifiable reward: the final answer of a response, parsed strictly, compared with the truth."""

from __future__ import annotations

import re

MAX_ANSWER_DIGITS = 18  # the parser reads at most this many digits (answers below 10**18)
ANSWER_PATTERN = re.compile(rf"(?:^|\s)answer (0|[1-9][0-9]{{0,{MAX_ANSWER_DIGITS - 1}}})$")


def parse_answer(response_text: str) -> int | None:
    """The integer after the final ``answer `` if the response ends with ``answer <int>`` (no leading zeros,
    surrounding whitespace ignored); ``None`` for anything else."""
    if not isinstance(response_text, str):
        return None
    match = ANSWER_PATTERN.search(response_text.strip())
    return int(match.group(1)) if match else None


def answer_reward(answer: int, response_text: str) -> float:
    """1.0 when the response ends with ``answer <answer>``, else 0.0."""
    return 1.0 if parse_answer(response_text) == answer else 0.0
