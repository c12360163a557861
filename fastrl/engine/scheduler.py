"""Continuous-batching scheduler: a FIFO of waiting requests, batch slots, and KV pages taken as tokens arrive."""

from __future__ import annotations

from collections import deque

from fastrl.engine.page_pool import PagePool
from fastrl.engine.request import Request


def prompt_problem(ids: list[int], context: int | None, vocab_size: int | None) -> str | None:
    """Why a policy of ``context`` positions and ``vocab_size`` tokens cannot run a prompt (None: it can; a None
    limit is not checked): the engine's rule, which commands apply before any work."""
    if len(ids) == 0:
        return "empty prompt: a request needs at least one prompt token"
    if context is not None and len(ids) >= context:
        return f"prompt has {len(ids)} tokens; the context length is {context}, leaving no room for a response"
    if vocab_size is not None:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            return f"prompt token ids out of the vocabulary [0, {vocab_size}): {bad[:8]}"
    return None


class Scheduler:
    """Admits waiting requests into free slots while KV pages last, and releases slots and pages at finish.

    A request is admitted when a slot is free and the pool holds its prefill plus one round (`lookahead` entries
    past its tokens); before each decode round `reserve` gives every running request pages for that round,
    preempting the most recently admitted ones when the pool runs out (their pages are freed; they wait at the
    head of the queue and are recomputed by a prefill over their tokens when readmitted). Requests admitted in
    the same step with identical prompts share the prompt's pages (`prefix_sharing`). While requests run and more
    wait than slots are free, admission waits for `admit_batch` free slots (their prefills then run together).
    """

    def __init__(
        self,
        num_slots: int,
        max_model_len: int,
        vocab_size: int,
        pool: PagePool,
        lookahead: int = 1,
        prefix_sharing: bool = True,
        admit_batch: int = 1,
    ) -> None:
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.pool = pool
        self.lookahead = lookahead
        self.prefix_sharing = prefix_sharing
        self.admit_batch = admit_batch
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self._free_slots: list[int] = list(range(num_slots))
        self._admitted: dict[str, int] = {}  # request id -> admission order
        self._order = 0

    def validate(self, request: Request) -> str | None:
        """The reason a request cannot run, or None when it can."""
        return prompt_problem(request.prompt_ids, self.max_model_len, self.vocab_size)

    def add(self, request: Request) -> None:
        """Queue a validated request."""
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests into free slots (FIFO) while pages last; returns the newly admitted ones.

        A request resumed after preemption holds pages for its `num_tokens - 1` entries (it is recomputed), a new
        one for its prompt (shared with an identical prompt admitted in the same step when sharing is on).
        """
        admitted: list[Request] = []
        free = len(self._free_slots)
        if self.running and free < self.admit_batch and len(self.waiting) > free:
            return admitted  # the running requests free more slots soon: one prefill for a batch of arrivals
        first_of: dict[tuple[int, ...], Request] = {}
        while self.waiting and self._free_slots:
            request = self.waiting[0]
            entries = request.num_tokens - 1 if request.output_ids else len(request.prompt_ids)
            if self.pool.pages_for(entries + self.lookahead) > self.pool.free_pages:
                break  # wait for pages to free up (FIFO: nobody overtakes the head)
            slot = self._free_slots.pop(0)
            source = first_of.get(tuple(request.prompt_ids)) if self.prefix_sharing and not request.output_ids else None
            taken = self.pool.share(source.slot, slot, entries) if source else self.pool.ensure(slot, entries)
            if not taken:
                self._free_slots.insert(0, slot)
                break
            if source is None and not request.output_ids:
                first_of[tuple(request.prompt_ids)] = request
            self.waiting.popleft()
            request.slot = slot
            request.prompt_source = None if source is None else source.request_id
            self._admitted[request.request_id] = self._order
            self._order += 1
            admitted.append(request)
        if admitted:
            self.running = sorted(self.running + admitted, key=lambda r: r.slot)
        return admitted

    def reserve(self, requests: list[Request]) -> list[Request]:
        """Give each of `requests` pages for one more round, preempting the latest admitted running requests when
        the pool runs short; returns those of `requests` that keep running (in order).

        Only the requests whose pages are full take part (in admission order): the others take nothing and
        preempt nobody, so leaving them out changes nothing but the host work.
        """
        pool, lookahead = self.pool, self.lookahead
        needy = [r for r in requests if not pool.has_room(r.slot, r.num_tokens - 1 + lookahead)]
        if not needy:
            return requests
        for request in sorted(needy, key=lambda r: self._admitted[r.request_id]):
            while request.slot is not None and not self.pool.ensure(
                request.slot, request.num_tokens - 1 + self.lookahead
            ):
                victim = max((r for r in self.running if not r.finished), key=lambda r: self._admitted[r.request_id])
                self._preempt(victim)
        return [r for r in requests if r.slot is not None]

    def readmit(self, requests: list[Request]) -> None:
        """Undo the admission of `requests` (their prefill failed): slots and pages freed, back at the head of the
        queue in their order, to be prefilled (or recomputed) when next admitted."""
        for request in reversed(requests):
            if request.slot is not None:
                self._unseat(request)

    def _preempt(self, request: Request) -> None:
        """Free a running request's slot and pages; it waits at the head of the queue to be recomputed."""
        if len([r for r in self.running if not r.finished]) == 1:
            raise RuntimeError(
                f"request {request.request_id}: {request.num_tokens} tokens do not fit the KV cache's "
                f"{self.pool.num_pages} pages of {self.pool.page_size} even alone"
            )
        self._unseat(request)
        self.preemptions += 1

    def _unseat(self, request: Request) -> None:
        """Free a running request's slot and pages and put it at the head of the queue."""
        self.pool.release(request.slot)
        self._free_slots.append(request.slot)
        self._free_slots.sort()
        self.running.remove(request)
        del self._admitted[request.request_id]
        request.slot = None
        self.waiting.appendleft(request)

    def withdraw(self, request: Request) -> None:
        """Take a waiting request (new, or preempted) out of the queue; it holds no slot and no pages."""
        self.waiting.remove(request)

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
                self.pool.release(r.slot)
                self._admitted.pop(r.request_id, None)
                self._free_slots.append(r.slot)
            self._free_slots.sort()
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
