"""Requests as the engine sees them: the caller's input, the running state, and the output handed back."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from fastrl.sampling.params import SamplingParams


class FinishReason(str, Enum):
    """Why a request stopped generating."""

    STOP = "stop"  # EOS or one of the request's stop token ids
    LENGTH = "length"  # max_new_tokens reached
    CONTEXT = "context"  # the model's context length reached
    ERROR = "error"  # the request was invalid; see RequestOutput.error
    ABORT = "abort"  # ended by Engine.abort: its tokens so far, each as plain decoding would have made it


@dataclass(slots=True)
class Timings:
    """Wall-clock marks of one request, in seconds since the epoch (time.perf_counter based)."""

    arrival: float = 0.0
    first_token: float | None = None
    finished: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def latency(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class Request:
    """One request's state inside the engine. Positions are absolute: token i of prompt+output sits at position i."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    return_hidden_states: bool = False
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafts its rounds' verification accepted (past where it finished too)
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    prompt_hidden_states: torch.Tensor | None = None
    slot: int | None = None
    # Set by the scheduler at admission: the request (admitted in the same step) whose prompt pages this one shares.
    prompt_source: str | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    timings: Timings = field(default_factory=Timings)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_output(self, new_token_ids: list[int] | None = None) -> RequestOutput:
        """What the caller gets: while the request runs, a delta (its new tokens only: no copy of what was already
        reported); when it has finished, the full output. `new_token_ids` is handed over, not copied (the engine
        passes a list of the round's read-back that nothing else keeps)."""
        new = [] if new_token_ids is None else new_token_ids
        t = self.timings
        timings = Timings(t.arrival, t.first_token, t.finished)
        if self.finish_reason is None:
            return RequestOutput(self.request_id, [], [], [], None, None, self.seed, [], new, None, None, timings)
        hidden = torch.cat(self.hidden_states, dim=0) if self.hidden_states else None
        return RequestOutput(
            request_id=self.request_id,
            prompt_ids=list(self.prompt_ids),
            token_ids=list(self.output_ids),
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            error=self.error,
            seed=self.seed,
            accept_lengths=list(self.accept_lengths),
            new_token_ids=new,
            drafted_tokens=self.drafted_tokens,
            accepted_tokens=self.accepted_tokens,
            hidden_states=hidden,
            prompt_hidden_states=self.prompt_hidden_states,
            timings=timings,
        )


@dataclass(slots=True)
class RequestOutput:
    """What the engine returns for a request: `Engine.step` gives, for a request still running, a delta (only
    `request_id`, `seed`, `new_token_ids` and `timings` are filled; the lists below are empty), and the full output
    once it has finished.

    `accept_lengths[i]` is the number of tokens decode round i added (accepted drafts + 1, cut where the request
    finished), so the first token (sampled at prefill) plus their sum is len(token_ids). `drafted_tokens` counts
    the draft tokens its decode rounds proposed to it (tree nodes, or the depth a stopping chain reached; 0 in a
    plain round), `accepted_tokens` those its rounds' verification accepted: their ratio is the request's acceptance
    rate (``sum(accept_lengths) - len(accept_lengths)`` counts only the accepted drafts it kept: a request that
    finished inside an accepted path drops the rest of it).
    `hidden_states` (only when asked for, and only in the final output) holds, for each generated token i, the
    drafter's features at the position that produced it (absolute position len(prompt) - 1 + i): the policy's
    final-norm state, or with a fused drafter the outputs of its extra layers then that state (`ModelOutput.features`):
    shape [len(token_ids), F], F = hidden_size or (len(extra_layers) + 1) * hidden_size. `prompt_hidden_states`
    (same condition) holds them at prompt positions 0 .. len(prompt) - 2, so that together they cover every position
    that produced a token.
    """

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None
    error: str | None
    seed: int
    accept_lengths: list[int]
    new_token_ids: list[int]
    hidden_states: torch.Tensor | None
    prompt_hidden_states: torch.Tensor | None
    timings: Timings
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def now() -> float:
    """The engine's clock."""
    return time.perf_counter()
