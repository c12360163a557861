"""A batch that forces a rollout tail: two groups of equal expected work, one of which stops after one token, so
one worker finishes at once while the other decodes for a while."""

from __future__ import annotations

from fastrl.rollout.types import RolloutRequest
from fastrl.sampling.params import SamplingParams
from tests.rollout.conftest import VOCAB, prompt


def tail_batch(n: int = 16, prefix: str = "t") -> list[RolloutRequest]:
    """`n` long requests (group 0, 32 tokens each) and `n` requests that stop at their first token (group 1)."""
    long = [
        RolloutRequest(f"{prefix}-long{i}", prompt(i, 4), SamplingParams(max_new_tokens=32, seed=i, ignore_eos=True), 0)
        for i in range(n)
    ]
    stop_at_once = SamplingParams(max_new_tokens=32, seed=0, stop_token_ids=tuple(range(VOCAB)))
    short = [RolloutRequest(f"{prefix}-short{i}", prompt(100 + i, 4), stop_at_once, 1) for i in range(n)]
    return long + short
