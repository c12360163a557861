"""verl's request and output conventions in fastrl terms: the sampling dict an agent loop sends, the request
seed, the stop reason and the speculative-decoding fields verl aggregates. No verl import."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from fastrl.sampling.params import MAX_SEED, SamplingParams
from fastrl.strategy.strategy import Strategy

KNOWN_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "logprobs",
    "max_tokens",
    "max_new_tokens",
    "seed",
    "stop_token_ids",
    "ignore_eos",
)


@dataclass(frozen=True)
class RequestLimits:
    """verl's length settings that bound a request: prompt_length + response_length is the budget of a
    (multi-turn) conversation; ``ignore_eos`` is the rollout default."""

    prompt_length: int
    response_length: int
    ignore_eos: bool = False


@dataclass(frozen=True)
class ParsedRequest:
    """A verl sampling dict in fastrl terms: ``params`` is None when no token may be generated (budget spent)."""

    params: SamplingParams | None
    return_logprobs: bool


def request_seed(base_seed: int, request_id: str) -> int:
    """The seed of request ``request_id``: a hash of (base seed, id) in [0, 2**63). verl passes its own request
    ids through when ``rollout.full_determinism`` is on, so a request's tokens are then reproducible anywhere
    (``fastrl generate`` with this seed gives the same tokens)."""
    digest = hashlib.blake2b(f"{int(base_seed)}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % MAX_SEED


def parse_sampling(sampling: Mapping[str, object], prompt_len: int, limits: RequestLimits, seed: int) -> ParsedRequest:
    """Translate verl's sampling dict; unknown or unsupported keys raise ``ValueError`` naming them.

    ``top_k=-1`` (verl's "off") is fastrl's ``0``; without ``max_tokens``/``max_new_tokens`` the limit is SGLang's
    rule in verl: min(response_length, prompt_length + response_length - len(prompt)).
    """
    unknown = sorted(set(sampling) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(f"sampling_params.{unknown[0]}: not supported by the fastrl rollout (known: {KNOWN_KEYS})")
    penalty = sampling.get("repetition_penalty", 1.0)
    if penalty is not None and float(penalty) != 1.0:
        raise ValueError(f"sampling_params.repetition_penalty={penalty}: fastrl samples exactly; only 1.0 is supported")
    if "max_new_tokens" in sampling:
        limit = sampling["max_new_tokens"]
    elif "max_tokens" in sampling:
        limit = sampling["max_tokens"]
    else:
        limit = min(limits.response_length, limits.prompt_length + limits.response_length - prompt_len)
    if limit is None or isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError(f"sampling_params.max_tokens must be an integer, got {limit!r}")
    want_logprobs = bool(sampling.get("logprobs", False))
    if limit <= 0:
        return ParsedRequest(None, want_logprobs)
    top_k = sampling.get("top_k", -1)
    top_k = 0 if top_k is None or int(top_k) < 0 else int(top_k)
    explicit_seed = sampling.get("seed")
    try:
        params = SamplingParams(
            max_new_tokens=int(limit),
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=top_k,
            seed=int(explicit_seed) if explicit_seed is not None else seed,
            stop_token_ids=tuple(sampling.get("stop_token_ids") or ()),
            ignore_eos=bool(sampling.get("ignore_eos", limits.ignore_eos)),
        )
    except ValueError as err:
        raise ValueError(f"sampling_params: {err}") from err
    return ParsedRequest(params, want_logprobs)


def stop_reason(finish_reason: str) -> str:
    """verl's stop reason for a fastrl finish reason: ``completed`` (EOS or a stop token) or ``length``."""
    return "completed" if finish_reason == "stop" else "length"


@dataclass(frozen=True)
class SpecCounts:
    """The speculative-decoding counts verl aggregates per request (``rollout/spec_accept_rate`` = accepted /
    drafted, ``rollout/spec_accept_length`` = 1 + accepted / verify steps).

    verify_steps: decode rounds the request took part in (plain rounds included: their accept length is 1).
    accepted: draft tokens accepted, exactly (tokens emitted by decode rounds minus one per round).
    drafted: draft tokens proposed to the request: its rounds times the mean draft budget (``num_draft_tokens - 1``)
        of the rounds its server ran while the request was in flight (fastrl counts drafts per round, not per row).
    """

    drafted: int
    accepted: int
    verify_steps: int

    def fields(self) -> dict[str, int]:
        return {
            "spec_num_draft_tokens": self.drafted,
            "spec_num_accepted_tokens": self.accepted,
            "spec_num_verify_steps": self.verify_steps,
        }


def spec_counts(accept_lengths: list[int], rounds_by_strategy: Mapping[str, int]) -> SpecCounts:
    """Counts of one request from its per-round accept lengths and the server's rounds per strategy during it."""
    steps = len(accept_lengths)
    accepted = sum(max(n - 1, 0) for n in accept_lengths)
    total = sum(rounds_by_strategy.values())
    budget = sum(n * _draft_budget(name) for name, n in rounds_by_strategy.items())
    drafted = round(steps * budget / total) if total else 0
    return SpecCounts(drafted=max(drafted, accepted), accepted=accepted, verify_steps=steps)


def _draft_budget(name: str) -> int:
    strategy = Strategy.parse(name)
    return 0 if strategy.is_disabled else strategy.max_tree_nodes - 1
