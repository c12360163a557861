"""verl's request and output conventions in fastrl terms: the sampling dict an agent loop sends, the request
seed, the stop reason and the speculative-decoding fields verl aggregates. No verl import."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastrl.json_values import is_integral, is_real
from fastrl.sampling.params import MAX_SEED, SamplingParams

if TYPE_CHECKING:
    from fastrl.engine.request import RequestOutput
    from fastrl.rollout.types import RolloutResult

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
    """Translate verl's sampling dict; unknown or unsupported keys raise ``ValueError`` naming them. A numpy scalar
    or a 0-d array or tensor is, under every key, the Python number it holds.

    ``top_k=-1`` (verl's "off") is fastrl's ``0``; any other negative ``top_k`` is refused, as vLLM refuses it.
    None under any key means the key is absent. ``max_tokens`` is taken over ``max_new_tokens`` when both are
    given; without either the limit is SGLang's rule in verl: min(response_length, prompt_length + response_length -
    len(prompt)).
    """
    unknown = sorted(set(sampling) - set(KNOWN_KEYS))
    if unknown:
        names = ", ".join(f"sampling_params.{key}" for key in unknown)
        raise ValueError(f"{names}: not supported by the fastrl rollout (known: {KNOWN_KEYS})")
    sampling = {key: _python(value) for key, value in sampling.items()}  # the one place numpy / torch scalars go
    penalty = sampling.get("repetition_penalty", 1.0)
    if penalty is not None and not is_real(penalty):
        raise ValueError(f"sampling_params.repetition_penalty must be a number, got {penalty!r}")
    if penalty is not None and float(penalty) != 1.0:
        raise ValueError(f"sampling_params.repetition_penalty={penalty}: fastrl samples exactly; only 1.0 is supported")
    logprobs = sampling.get("logprobs", False)
    if logprobs is not None and not (isinstance(logprobs, bool) or is_integral(logprobs) and logprobs >= 0):
        raise ValueError(f"sampling_params.logprobs must be a bool or a count >= 0, got {logprobs!r}")
    if sampling.get("max_tokens") is not None:  # first: verl's fully-async client rewrites max_tokens alone
        key, limit = "max_tokens", sampling["max_tokens"]
    elif sampling.get("max_new_tokens") is not None:
        key, limit = "max_new_tokens", sampling["max_new_tokens"]
    else:
        key, limit = "", min(limits.response_length, limits.prompt_length + limits.response_length - prompt_len)
    if not is_integral(limit):
        raise ValueError(f"sampling_params.{key or 'max_tokens'} must be an integer, got {limit!r}")
    if limit < 0:
        if key:
            raise ValueError(f"sampling_params.{key} must be >= 0, got {limit}")
        raise ValueError(
            f"a prompt of {prompt_len} tokens leaves no room in prompt_length + response_length = "
            f"{limits.prompt_length + limits.response_length} tokens"
        )
    want_logprobs = bool(logprobs)
    top_k = _given(sampling, "top_k", -1)
    try:  # checked whatever the budget: a bad value is an error on every request, not on some
        params = SamplingParams(
            max_new_tokens=max(int(limit), 1),
            temperature=_given(sampling, "temperature", 1.0),
            top_p=_given(sampling, "top_p", 1.0),
            top_k=0 if is_integral(top_k) and top_k == -1 else top_k,  # verl's -1 is fastrl's 0: off
            seed=_given(sampling, "seed", seed),
            stop_token_ids=_given(sampling, "stop_token_ids", ()),
            ignore_eos=_given(sampling, "ignore_eos", limits.ignore_eos),
        )
    except ValueError as err:
        message = str(err)
        if key and message.startswith("max_new_tokens"):  # the request's own name for the limit
            message = key + message.removeprefix("max_new_tokens")
        raise ValueError(f"sampling_params.{message}") from err
    if limit == 0:  # a conversation that has spent its budget: nothing to generate
        return ParsedRequest(None, want_logprobs)
    return ParsedRequest(params, want_logprobs)


def _python(value: object) -> object:
    """A numpy scalar (or 0-d array or tensor) as the Python number it holds; anything else as it is."""
    return value.item() if getattr(value, "ndim", None) == 0 and hasattr(value, "item") else value


def _given(sampling: Mapping[str, object], key: str, default: object) -> object:
    """The request's value of ``key`` (checked by ``SamplingParams``), or ``default`` when absent or None."""
    value = sampling.get(key)
    return default if value is None else value


def token_ids(values: object) -> list[int]:
    """A request's prompt as Python ints (a list, a numpy array or a tensor of integers); anything else is a
    ValueError saying what was given."""
    items = values.tolist() if hasattr(values, "tolist") else values
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ValueError(f"prompt_ids must be a list of token ids, got {type(values).__name__}")
    bad = next((t for t in items if not is_integral(t)), None)
    if bad is not None:
        raise ValueError(f"prompt_ids must hold integer token ids, got {bad!r}")
    return [int(t) for t in items]


def stop_reason(finish_reason: str) -> str:
    """verl's stop reason for a fastrl finish reason: ``completed`` (EOS or a stop token), ``aborted`` (ended by an
    abort: verl's partial rollout resumes it) or ``length``."""
    return {"stop": "completed", "abort": "aborted"}.get(finish_reason, "length")


@dataclass(frozen=True)
class SpecCounts:
    """The speculative-decoding counts verl aggregates per request (``rollout/spec_accept_rate`` = accepted /
    drafted, ``rollout/spec_accept_length`` = 1 + accepted / verify steps).

    verify_steps: decode rounds the request took part in (plain rounds included: their accept length is 1).
    accepted: draft tokens its rounds' verification accepted, exactly (``RolloutResult.accepted_tokens``: those past
    where the request finished too, as vLLM counts them).
    drafted: draft tokens proposed to the request by its rounds, exactly (``RolloutResult.drafted_tokens``).
    """

    drafted: int
    accepted: int
    verify_steps: int

    @classmethod
    def of(cls, result: RolloutResult | RequestOutput) -> SpecCounts:
        """The counts of one request's result: its decode rounds (one accept length each), the draft tokens they
        proposed and those they accepted."""
        return cls(
            drafted=result.drafted_tokens, accepted=result.accepted_tokens, verify_steps=len(result.accept_lengths)
        )

    def fields(self) -> dict[str, int]:
        return {
            "spec_num_draft_tokens": self.drafted,
            "spec_num_accepted_tokens": self.accepted,
            "spec_num_verify_steps": self.verify_steps,
        }
