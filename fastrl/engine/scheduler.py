"""Continuous-batching scheduler: a FIFO of waiting requests and a pool of KV-cache slots."""

from __future__ import annotations

from collections import deque

from fastrl.engine.request import FinishReason, Request


class Scheduler:
    """Admits waiting requests into free KV slots and releases slots of finished requests.

    The running batch is kept ordered by slot so that consecutive slots read as one slice of the cache.
    """

    def __init__(self, num_slots: int, max_model_len: int, vocab_size: int) -> None:
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots: list[int] = list(range(num_slots))

    def validate(self, request: Request) -> str | None:
        """The reason a request cannot run, or None when it can."""
        ids = request.prompt_ids
        if len(ids) == 0:
            return "empty prompt: a request needs at least one prompt token"
        if len(ids) >= self.max_model_len:
            return f"prompt has {len(ids)} tokens; the context length is {self.max_model_len}, leaving no room"
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            return f"prompt token ids out of the vocabulary [0, {self.vocab_size}): {bad[:8]}"
        return None

    def add(self, request: Request) -> None:
        """Queue a validated request."""
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests into free slots (FIFO); returns the newly admitted ones."""
        admitted = []
        while self.waiting and self._free_slots:
            request = self.waiting.popleft()
            request.slot = self._free_slots.pop(0)
            admitted.append(request)
        if admitted:
            self.running = sorted(self.running + admitted, key=lambda r: r.slot)
        return admitted

    def check_finished(self, request: Request, eos_ids: frozenset[int]) -> bool:
        """Set the request's finish reason from its last token and length; True when it finished."""
        if request.finished:
            return True
        params = request.params
        token = request.output_ids[-1]
        if token in params.stop_token_ids or (not params.ignore_eos and token in eos_ids):
            request.finish_reason = FinishReason.STOP
        elif len(request.output_ids) >= params.max_new_tokens:
            request.finish_reason = FinishReason.LENGTH
        elif request.num_tokens >= self.max_model_len:
            request.finish_reason = FinishReason.CONTEXT
        return request.finished

    def remaining_budget(self, request: Request) -> int:
        """How many more tokens the request may emit before a length limit stops it."""
        by_params = request.params.max_new_tokens - len(request.output_ids)
        by_context = self.max_model_len - request.num_tokens
        return max(0, min(by_params, by_context))

    def release_finished(self) -> list[Request]:
        """Free the slots of finished running requests; returns them."""
        done = [r for r in self.running if r.finished]
        if done:
            self.running = [r for r in self.running if not r.finished]
            for r in done:
                self._free_slots.append(r.slot)
            self._free_slots.sort()
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
