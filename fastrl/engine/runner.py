"""The model runner: the one place that holds tensors and launches model work.

It owns the policy and drafter on their device, the KV caches, the per-strategy runtime state and (on a GPU) the
CUDA graphs. The engine loop hands it requests (already holding KV slots) and gets back plain Python values:
tokens, log-probs, accept lengths, and the hidden states a caller asked for. The scheduler never sees a tensor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from fastrl.engine.batch import SlotState
from fastrl.engine.config import EngineConfig
from fastrl.engine.device_memory import MEMORY_PARTS
from fastrl.engine.drafter_feed import DrafterFeed, backlog_limit, feed_prompts
from fastrl.engine.kv_budget import check_kv_cache_tokens, context_length, pages_per_request, round_lookahead
from fastrl.engine.kv_plan import KvPlan, incoming_bytes
from fastrl.engine.machine import check_device
from fastrl.engine.page_pool import PagePool
from fastrl.engine.plain_round import plain_round
from fastrl.engine.prefill import prefill, prefill_shared
from fastrl.engine.read_back import read_back, unpack
from fastrl.engine.request import Request
from fastrl.models.attention import PagedSdpa
from fastrl.models.backends import attention_backend
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache, KvShape, PageTable
from fastrl.models.layer_kernels import LayerKernels
from fastrl.models.layers import install_layer_kernels
from fastrl.sampling.sampler import sample
from fastrl.speculative.draft_tree import DraftTree
from fastrl.speculative.draft_vocab import wider_than
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafting import DrafterInput, split_pending
from fastrl.speculative.fused_drafter import check_extra_layers
from fastrl.speculative.history.index import HistoryIndex
from fastrl.speculative.history.tree import history_draft_tree
from fastrl.speculative.inputs import DecodeInputs
from fastrl.speculative.round import InPlaceReads, SpecModels, SpecRoundResult, speculative_round, timed_catch_up
from fastrl.speculative.runtime import build_runtimes
from fastrl.strategy.strategy import Strategy


@dataclass
class StepOutput:
    """What one prefill or decode round produced, per request row, as plain values.

    tokens[b] / logprobs[b]: the tokens row b emits, in order (accepted drafts, then the policy's own token; one
    token for prefill and plain rounds), already cut where the request finishes; finish[b]: why it finishes
    (a `fastrl.engine.finish.FINISH_CODES` key), 0 while it runs. accepted[b]: accepted draft tokens (0 for
    plain). hidden[b]: the hidden state behind each emitted token, [len(tokens[b]),F] float32 on the CPU, only
    for requests that asked for hidden states (else None). prompt_hidden[b]: a prefill's prompt hidden states
    [P-1,F] for such requests. F is the drafter's `feature_size`: H (the final-norm state), or for a fused
    drafter its input, the outputs of its `extra_layers` then the final-norm state (what co-training needs).
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish: list[int]
    accepted: list[int]
    hidden: list[Tensor | None]
    prompt_hidden: list[Tensor | None] = field(default_factory=list)
    drafted: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_rows: int = 0
    catch_up_time_s: float = 0.0
    """The drafter's catch-up on tokens that rounds without it emitted (timed only then; a part of
    ``draft_time_s``), or in a round without the drafter the reading its backlog limit forced (``_bound_backlog``)."""
    drafter_backlog: int | None = None
    """After a decode round: the entries a drafter round over its rows would first catch up on
    (``DrafterFeed.backlog``; None without a drafter)."""
    chain_depth: int | None = None
    """A stopping chain's levels drafted (``SpecRoundResult.chain_depth``); else None."""


