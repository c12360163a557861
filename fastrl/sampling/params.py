"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from fastrl.json_values import is_integral

MAX_SEED = 2**63  # seeds live in [0, 2**63): they fit a non-negative int64
MAX_COUNT = 2**62  # max_new_tokens and top_k stay below it: a position or a count past the prompt fits an int64


MIN_TEMPERATURE = 1e-6
"""Smallest temperature above 0: sampling divides the logits by it in float32, and a temperature near float32's
smallest normal number (~1.2e-38) turns every logit into an infinity (NaN log-probs). At 1e-6 a logit would have to
exceed 3e32 to overflow, and the sample is the argmax but for logits closer than ~1e-5; smaller ones bring nothing
greedy decoding does not, and a subnormal one overflows every logit."""


def check_temperature(key: str, value: object) -> None:
    """ValueError naming ``key`` unless ``value`` is 0 (greedy) or a finite number >= ``MIN_TEMPERATURE`` (the one
    rule for every place a temperature is given: requests, ``fastrl train``'s rl.temperature, verl's options)."""
    if not _is_real(value) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"{key} must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {value!r}: logits divided by a smaller "
            "one can overflow float32 (a float32 subnormal makes every scaled logit infinite)"
        )


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled.

    Attributes:
        max_new_tokens: response length limit, in [1, 2**62) (the context ends a request earlier).
        temperature: 0 means greedy (plain argmax of the raw logits); otherwise at least ``MIN_TEMPERATURE``.
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens (ties at the k-th value kept); 0 disables it; below 2**62.
        seed: request seed in [0, 2**63), or None to let the engine assign one.
        stop_token_ids: extra token ids in [0, 2**63) that end the request (a list is accepted and stored as a
            tuple of ints).
        ignore_eos: keep generating past the tokenizer's EOS token.

    Invalid values raise ``ValueError`` naming the field and the rule it breaks.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not is_integral(self.max_new_tokens) or not 1 <= self.max_new_tokens < MAX_COUNT:
            raise ValueError(f"max_new_tokens must be an integer in [1, 2**62), got {self.max_new_tokens!r}")
        check_temperature("temperature", self.temperature)
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must satisfy 0 < top_p <= 1, got {self.top_p!r}")
        if not is_integral(self.top_k) or not 0 <= self.top_k < MAX_COUNT:
            raise ValueError(f"top_k must be an integer in [0, 2**62) (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not is_integral(self.seed) or not 0 <= self.seed < MAX_SEED):
            raise ValueError(f"seed must be None or an integer in [0, 2**63), got {self.seed!r}")
        ids = self.stop_token_ids
        if getattr(ids, "ndim", 1) != 1:  # a numpy array or a tensor: one row of ids
            raise ValueError(f"stop_token_ids must be one row of integers, got {ids.ndim} dimensions")
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"stop_token_ids must be a sequence of integers >= 0, got {ids!r}")
        stop = tuple(ids.tolist() if hasattr(ids, "ndim") else ids)  # an array's or a tensor's ids as numbers
        if any(not is_integral(t) or not 0 <= t < MAX_SEED for t in stop):  # token ids live in int64 tensors
            raise ValueError(f"stop_token_ids must be integers in [0, 2**63), got {ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        # numpy numbers as Python ones: a narrow numpy integer would overflow in the engine's sums (prompt length +
        # max_new_tokens), and outputs (the seed) must be JSON numbers
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stop))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "seed", None if self.seed is None else int(self.seed))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        """True when temperature == 0: the token is the argmax of the raw logits."""
        return self.temperature == 0


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
