"""The engine: continuous batching over a position-addressed KV cache, one decode round (plain or speculative)
per step, the strategy of each round chosen by a StrategySelector."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.adaptive.plain_meter import PlainTimeMeter
from fastrl.engine.config import EngineConfig
from fastrl.engine.device_memory import MEMORY_PARTS, memory_parts
from fastrl.engine.finish import FINISH_CODES
from fastrl.engine.request import FinishReason, Request, RequestOutput, now
from fastrl.engine.request_checks import checked_params, checked_prompt
from fastrl.engine.runner import ModelRunner, StepOutput
from fastrl.engine.scheduler import Scheduler
from fastrl.engine.server_info import ServerInfo
from fastrl.interrupts import held_interrupts
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.history.config import HistoryConfig
from fastrl.speculative.history.index import HistoryIndex
from fastrl.strategy.round_stats import MIN_WALL_TIME_S, RoundStats
from fastrl.strategy.selector import StrategySelector, plain_time_estimate
from fastrl.strategy.strategy import DISABLE, Strategy


@dataclass
class PrefillCounts:
    """Prompts prefilled, the rows the model actually ran (fewer when identical prompts shared a prefill), and the
    steps that prefilled (each one call of the runner's prefill: a forward per group of similar prompt lengths)."""

    prompts: int = 0
    computed: int = 0
    calls: int = 0

    def add(self, prompts: int, computed: int) -> None:
        self.prompts += prompts
        self.computed += computed
        self.calls += 1


@dataclass
class GenerateInput:
    """One prompt for `Engine.generate`: token ids, sampling params, optional id and hidden-state capture."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None
    return_hidden_states: bool = False


# the requests that progressed in a step, by id, each with the tokens it emitted there
Progressed = dict[str, tuple[Request, list[int]]]


class Engine:
    """Generates from a CausalLM with continuous batching and, given a drafter, EAGLE speculation.

    Streaming use: `add_request(...)` any time, then `step()` until `has_unfinished()` is False; each step returns
    the new tokens of every request that progressed, and the full output of every request that finished. Batch
    use: `generate(inputs)`. Before each decode round `selector.choose(batch_size)` picks the strategy
    (`disable` = plain round), after it `selector.observe` gets the round's RoundStats (also kept in
    `round_stats`). Outputs never depend on the strategy.

    History strategies (``suffix_N``, ``S_K_N+suffix_M``) draft from `history`, a suffix index the engine keeps
    current with every prompt and emitted token (requests with the same prompt form one group); pass one index to
    successive engines to keep earlier responses across RL steps. One is made when the strategy space needs it.

    The engine runs `model` and `drafter` themselves, moved to its device and dtype in place (``nn.Module.to``):
    engines of different dtypes or devices each need their own copy of the modules. They move only once every
    check has passed (strategies, device, the pool's size against the memory free once they have moved): a refused
    engine leaves them as they were. The pool is allocated after they move (in the memory a cast to a narrower
    dtype gives back); an allocation that fails even so is refused with the same ValueError but leaves them moved.
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        drafter: EagleDrafter | None = None,
        selector: StrategySelector | None = None,
        history: HistoryIndex | None = None,
    ) -> None:
        _check_parts(model, config, drafter, selector, history)
        self.config = config or EngineConfig()
        self.selector: StrategySelector = selector or FixedSelector(DISABLE)
        if history is None and any(s.is_history for s in self.selector.strategies):
            history = HistoryIndex(HistoryConfig(token_budget=self.config.history_tokens))
        self.history = history
        self.runner = ModelRunner(model, self.config, drafter, self.selector.strategies, history)
        self._space = frozenset([*self.selector.strategies, DISABLE])  # what a round can run
        self.max_model_len = self.runner.max_model_len
        mc = model.config
        self.scheduler = Scheduler(
            self.config.max_batch_size,
            self.max_model_len,
            mc.vocab_size,
            self.runner.pool,
            self.runner.lookahead,
            self.config.prefix_sharing,
            self.config.admission_slots,
        )
        self.round_stats: list[RoundStats] = []
        self._last_strategy: Strategy | None = None  # the last decode round's (its readers may clear round_stats)
        # estimates plain decoding's time for a selector without a cost model (set by calibrate_engine; see
        # fastrl.adaptive.plain_meter): it learns every round after the selector
        self.plain_meter: PlainTimeMeter | None = None
        self.prefill_rows = PrefillCounts()
        self._info = ServerInfo()
        self._seed_rng = random.Random(self.config.seed)
        self._ended: list[Request] = []  # finished outside a round (refused at add, aborted while waiting)
        # outputs of a step that raised after requests progressed (a selector's observe, a fault mid-round): the
        # next step returns them first, so no emitted token and no finished request is lost to the exception
        self._undelivered: list[RequestOutput] = []
        self._finishing = False  # a running request finished since the last release
        self._live_ids: set[str] = set()
        self._streamed: set[str] = set()  # unfinished requests queued by add_request (generate keeps none of theirs)
        self._next_id = 0

    @property
    def model(self) -> CausalLM:
        """The policy model, on the engine's device."""
        return self.runner.model

    @property
    def drafter(self) -> EagleDrafter | None:
        """The drafter, when the selector's strategy space speculates."""
        return self.runner.drafter

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        return_hidden_states: bool = False,
    ) -> str:
        """Queue a request; returns its id. A request the model cannot run (ids outside the vocabulary, a prompt past
        the context) finishes at the next step with an error; one of the wrong types is a ValueError now (see
        ``check_request``), and nothing is queued."""
        prompt, params = self.check_request(prompt_ids, params, request_id, return_hidden_states)
        request_id = self._queue(prompt, params, request_id, return_hidden_states)
        self._streamed.add(request_id)
        return request_id

    def _queue(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str | None,
        return_hidden_states: bool,
        reserved: AbstractSet[str] = frozenset(),
    ) -> str:
        """Queue a checked request (``check_request``'s prompt and params); returns its id. An id made here skips
        the running ones and ``reserved`` (ids that requests queued next will bring)."""
        if request_id is None:
            request_id = f"req-{self._next_id}"
            while self._id_taken(request_id) or request_id in reserved:  # a caller's own id of that form
                self._next_id += 1
                request_id = f"req-{self._next_id}"
        self._next_id += 1
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        request = Request(request_id, prompt, params, seed, return_hidden_states=return_hidden_states)
        request.timings.arrival = now()
        problem = self.scheduler.validate(request)
        if problem is not None:
            request.finish_reason = FinishReason.ERROR
            request.error = f"request {request_id}: {problem}"
            request.timings.finished = request.timings.arrival
            self._ended.append(request)
        else:
            if self.history is not None:  # first: a refusal there leaves nothing queued
                self.history.start(request_id, None, request.prompt_ids)
            self.scheduler.add(request)
        self._live_ids.add(request_id)
        return request_id

    def _undelivered_finish(self, request_id: str) -> bool:
        """The request has finished (aborted, refused, or in the last round) but no step has returned it yet."""
        pending = [*self._ended, *self.scheduler.running]
        if any(r.request_id == request_id and r.finished for r in pending):
            return True
        return any(o.request_id == request_id and o.finished for o in self._undelivered)

    def holds(self, request_id: str) -> bool:
        """Whether this engine holds ``request_id``: queued, running, or finished with its output not yet returned by
        a step (the ids ``add_request`` refuses as this engine's own)."""
        return request_id in self._live_ids

    def _id_taken(self, request_id: str) -> bool:
        """Running here, or live in the history index (which another engine may share)."""
        return request_id in self._live_ids or (self.history is not None and self.history.is_live(request_id))

    def check_request(
        self,
        prompt_ids: Iterable[int],
        params: SamplingParams | None,
        request_id: str | None,
        return_hidden_states: object = False,
    ) -> tuple[list[int], SamplingParams]:
        """The prompt as a list of Python ints and the params (defaults for None); ValueError naming the request
        when an id is not an integer (a float, a bool, a string: numpy integers are taken), the params are not a
        SamplingParams, the request id is not a non-empty string or is already running here, or
        `return_hidden_states` is not a bool. Checks types only: what the model cannot run (the vocabulary, the
        context) is the scheduler's, per request, at the next step."""
        name = "request" if request_id is None else f"request {request_id!r}"
        if request_id is not None and not isinstance(request_id, str):
            raise ValueError(f"{name}: a request id must be a string, got {type(request_id).__name__}")
        if request_id == "":
            raise ValueError("a request id must not be empty (None lets the engine name the request)")
        if not isinstance(return_hidden_states, bool):
            raise ValueError(
                f"{name}: return_hidden_states must be true or false, got {return_hidden_states!r} "
                f"({type(return_hidden_states).__name__})"
            )
        if request_id in self._live_ids:
            if self._undelivered_finish(request_id):
                raise ValueError(
                    f"request id {request_id!r} has finished in this engine, but its output comes with the next "
                    "step(); step() before reusing the id"
                )
            raise ValueError(f"request id {request_id!r} is already running in this engine")
        if request_id is not None and self._id_taken(request_id):
            raise ValueError(
                f"request id {request_id!r} is running in another engine that shares this engine's history index"
            )
        return checked_prompt(prompt_ids, name), checked_params(params, name)

    def abort(self, request_id: str) -> bool:
        """End an unfinished request now, between steps: the next step returns its final output with
        ``FinishReason.ABORT`` and the tokens (and log-probs) it had, and frees its slot and pages (a waiting or
        preempted request holds none). The other requests' outputs do not change (they never depend on who shares
        a round). Returns False, changing nothing, for an id that is not running here or whose request has already
        finished (its output comes as it would have). Like every call on an engine, not thread-safe: call it from
        the thread that steps the engine (``EngineWorker`` serialises its callers with a lock)."""
        if request_id not in self._live_ids:
            return False
        running = next((r for r in self.scheduler.running if r.request_id == request_id), None)
        if running is not None:
            if running.finished:
                return False
            self._finish(running, FinishReason.ABORT)  # released by the next step before its round
            return True
        waiting = next((r for r in self.scheduler.waiting if r.request_id == request_id), None)
        if waiting is None:
            return False  # finished already: its output waits for the next step
        self.scheduler.withdraw(waiting)
        self._finish(waiting, FinishReason.ABORT)
        self._ended.append(waiting)  # the history index hears of it when it is delivered, as of a running one
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or bool(self._ended) or bool(self._undelivered)

    def can_step(self) -> bool:
        """Whether a step would do anything: deliver outputs that need no device memory (requests aborted while
        waiting, refused at `add_request`, or finished in a step that raised), or run requests, which needs the
        memory `release_memory` gave back."""
        return bool(self._ended or self._undelivered) or (self.scheduler.has_work and not self.runner.released)

    # ---- device memory between rollouts ---------------------------------------------------------------------
    def release_memory(self, parts: Iterable[str] = MEMORY_PARTS) -> int:
        """Give back the device memory of ``parts`` while the engine is idle (a trainer on the same device needs it
        between rollouts): ``"kv_cache"`` (the KV pools; no entry survives, and none is needed: no request is
        running) and ``"weights"`` (the policy and drafter go to the CPU, their values kept). Requests may be
        queued meanwhile; stepping them waits for `restore_memory` (RuntimeError until then; one aborted or
        refused meanwhile needs no memory and is delivered at once, `can_step`). The selector, the
        history index and every count are kept. ValueError, releasing nothing, while a request is unfinished or
        for a part not named above. Returns the device bytes given back."""
        wanted = memory_parts("Engine.release_memory", parts)
        if self.has_unfinished():
            busy = len(self.scheduler.running) + len(self.scheduler.waiting)
            undelivered = len(self._ended) + sum(o.finished for o in self._undelivered)
            raise ValueError(
                f"Engine.release_memory: {busy} requests are unfinished and {undelivered} final outputs undelivered; "
                "step (or abort) them to their end first"
            )
        return self.runner.release_memory(wanted)

    def restore_memory(self, parts: Iterable[str] = MEMORY_PARTS) -> None:
        """Bring back what `release_memory` gave back of ``parts`` (all by default); the engine steps again once
        nothing is released (CUDA graphs are captured again then). ValueError for a part not named there."""
        self.runner.restore_memory(memory_parts("Engine.restore_memory", parts))

    @property
    def memory_released(self) -> frozenset[str]:
        """The parts of the engine's memory released and not yet restored (empty while it can step)."""
        return self.runner.released

    def server_info(self) -> ServerInfo:
        """A live view: active strategy, recent accept length, running and waiting requests."""
        self._info.running = len(self.scheduler.running)
        self._info.waiting = len(self.scheduler.waiting)
        return self._info

    # ---- stepping -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Admit and prefill waiting requests (recomputing preempted ones), then run one decode round over the other
        running requests, once each has pages for it.

        If anything raises (a prefill, a round, a selector's ``observe``), the exception propagates, requests whose
        prefill failed wait to be admitted again, and what had progressed is returned by the next step, ahead of that
        step's own outputs (a finished request's id stays taken until its output is returned)."""
        if not self.can_step() and self.scheduler.has_work:
            self.runner.check_held("Engine.step")  # only requests that need the released memory are left
        outputs: list[RequestOutput] = []
        progressed: Progressed = {}
        finished: list[Request] = []
        delivered: list[RequestOutput] | None = None
        freed: list[tuple[str, bool]] = []  # (id, whether streamed) of the finished outputs delivered
        try:
            # a step changes the device's state, then its requests' tokens, then what it returns: an interrupt waits
            # (from before it takes what earlier steps left: taken, it is delivered, or parked again below)
            with held_interrupts("the engine's step", raising_only=True):
                outputs, self._undelivered = self._undelivered, []
                self._take_ended(finished)
                if not self.runner.released:  # released: only what needs no memory (above) is delivered
                    finished += self._release()  # requests aborted since the last step: their slots go to the waiting
                    self._admit(progressed)
                    finished += self._release()
                    running = self.scheduler.running  # in slot order (the scheduler keeps it): keys read in place
                    active = [r for r in running if r.request_id not in progressed] if progressed else list(running)
                    active = self.scheduler.reserve(active)
                    if active:
                        self._decode(active, progressed)
                    finished += self._release()
                delivered = outputs + self._outputs(finished, progressed)
                for out in delivered:  # an id is free again once its final output is delivered
                    if out.finished:
                        freed.append((out.request_id, out.request_id in self._streamed))
                        self._live_ids.discard(out.request_id)
                        self._streamed.discard(out.request_id)
        except BaseException:
            for request_id, streamed in freed:  # not delivered after all: taken until they are
                self._live_ids.add(request_id)
                if streamed:
                    self._streamed.add(request_id)
            if delivered is None:
                finished += self._release()  # requests that finished in the round: their last tokens go with them
                delivered = outputs + self._outputs(finished, progressed)
            self._undelivered = delivered
            raise
        return delivered

    def _take_ended(self, finished: list[Request]) -> None:
        """Move the requests that ended outside a round (refused at ``add_request``, aborted while waiting) to
        ``finished``, each once the history index heard of it (refused ones never reached the index): where that
        raises, the rest stay for the next step, and the ones moved are delivered (or parked) by this one."""
        moved = 0
        try:
            for request in self._ended:
                if self.history is not None and request.finish_reason == FinishReason.ABORT:
                    self.history.finish(request.request_id, keep=keeps_history(request))
                finished.append(request)
                moved += 1
        finally:
            del self._ended[:moved]

    def take_undelivered(self) -> list[RequestOutput]:
        """What a step that raised left for the next one to return (see ``step``), now, for a caller that will not
        step again: an interrupted run that keeps the results which finished in the step the interrupt came in (it
        waits for the step's end). Their ids are free again, as after any delivery."""
        outputs, self._undelivered = self._undelivered, []
        for out in outputs:
            if out.finished:
                self._live_ids.discard(out.request_id)
                self._streamed.discard(out.request_id)
        return outputs

    def _admit(self, progressed: Progressed) -> None:
        """Admit waiting requests, recompute the preempted ones among them and prefill the others; if that raises,
        they go back to the head of the queue, to be admitted again by a later step."""
        admitted = self.scheduler.admit()
        try:
            resumed = [r for r in admitted if r.output_ids]
            if resumed:
                self.runner.resume(resumed)
            fresh = [r for r in admitted if not r.output_ids]
            if fresh:
                self._prefill(fresh, progressed)
        except BaseException:
            self.scheduler.readmit(admitted)
            self.runner.drop_page_copies()  # their destination pages were just freed
            raise

    def _outputs(self, finished: list[Request], progressed: Progressed) -> list[RequestOutput]:
        """One step's outputs: the full output of each finished request, then the new tokens of every other request
        that progressed (a request preempted after it progressed is waiting again)."""
        outputs = [r.to_output(progressed[r.request_id][1] if r.request_id in progressed else None) for r in finished]
        return outputs + [r.to_output(tokens) for r, tokens in progressed.values() if not r.finished]

    def _release(self) -> list[Request]:
        """Free the slots and pages of finished requests and tell the history index; returns them."""
        if not self._finishing:
            return []  # nobody finished since the last release: no scan of the running requests
        self._finishing = False
        released = self.scheduler.release_finished()
        if self.history is not None:
            for r in released:
                self.history.finish(r.request_id, keep=keeps_history(r))
        return released

    def generate(self, inputs: Iterable[GenerateInput], progress: bool = False) -> list[RequestOutput]:
        """Run a batch to completion; outputs come back in input order. ValueError while requests queued with
        ``add_request`` are unfinished (generate would run them to their end and drop their outputs)."""
        from tqdm.auto import tqdm

        if self._streamed:
            raise ValueError(
                "Engine.generate: requests queued with add_request are still running; step() them to their end first "
                "(generate would finish them and drop their outputs)"
            )
        self.runner.check_held("Engine.generate")  # before anything is queued: a refused call leaves nothing
        inputs = list(inputs)
        counts = Counter(i.request_id for i in inputs if i.request_id is not None)
        repeated = sorted(r for r, n in counts.items() if n > 1)
        if repeated:
            raise ValueError(f"request ids {repeated} appear more than once in one generate call")
        # every input checked before any is queued: a bad one leaves none behind
        checked = [self.check_request(i.prompt_ids, i.params, i.request_id, i.return_hidden_states) for i in inputs]
        reserved = set(counts)  # the call's own ids: an input without one must not be given one of them
        ids: list[str] = []
        results: dict[str, RequestOutput] = {}
        try:
            # queued whole or interrupted after (each request queued is then in `ids`, to be dropped below)
            with held_interrupts("queueing a generate call's requests", raising_only=True):
                for (prompt, params), i in zip(checked, inputs, strict=True):
                    ids.append(self._queue(prompt, params, i.request_id, i.return_hidden_states, reserved))
            with tqdm(total=len(ids), desc="generate", unit="req", disable=not progress) as bar:
                while self.has_unfinished():
                    for out in self.step():
                        if out.finished:
                            results[out.request_id] = out
                            bar.update(1)
                    if progress:
                        bar.set_postfix(self.server_info().postfix(), refresh=False)
        except BaseException:
            self._drop_call(ids)
            raise
        return [results[i] for i in ids]

    def drop(self, request_ids: list[str]) -> list[RequestOutput]:
        """Abort ``request_ids`` and step until each has been delivered, for a call whose caller is gone (an
        interrupted ``generate``): returns every output delivered meanwhile (parked ones first, see
        ``take_undelivered``), for the caller to account for. Interrupts wait for its end; what a step raises
        propagates, the rest left as they are."""
        with held_interrupts("dropping requests", raising_only=True):
            for request_id in request_ids:  # all aborted, or none: an interrupt waits for the requests' delivery
                self.abort(request_id)
            outputs = self.take_undelivered()
            while self.has_unfinished() and any(i in self._live_ids for i in request_ids):
                outputs += self.step()  # the requests aborted: a step delivers them
        return outputs

    def _drop_call(self, ids: list[str]) -> None:
        """After a ``generate`` call raised: its requests are dropped (``drop``), so the engine is as before the
        call (its ids free, nothing left to run). Where that cannot be done (stepping raises again), the ids stay
        marked as streamed: the next ``generate`` is refused with a clear error instead of running them."""
        self._streamed.update(i for i in ids if i in self._live_ids)
        try:
            self.drop(ids)
        except Exception:
            return  # the first error is the one raised

    # ---- internals ------------------------------------------------------------------------------------------
    def _prefill(self, requests: list[Request], progressed: Progressed) -> None:
        out = self.runner.prefill(requests)
        self.prefill_rows.add(len(requests), out.prefill_rows)
        first_token = now()
        for row, request in enumerate(requests):
            if out.prompt_hidden[row] is not None:
                request.prompt_hidden_states = out.prompt_hidden[row]
            request.timings.first_token = first_token
        self._emit_rows(requests, out, progressed)

    def _decode(self, requests: list[Request], progressed: Progressed) -> None:
        strategy = self.selector.choose(len(requests))
        if strategy not in self._space:
            space = sorted(str(s) for s in self._space)
            raise ValueError(f"{type(self.selector).__name__} chose {strategy}, outside its strategies {space}")
        context = sum(r.num_tokens for r in requests)  # the keys the round attends over (its time grows with them)
        start = time.perf_counter()
        catch_up = 0.0
        if strategy.is_history and self.history is not None:  # the index catches up on what earlier rounds emitted
            self.history.index_pending(r.request_id for r in requests)
            catch_up = time.perf_counter() - start
        out = self.runner.decode(requests, strategy)
        emitted = self._emit_rows(requests, out, progressed)
        for request, n, accepted in zip(requests, emitted, out.accepted, strict=True):
            request.accept_lengths.append(n)
            request.drafted_tokens += out.drafted
            request.accepted_tokens += accepted
        stats = RoundStats(
            strategy=strategy,
            batch_size=len(requests),
            drafted_tokens=[out.drafted] * len(requests),
            accepted_tokens=out.accepted,
            emitted_tokens=emitted,
            wall_time_s=max(time.perf_counter() - start, MIN_WALL_TIME_S),
            draft_time_s=out.draft_time_s,
            verify_time_s=out.verify_time_s,
            catch_up_time_s=catch_up + out.catch_up_time_s,  # the index's and the drafter's, inside the round: < wall
            context_tokens=context,
            after_other_arm=self._last_strategy not in (None, strategy),
            drafter_backlog=out.drafter_backlog,
            chain_depth=out.chain_depth,
        )
        stats.plain_time_estimate_s = plain_time_estimate(self._estimator, stats)  # the estimator's own number
        self.round_stats.append(stats)
        self._last_strategy = strategy
        self._info.observe(stats)
        self.selector.observe(stats)
        if self.plain_meter is not None:
            self.plain_meter.observe(stats)

    @property
    def _estimator(self) -> StrategySelector | PlainTimeMeter:
        """Who estimates a round's plain-decoding time: the meter when there is one, else the selector."""
        return self.plain_meter if self.plain_meter is not None else self.selector

    def _emit_rows(self, requests: list[Request], out: StepOutput, progressed: Progressed) -> list[int]:
        """Append each row's emitted tokens (the runner already cut them where the request finishes, and says
        why in `out.finish`); returns the counts emitted."""
        for request, tokens, logprobs, hidden in zip(requests, out.tokens, out.logprobs, out.hidden, strict=True):
            request.output_ids += tokens
            request.logprobs += logprobs
            progressed[request.request_id] = (request, tokens)
            if hidden is not None:
                request.hidden_states.append(hidden)
        for row, code in enumerate(out.finish):
            if code:
                self._finish(requests[row], FINISH_CODES[code])
        if self.history is not None:
            for request, tokens in zip(requests, out.tokens, strict=True):
                self.history.extend(request.request_id, tokens)
        return [len(tokens) for tokens in out.tokens]

    def _finish(self, request: Request, reason: FinishReason) -> None:
        """Mark a request finished (its slot and pages are released after the round)."""
        request.finish_reason = reason
        self._finishing = True
        if reason == FinishReason.ERROR:  # NaN or infinite logits: the last token and any after it mean nothing
            request.error = (
                f"request {request.request_id}: non-finite logits at generated token {len(request.logprobs) - 1}"
            )
        request.timings.finished = now()


def _check_parts(model: object, config: object, drafter: object, selector: object, history: object) -> None:
    """ValueError naming the first of the engine's parts that is not of its kind (e.g. a strategy string given
    where a selector goes), before anything is built."""
    kinds = [
        ("model", model, CausalLM, "a CausalLM (fastrl.models.checkpoint.load_model)"),
        ("config", config, EngineConfig, "an EngineConfig or None"),
        (
            "drafter",
            drafter,
            EagleDrafter,
            "an EagleDrafter (drafter_checkpoint.load_drafter) or None",
        ),
        ("history", history, HistoryIndex, "a HistoryIndex or None"),
    ]
    for name, value, kind, wanted in kinds:
        if not (isinstance(value, kind) or (value is None and name != "model")):
            raise ValueError(f"Engine: {name} must be {wanted}, got {type(value).__name__}")
    if selector is not None and not all(hasattr(selector, a) for a in ("strategies", "choose", "observe")):
        hint = " (FixedSelector(name) or build_selector(name) make one from a strategy name)"
        raise ValueError(f"Engine: selector must be a StrategySelector{hint}, got {type(selector).__name__}")


def keeps_history(request: Request) -> bool:
    """Whether a released request's response stays in the history index: one that ended in an error teaches it
    nothing, nor does one aborted before it emitted a token (an empty response would take its prompt tail's share of
    ``history_tokens`` and evict responses that draft); an aborted one that did emit some does."""
    return request.finish_reason != FinishReason.ERROR and bool(request.output_ids)