class ModelRunner:
    """Runs prefills and decode rounds for an engine (see the module docstring).

    `strategies` is the selector's strategy space: runtime state (and CUDA graphs) is built for each speculative
    one at construction, so switching strategy between rounds is a lookup. History strategies (``suffix_N`` and
    hybrids) draft from `history`, which the engine keeps current.
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig,
        drafter: EagleDrafter | None,
        strategies: list[Strategy],
        history: HistoryIndex | None = None,
        graph_capture: Callable | None = None,
    ) -> None:
        """`graph_capture` (tests): build the graph rounds, their padding slot and static inputs on any device,
        each round run by this stand-in for the CUDA capture (see `CudaGraphRounds`)."""
        self.config = config
        check_device("engine.device", config.device)
        self.device = torch.device(config.device)
        dtype = config.torch_dtype
        # Every check first, the pool's plan last: a refused engine leaves the caller's modules as they were (no dtype
        # or device moved).
        speculative = [s for s in strategies if not s.is_disabled]
        eagle = [s for s in speculative if s.uses_drafter]
        if eagle and drafter is None:
            raise ValueError(f"strategies {[str(s) for s in eagle]} need a drafter; none was given")
        if any(s.is_history for s in speculative) and history is None:
            raise ValueError("history strategies (suffix_N) need a HistoryIndex; none was given")
        self.history = history
        mc = model.config
        if wide := wider_than(eagle, mc.vocab_size):
            raise ValueError(f"strategy {wide[0]}: topk {wide[0].topk} exceeds the vocabulary ({mc.vocab_size})")
        run_drafter = drafter if eagle else None
        # What the drafter reads (and co-training keeps): the final-norm state, or a fused drafter's layers too.
        self.feature_layers: tuple[int, ...] = drafter.extra_layers if drafter is not None else ()
        check_extra_layers(self.feature_layers, mc.num_hidden_layers)
        if run_drafter is not None and run_drafter.draft_vocab is not None:
            width = run_drafter.draft_vocab.numel()
            if wide := wider_than(eagle, width):
                s = wide[0]
                raise ValueError(f"strategy {s}: topk {s.topk} exceeds the drafter's draft vocabulary ({width})")
        self.runtimes = build_runtimes(speculative, self.device)
        self.max_model_len = context_length(config.max_model_len, mc.max_position_embeddings)
        # Entries a round writes past a row's n tokens (its accepted path and own token), and the scratch it
        # writes past the batch's longest row (tree nodes; the drafter's tree expansions).
        self.lookahead = round_lookahead(speculative)
        scratch = max((s.max_tree_nodes for s in speculative), default=1)
        if run_drafter is not None:
            scratch = max(scratch, max(self.runtimes[s].tree_area for s in eagle) + 2)
        use_graphs = config.cuda_graphs and (self.device.type == "cuda" or graph_capture is not None)
        slots = config.max_batch_size + (1 if use_graphs else 0)  # graphs pad batches on a scratch slot
        ps = config.page_size
        per_request = pages_per_request(self.max_model_len, self.lookahead, ps)
        num_pages = slots * per_request  # a graph's padding slot too: its home pages keep its reads in the cache
        if config.kv_cache_tokens is not None:
            check_kv_cache_tokens(
                "engine.kv_cache_tokens", config.kv_cache_tokens, self.max_model_len, self.lookahead, ps
            )
            num_pages = math.ceil(config.kv_cache_tokens / ps)
        configs = [mc] + ([run_drafter.config] if run_drafter is not None else [])
        shapes = [(c.num_attention_heads, c.num_key_value_heads, c.head_dim) for c in configs]
        columns, scratch_pages = PageTable.layout(self.max_model_len + scratch, ps, scratch)
        caches = (KvShape(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim),)
        if run_drafter is not None:  # one layer (EagleDrafter.new_cache)
            dc = run_drafter.config
            caches += (KvShape(1, dc.num_key_value_heads, dc.head_dim),)
        kv_plan = KvPlan(
            slots, num_pages, scratch_pages, columns, ps, caches, dtype, self.device, config.kv_cache_tokens
        )
        # The plan counts the modules' net change of the device's memory (a float32 policy already on the GPU,
        # cast to a bfloat16 engine, gives bytes back): the last check, before anything moves.
        kv_plan.check(incoming_bytes([model, run_drafter], self.device, dtype))
        # Only now the modules move to the engine's device and dtype (in place: the engine runs the caller's), and
        # then the pool is allocated in what they left free. An allocation that fails after the plan passed (the
        # plan's ValueError) leaves them moved.
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.drafter = run_drafter.to(device=self.device, dtype=dtype).eval() if run_drafter is not None else None
        with kv_plan.allocating():
            # The default pool holds every slot's context: each slot gets its own range of pages (read in place).
            home = per_request if config.kv_cache_tokens is None else None
            self.pool = PagePool(num_pages, ps, home)
            eos = mc.eos_token_id
            eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
            scratch_slot = config.max_batch_size if use_graphs else None  # the graphs' padding rows run there
            self.state = SlotState(slots, self.device, self.max_model_len, mc.vocab_size, eos_ids, scratch_slot)
            self.table = PageTable(slots, self.max_model_len + scratch, ps, num_pages, scratch, self.device, home)
            kernel = attention_backend(self.device, dtype, shapes, ps) if config.attention_kernel else None
            backend = kernel or PagedSdpa()
            if use_graphs:  # a graphed round reads nothing on the host (on a CPU: the graph path's tests)
                for sdpa in (backend, getattr(backend, "fallback", None)):
                    if isinstance(sdpa, PagedSdpa):
                        sdpa.host_reads = False
            self.cache = KVCache(
                mc.num_hidden_layers,
                slots,
                self.table.max_len,
                mc.num_key_value_heads,
                mc.head_dim,
                dtype=dtype,
                device=self.device,
                table=self.table,
                backend=backend,
            )
            if run_drafter is not None:
                dcache = run_drafter.new_cache(slots, self.table.max_len, dtype, self.device, self.table, backend)
                feature_size = run_drafter.feature_size
                limit = backlog_limit(
                    config.drafter_backlog, slots, feature_size, dtype, self.max_model_len, self.lookahead
                )
                self._feed_args = (slots, feature_size, dtype, self.device, self.lookahead, limit)
                self.feed = DrafterFeed(*self._feed_args)
        self._pending_copies: list[tuple[int, int]] = []  # shared prompts' partial pages, copied after their prefill
        if self.device.type == "cuda":  # installed (or taken out) on the modules this engine runs
            kernels = LayerKernels.load(self.device, dtype) if config.layer_kernels else None
            for module in (self.model, self.drafter):
                if module is not None:
                    install_layer_kernels(module, kernels)
        self.spec_models: SpecModels | None = None
        if self.drafter is not None:
            self.spec_models = SpecModels(self.model, self.cache, self.drafter, dcache, self.feature_layers)
        elif speculative:
            self.spec_models = SpecModels(self.model, self.cache, feature_layers=self.feature_layers)
        self._graph_capture = graph_capture
        self._use_graphs = use_graphs
        self.released: frozenset[str] = frozenset()
        """What `release_memory` gave back and `restore_memory` has not brought back: "kv_cache", "weights"."""
        self.graphs = self._capture_graphs(graph_capture) if use_graphs else None

    def release_memory(self, parts: frozenset[str] = MEMORY_PARTS) -> int:
        """Give back the device memory of ``parts`` (between rollouts; no request may hold a slot): "kv_cache" drops
        the policy's and the drafter's KV pools and the drafter's pending entries (every entry is lost: requests
        start afresh after `restore_memory`); "weights" moves the policy and the drafter to the CPU (their values
        kept). CUDA graphs hold both parts' addresses: they are dropped with either and captured again when both are
        back. Returns the device bytes the caches and weights held (0 on a CPU for the weights).

        # frees: caches [layers, pages*ps, kvh, hd] x 2 per cache, feed [S,W,F], graphs' pool; weights to the CPU
        """
        parts = frozenset(parts) - self.released
        if not parts:
            return 0
        freed = 0
        self.graphs = None  # their captured addresses die with either part
        if "kv_cache" in parts:
            for cache in self.caches:
                freed += 2 * cache.k.numel() * cache.k.element_size()
                cache.release()
            if self.drafter is not None:  # a fresh feed holds the few entries a round starts with
                self.feed = DrafterFeed(*self._feed_args)
        if "weights" in parts and self.device.type != "cpu":
            modules = [m for m in (self.model, self.drafter) if m is not None]
            held = {t.data_ptr(): t.numel() * t.element_size() for m in modules for t in m.state_dict().values()}
            freed += sum(held.values())  # tied weights once
            head = self.drafter.cached_head() if self.drafter is not None else None
            freed += 0 if head is None else head.numel() * head.element_size()
            self._move_models(torch.device("cpu"))
        self.released |= parts
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return freed

    def _move_models(self, device: torch.device) -> None:
        """The policy and the drafter to ``device``, the drafter's draft vocabulary with them; its restricted head
        (a cache of the policy's head rows, not a parameter) is dropped, to be read afresh there."""
        for module in (self.model, self.drafter):
            if module is not None:
                module.to(device)
        if self.drafter is not None:
            if self.drafter.draft_vocab is not None:
                self.drafter.set_draft_vocab(self.drafter.draft_vocab)  # on the drafter's device
            self.drafter.drop_cached_head()

    def restore_memory(self, parts: frozenset[str] = MEMORY_PARTS) -> None:
        """Bring back what `release_memory` gave back of ``parts``: the weights to the engine's device, the KV pools
        (all zeros, at new addresses); once nothing is released, the CUDA graphs are captured again."""
        parts = frozenset(parts) & self.released
        if "weights" in parts and self.device.type != "cpu":
            self._move_models(self.device)
        if "kv_cache" in parts:
            for cache in self.caches:
                cache.restore()
        self.released -= parts
        if not self.released and self._use_graphs and self.graphs is None:
            self.graphs = self._capture_graphs(self._graph_capture)

    def check_held(self, where: str) -> None:
        """RuntimeError naming ``where`` when the memory a round needs is released."""
        if self.released:
            raise RuntimeError(
                f"{where}: the engine's {' and '.join(sorted(self.released))} memory is released; "
                "call restore_memory() first"
            )

    @property
    def caches(self) -> list[KVCache]:
        """The KV caches over the engine's page table (the policy's, and the drafter's when there is one)."""
        return [self.cache] + ([self.spec_models.dcache] if self.spec_models and self.spec_models.dcache else [])

    def kv_bytes_held(self) -> int:
        """Bytes of the pool pages handed out plus every slot's scratch pages, over all caches."""
        pages = self.pool.used_pages + self.table.num_slots * self.table.scratch_pages
        return pages * sum(c.page_bytes for c in self.caches)

    def _sync_pages(self) -> None:
        """Apply the pool's changes to the page table and zero the pages freed (pages handed out are zero already:
        never written, or zeroed when freed); keep the page copies that must follow the next prefill of new
        prompts."""
        updates = self.pool.drain()
        unmapped = [key for key, page in updates.table.items() if page is None]
        mapped = [(key, page) for key, page in updates.table.items() if page is not None]
        self.table.unmap([s for s, _ in unmapped], [c for _, c in unmapped])
        self.table.map([s for (s, _), _ in mapped], [c for (_, c), _ in mapped], [p for _, p in mapped])
        for cache in self.caches:
            cache.clear_pages(updates.freed)
        self._pending_copies += updates.copies

    def drop_page_copies(self) -> None:
        """Forget the page copies queued for the next prefill: the admission that queued them was undone (its
        prefill or recompute raised, and the scheduler freed its pages, which other requests may hold next)."""
        self._pending_copies = []

    def resume(self, requests: list[Request]) -> None:
        """Recompute the KV of preempted requests readmitted: a prefill over every token but the last (fed by the
        next round), its hidden states queued for their drafter afresh."""
        self.check_held("ModelRunner.resume")
        self._sync_pages()
        tokens = [r.prompt_ids + r.output_ids[:-1] for r in requests]
        slots = self.state.admit(requests, [len(t) for t in tokens])
        result = prefill(self.model, self.cache, tokens, [r.slot for r in requests], feature_layers=self.feature_layers)
        if self.drafter is not None:
            fed = [t + [r.last_token] for t, r in zip(tokens, requests, strict=True)]
            feed_prompts(self.spec_models, self.feed, slots, [r.slot for r in requests], fed, result.features)

    def prefill(self, requests: list[Request]) -> StepOutput:
        """Prefill the prompts of `requests` (in their slots) and sample each one's first token.

        Requests with the same prompt (the n samples of a GRPO group) prefill once, policy and drafter: the others
        hold its full pages and get a copy of its partial last page, the policy's after the policy's prefill, the
        drafter's after the drafter's catch-up.
        """
        self.check_held("ModelRunner.prefill")
        self._sync_pages()
        result = prefill_shared(self.model, self.cache, requests, self.feature_layers)
        copies, self._pending_copies = self._pending_copies, []
        src, dst = [s for s, _ in copies], [d for _, d in copies]
        self.cache.copy_pages(src, dst)
        slots = self.state.admit(requests, [len(r.prompt_ids) for r in requests])
        slot_ids = [r.slot for r in requests]
        # Every request samples from its prompt's logits with its own seed.
        sampled = sample(result.last_logits, self.state.inputs(slot_ids).sampling, result.lengths)
        self.state.last[slots] = sampled.tokens
        tokens, logprobs = sampled.tokens.unsqueeze(1), sampled.logprobs.unsqueeze(1)
        one = torch.ones_like(sampled.tokens)
        finish = self.state.finish(slots, tokens, logprobs, one, self.state.lengths[slots])
        back = read_back(tokens, logprobs, torch.zeros_like(one), finish)
        if self.drafter is not None:
            fed = [r.prompt_ids + t for r, t in zip(requests, back.tokens, strict=True)]
            feed_prompts(self.spec_models, self.feed, slots, slot_ids, fed, result.features, result.computed)
            self.spec_models.dcache.copy_pages(src, dst)
        hidden: list[Tensor | None] = []
        prompt_hidden: list[Tensor | None] = []
        for row, request in enumerate(requests):
            length = len(request.prompt_ids)
            states = result.features[row]
            want = request.return_hidden_states
            prompt_hidden.append(states[: length - 1].detach().to("cpu", torch.float32) if want else None)
            hidden.append(states[length - 1 : length].detach().to("cpu", torch.float32) if want else None)
        return StepOutput(
            tokens=back.tokens,
            logprobs=back.logprobs,
            finish=back.finish,
            accepted=back.accepted,
            hidden=hidden,
            prompt_hidden=prompt_hidden,
            prefill_rows=result.computed_rows,
        )

    def decode(self, requests: list[Request], strategy: Strategy) -> StepOutput:
        """One decode round over `requests` with `strategy` (plain when disabled or without a drafter)."""
        self.check_held("ModelRunner.decode")
        self._sync_pages()
        slot_ids = [r.slot for r in requests]
        backlog_s = self._bound_backlog(slot_ids) if self.drafter is not None and not strategy.uses_drafter else 0.0
        # A graphed round takes its rows' slots and gathers the rest itself; an eager round takes its inputs here.
        graphed = self.graphs is not None and (strategy.is_disabled or _graphed(strategy))
        inputs = None if graphed else self.state.inputs(slot_ids)
        slots = self.state.slot_tensor(slot_ids) if graphed else inputs.slots
        packed = None  # the round's end, when a graph ran it (`SlotState.close_round`)
        if strategy.is_disabled:
            if graphed:
                result, packed = self.graphs.run_plain(slots)
            else:
                first = self._home_rows(slot_ids)
                result = plain_round(
                    self.model, self.cache, inputs, first_slot=first, feature_layers=self.feature_layers
                )
            tokens, logprobs, hidden = result.tokens.unsqueeze(1), result.logprobs.unsqueeze(1), result.hidden
            hidden = hidden.unsqueeze(1)
            accepted = torch.zeros_like(result.tokens) if packed is None else None  # the eager round's end reads it
            drafted, draft_s, verify_s, catch_up_s = 0, 0.0, 0.0, 0.0
            chain_depth = None
        else:
            spec, packed = self._speculate(requests, slots, inputs, strategy)
            tokens, logprobs, hidden, accepted = spec.tokens, spec.logprobs, spec.hidden, spec.accepted
            drafted, draft_s, verify_s = spec.draft_nodes, spec.draft_time_s, spec.verify_time_s
            catch_up_s, chain_depth = spec.catch_up_time_s, spec.chain_depth
        # the round's end advances the device state (a graph's already did): from there until the feed has the
        # round too, a failure (an allocation in `pack` or in the feed's growth, the host read) undoes the round
        try:
            if packed is None:
                packed = self.state.close_round(inputs.slots, inputs.lengths, tokens, logprobs, accepted)
            back = unpack(packed.cpu(), tokens.shape[1])  # THE host read
            out_hidden = _hidden_rows(requests, hidden, back.tokens)
            if self.drafter is not None:  # the last step that can fail: it writes nothing unless it completes
                self.feed.append(slot_ids, tokens, hidden, [a + 1 for a in back.accepted], strategy.uses_drafter)
        except BaseException:
            self._undo_round(requests, slots, strategy)
            raise
        drafter_backlog = self.feed.backlog(slot_ids) if self.drafter is not None else None
        return StepOutput(
            back.tokens,
            back.logprobs,
            back.finish,
            back.accepted,
            out_hidden,
            drafted=drafted,
            draft_time_s=draft_s,
            verify_time_s=verify_s,
            catch_up_time_s=catch_up_s + backlog_s,
            drafter_backlog=drafter_backlog,
            chain_depth=chain_depth,
        )

    def _undo_round(self, requests: list[Request], slots: Tensor, strategy: Strategy) -> None:
        """A round that failed in or after its end (`SlotState.close_round`, which advances the device state) but
        before it reached its requests and the drafter's feed: their rows go back to what the requests hold (the
        cache's entries past them are rewritten by the next round) and the drafter's entries the round took are
        pending again (a failed ``DrafterFeed.append`` wrote none over them)."""
        device = self.state.device
        self.state.lengths[slots] = torch.tensor([r.num_tokens - 1 for r in requests], dtype=torch.long, device=device)
        self.state.last[slots] = torch.tensor([r.last_token for r in requests], dtype=torch.long, device=device)
        if self.drafter is not None and strategy.uses_drafter:
            self.feed.restore_take()

    def _bound_backlog(self, slot_ids: list[int]) -> float:
        """Before a round without the drafter: where its entries could pass a slot's ``DrafterFeed.max_width``, the
        drafter reads that slot's pending entries but the last (which stays pending as the next root), as the next
        drafter round's catch-up would (`split_pending`); the seconds it took (0.0 when no slot was full)."""
        full = self.feed.full(slot_ids, self.lookahead)
        if not full:
            return 0.0
        inputs = self.state.inputs(full)
        pending = self.feed.take(inputs.slots, full)
        last, earlier, taken = split_pending(pending, 1)
        before = replace(inputs, lengths=inputs.lengths - taken)
        try:  # until the last entries are pending again, a failure leaves every entry pending (read again later)
            _, seconds = timed_catch_up(self.spec_models, before, earlier, int(inputs.lengths.max()), None, True)
            self.feed.append(full, last.tokens, last.features, [1] * len(full))
        except BaseException:
            self.feed.restore_take()
            raise
        return seconds

    def _speculate(
        self, requests: list[Request], slots: Tensor, inputs: DecodeInputs | None, strategy: Strategy
    ) -> tuple[SpecRoundResult, Tensor | None]:
        """A speculative round's tokens over the rows in `slots`, and its end packed when a graph ran it (else None:
        `close_round` is the caller's; `inputs` is None exactly when a graph runs it); one that raises emitted
        nothing and leaves the drafter's pending entries for the next round (``DrafterFeed.restore_take``), so the
        engine can go on stepping."""
        slot_ids = [r.slot for r in requests]
        start = time.perf_counter()
        pending, behind = None, False
        try:
            if strategy.uses_drafter:
                behind = self.feed.behind(slot_ids)  # rounds without the drafter left it their tokens: time that
                pending = self.feed.take(slots, slot_ids)
            history = self._history_tree(requests, strategy) if strategy.is_history else None
            prep_s = time.perf_counter() - start  # host work before the round: drafter input, history lookups
            if inputs is None:
                if self.drafter.draft_vocab is not None:
                    self.drafter.draft_head(self.model)  # refresh the restricted head the graphs read
                pending, catch_up_s = self._catch_up_past_graph(slots, pending, strategy, behind)
                spec, packed = self.graphs.run_speculative(slots, pending, strategy)
                spec.draft_time_s, spec.catch_up_time_s = time.perf_counter() - start, catch_up_s
                return spec, packed
            runtime, first, reads = self.runtimes[strategy], self._home_rows(slot_ids), None
            if first is not None:
                lengths = [r.num_tokens - 1 for r in requests]
                reads = InPlaceReads.decide(first, lengths, runtime, self.lookahead)
            spec = speculative_round(self.spec_models, inputs, runtime, pending, history, reads, behind)
            spec.draft_time_s += prep_s
            return spec, None
        except BaseException:
            if pending is not None:
                self.feed.restore_take()
            raise

    def _catch_up_past_graph(
        self, slots: Tensor, pending: DrafterInput, strategy: Strategy, behind: bool
    ) -> tuple[DrafterInput, float]:
        """What the strategy's graph catches up on (each row's last `catch_up_width` pending entries), after the
        drafter caught up eagerly on the entries before them where a row has more (timed when rounds without the
        drafter left them: see `timed_catch_up`); the eager seconds, 0.0 untimed or when there were none."""
        width = self.graphs.catch_up_width(strategy)
        if pending.tokens.shape[1] <= width:  # the widest row's pending entries, known on the host
            return pending, 0.0
        inputs = self.state.gather(slots)  # the rows' lengths, for the eager catch-up only (it samples nothing)
        last, earlier, taken = split_pending(pending, width)
        before = replace(inputs, lengths=inputs.lengths - taken)
        _, seconds = timed_catch_up(self.spec_models, before, earlier, self.graphs.base, None, behind)
        return last, seconds

    def _home_rows(self, slot_ids: list[int]) -> int | None:
        """The first slot when the rows are consecutive slots in order, all holding only their home pages (their
        keys are then read in place), else None.  # host lists only"""
        first = slot_ids[0]
        if slot_ids != list(range(first, first + len(slot_ids))) or not self.pool.all_at_home(slot_ids):
            return None
        return first

    def _history_tree(self, requests: list[Request], strategy: Strategy) -> DraftTree:
        """Every row's history draft (suffix index over its prompt, its group's responses and kept ones), padded to
        the strategy's history node count.  # B requests -> DraftTree [B,M]"""
        nodes, depth = strategy.history_nodes, strategy.history_max_depth
        drafts = [self.history.draft(r.request_id, nodes, depth) for r in requests]
        return history_draft_tree(drafts, nodes, depth, self.device)

    def _capture_graphs(self, capture: Callable | None = None):
        """CUDA graphs of every round this runner can run (plain per bucket, speculative per strategy and bucket)."""
        from fastrl.engine.cuda_graphs import CudaGraphRounds, StaticInputs, catch_up_width, graph_buckets

        mc = self.model.config
        size = self.config.max_batch_size
        eagle = {s: r for s, r in self.runtimes.items() if _graphed(s)}
        features = self.drafter.feature_size if self.drafter is not None else mc.hidden_size
        width = max((catch_up_width(r) for r in eagle.values()), default=1)
        # padding rows run on the slot state's scratch slot: the one whose length every graphed round puts back at 0
        scratch = self.state.scratch_slot
        static = StaticInputs.allocate(size, features, width, self.config.torch_dtype, self.device, scratch)
        models = self.spec_models if self.drafter is not None else None
        graphs = CudaGraphRounds(
            self.model,
            self.cache,
            models,
            eagle,
            graph_buckets(size),
            self.max_model_len,
            static,
            self.state,
            self.feature_layers,
            capture,
        )
        with torch.inference_mode():  # as every round runs: no autograd state kept alive by the graphs' outputs
            graphs.capture_all()
        return graphs


def _hidden_rows(requests: list[Request], hidden: Tensor, tokens: list[list[int]]) -> list[Tensor | None]:
    """The hidden states of the rows whose requests asked for them, one copy to the CPU, each cut where its row
    finished (``tokens[b]``: what row b emits); None for the others.  # hidden [B,K,F] -> [len(tokens[b]),F]"""
    out: list[Tensor | None] = [None] * len(requests)
    wanted = [row for row, request in enumerate(requests) if request.return_hidden_states]
    if wanted:
        rows = hidden[torch.tensor(wanted, device=hidden.device)].detach().to("cpu", torch.float32)
        for i, row in enumerate(wanted):
            out[row] = rows[i, : len(tokens[row])]
    return out


def _graphed(strategy: Strategy) -> bool:
    """True when a speculative strategy's rounds run as CUDA graphs (when graphs are on): not history rounds, which
    draft on the host, nor chains with a confidence stop, which decide their length there."""
    return not strategy.is_history and not strategy.stops_early
