"""CUDA graphs of decode rounds, captured once at engine start and replayed every round.

One graph per batch bucket for the plain round, and one per (strategy, bucket) for the speculative round. Every
graph starts from its rows' slots (the one static input besides a speculative round's pending drafter entries) and
gathers their lengths, last tokens and sampling settings from the slot state (`SlotState.gather`); a speculative
graph then runs the drafter's catch-up on the pending entries of each row (at most `catch_up_width` of them, the
strategy's depth + 1, which is all a round of it leaves) and `draft_and_verify` (drafter tree steps, the verify
forward, sampling, acceptance and KV compaction). Every graph ends with the round's end (`SlotState.close_round`: the
finish rules, the slots' lengths and last tokens advanced in place, the results packed for the host). Eager ops
around the replay did both before: ~70 a round. A row with more pending entries (after plain rounds, or a deeper
strategy's round) has the earlier ones caught up eagerly first (`fastrl.speculative.drafting.split_pending`). A batch
of b rows runs the graph of the smallest bucket >= b; the rows past b are padding that reads and writes only a
scratch slot (of the cache and of the slot state). All graphs read one set of static input buffers (sized to the
largest bucket) and allocate from one shared memory pool, so switching strategy between rounds is a dictionary
lookup and costs no capture. Tree nodes of every graph go to the fixed cache area past `max_model_len` (the
`base` of the round), so no round needs a host synchronisation except reading its results.

Sampling inside a graph always computes the Gumbel noise and the top-k/top-p cut (the host-side shortcuts for
all-greedy or unfiltered batches would change the graph); both leave greedy and unfiltered rows unchanged, so
the tokens equal the eager rounds'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeVar

import torch
from torch import Tensor

from fastrl.engine.batch import SlotState
from fastrl.engine.plain_round import PlainRoundResult, plain_round
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.speculative.drafting import DrafterInput
from fastrl.speculative.round import SpecModels, SpecRoundResult, catch_drafter_up, draft_and_verify
from fastrl.speculative.runtime import StrategyRuntime
from fastrl.strategy.strategy import Strategy

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
WARMUP_RUNS = 2
T = TypeVar("T")


def graph_buckets(max_batch_size: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> list[int]:
    """The buckets that fit `max_batch_size`, plus `max_batch_size` itself so every batch has a bucket."""
    return sorted({b for b in buckets if b < max_batch_size} | {max_batch_size})


@dataclass
class StaticInputs:
    """The graphs' input buffers, sized to the largest bucket: the rows' slots (a graph gathers everything else of
    its rows from the slot state, `SlotState.gather`) and their pending drafter entries; rows past a batch are
    padding on the scratch slot."""

    slots: Tensor
    pending: DrafterInput
    """The rows' pending drafter entries, left-aligned: tokens [R,W], features [R,W,F], counts [R]."""
    scratch_slot: int

    @classmethod
    def allocate(
        cls,
        rows: int,
        feature_size: int,
        width: int,
        dtype: torch.dtype,
        device: torch.device,
        scratch_slot: int,
    ):
        """Buffers for `rows` rows; `width` pending drafter entries per row of `feature_size` features."""
        return cls(
            slots=torch.full((rows,), scratch_slot, dtype=torch.long, device=device),
            pending=DrafterInput(
                torch.zeros(rows, width, dtype=torch.long, device=device),
                torch.zeros(rows, width, feature_size, dtype=dtype, device=device),
                torch.ones(rows, dtype=torch.long, device=device),
            ),
            scratch_slot=scratch_slot,
        )

    def pending_view(self, bucket: int, width: int) -> DrafterInput:
        """The first `bucket` rows' first `width` pending entries (fixed addresses).  # [bucket,width](,F), [bucket]"""
        p = self.pending
        return DrafterInput(p.tokens[:bucket, :width], p.features[:bucket, :width], p.counts[:bucket])

    def load(self, slots: Tensor, bucket: int, pending: DrafterInput | None = None) -> None:
        """Copy a batch of b <= bucket rows' slots in; rows b..bucket-1 become padding on the scratch slot (one
        pending entry each). `pending` (a speculative round): [b,w] entries, w at most the buffers' width; the
        columns past a row's count are padding the catch-up does not read."""
        b = slots.shape[0]
        self.slots[:b].copy_(slots, non_blocking=True)
        if b < bucket:  # padding rows (none when the batch fills its bucket: no launch)
            self.slots[b:bucket].fill_(self.scratch_slot)
        if pending is not None:
            w = pending.tokens.shape[1]
            p = self.pending
            p.tokens[:b, :w].copy_(pending.tokens, non_blocking=True)
            p.features[:b, :w].copy_(pending.features)
            p.counts[:b].copy_(pending.counts, non_blocking=True)
            if b < bucket:
                p.counts[b:bucket].fill_(1)


@dataclass
class GraphedRound:
    """What a graph's replay rewrites: the round's result and its end packed (`SlotState.close_round`)."""

    result: PlainRoundResult | SpecRoundResult
    packed: Tensor


@dataclass
class CapturedRound:
    """A captured graph and the output tensors its replay rewrites. With a test's stand-in capture (graph None) a
    replay runs the round's function again and writes its results into the same outputs, as a graph's replay does:
    the engine's graph path (static inputs, padding rows, the fixed tree base, the round's end in place) then runs on
    any device."""

    graph: torch.cuda.CUDAGraph | None
    outputs: GraphedRound
    fn: Callable[[], GraphedRound] | None = None

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        fresh = self.fn()
        self.outputs.packed.copy_(fresh.packed)
        for item in fields(self.outputs.result):  # every tensor of the result, whatever the round's kind
            if isinstance(kept := getattr(self.outputs.result, item.name), Tensor):
                kept.copy_(getattr(fresh.result, item.name))


class CudaGraphRounds:
    """Captures and replays the decode rounds of one engine (see the module docstring)."""

    def __init__(
        self,
        policy: CausalLM,
        cache: KVCache,
        models: SpecModels | None,
        runtimes: dict[Strategy, StrategyRuntime],
        buckets: list[int],
        base: int,
        static: StaticInputs,
        state: SlotState,
        feature_layers: tuple[int, ...] = (),
        capture: Callable[[Callable[[], T]], T] | None = None,
    ) -> None:
        """`models` is None for an engine without a drafter (plain graphs only); `base` is the cache index of the
        tree area (max_model_len); `static` the input buffers every graph reads; `state` the slot state a graph
        gathers its rows' inputs from and ends its round in (`SlotState.gather`, `close_round`: tensors that keep
        their storage); `feature_layers` the policy layers
        a fused drafter reads (the plain graphs return them with the final-norm state; the speculative graphs
        take them from `models`).
        `capture` (tests) replaces the CUDA capture: it calls a round's function as a capture would and returns
        its outputs (`CapturedRound.graph` is then None, and a replay calls the function again); on a CPU it lets
        a test run every round a graph would hold under a guard against what a capture refuses, and generate
        through the graph path (tests/engine/test_graph_capture_safety.py)."""
        self.feature_layers = feature_layers
        self.models = models
        self.policy, self.cache = policy, cache
        self.runtimes = runtimes
        self.buckets = buckets
        self.base = base
        self.static = static
        self.state = state
        self.capture = capture
        on_gpu = capture is None
        self.pool = torch.cuda.graph_pool_handle() if on_gpu else None
        self.warmup_stream = torch.cuda.Stream() if on_gpu else None
        self.plain: dict[int, CapturedRound] = {}
        self.spec: dict[tuple[Strategy, int], CapturedRound] = {}
        self.pool_bytes = 0
        self.capture_seconds = 0.0

    def capture_all(self) -> None:
        """Capture every graph (plain per bucket; speculative per strategy and bucket), largest bucket first."""
        import time

        device = self.static.slots.device
        on_gpu = self.capture is None
        if on_gpu:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()  # what is reserved afterwards is the graphs' private pool (plus their outputs)
            before = torch.cuda.memory_reserved(device)
        start = time.perf_counter()
        # Every row the scratch slot while capturing: a capture's warm-up runs end their rounds for real, and those
        # ends (the slots' lengths advanced) must touch no request's slot.
        self.static.slots.fill_(self.static.scratch_slot)
        for bucket in sorted(self.buckets, reverse=True):
            slots = self.static.slots[:bucket]
            self.plain[bucket] = self._capture(lambda s=slots: self._plain(s))
            if self.models is None:
                continue
            for strategy, runtime in self.runtimes.items():
                pending = self.static.pending_view(bucket, catch_up_width(runtime))
                self.spec[(strategy, bucket)] = self._capture(
                    lambda s=slots, r=runtime, p=pending: self._speculative(s, p, r)
                )
        if on_gpu:
            torch.cuda.synchronize(device)
        self.capture_seconds = time.perf_counter() - start
        if on_gpu:
            torch.cuda.empty_cache()
            self.pool_bytes = torch.cuda.memory_reserved(device) - before

    def bucket_for(self, batch_size: int) -> int | None:
        return next((b for b in self.buckets if b >= batch_size), None)

    def run_plain(self, slots: Tensor) -> tuple[PlainRoundResult, Tensor]:
        """Replay the plain round of the batch's bucket over the rows in `slots`; its result and its end packed (the
        batch's rows in each).  # slots [b] -> [b] tokens, logprobs, [b,F] hidden; [b,5] packed"""
        b = slots.shape[0]
        bucket = self._bucket(b)
        self.static.load(slots, bucket)
        captured = self.plain[bucket]
        captured.replay()
        out = captured.outputs.result
        return PlainRoundResult(out.tokens[:b], out.logprobs[:b], out.hidden[:b]), captured.outputs.packed[:b]

    def _plain(self, slots: Tensor) -> GraphedRound:
        """What a plain graph holds: its rows' inputs gathered, the round over the whole cache, then its end."""
        inputs = self.state.gather(slots)
        result = plain_round(self.policy, self.cache, inputs, self.base + 1, feature_layers=self.feature_layers)
        tokens, logprobs = result.tokens.unsqueeze(1), result.logprobs.unsqueeze(1)
        zeros = torch.zeros_like(result.tokens)
        return GraphedRound(result, self.state.close_round(slots, inputs.lengths, tokens, logprobs, zeros))

    def _speculative(self, slots: Tensor, pending: DrafterInput, runtime: StrategyRuntime) -> GraphedRound:
        """What a speculative graph holds: its rows' inputs gathered, the drafter's catch-up on `pending`, draft and
        verify, the round's end."""
        inputs = self.state.gather(slots)
        root_feature = catch_drafter_up(self.models, inputs, pending, self.base)
        spec = draft_and_verify(self.models, inputs, root_feature, runtime, self.base)
        packed = self.state.close_round(slots, inputs.lengths, spec.tokens, spec.logprobs, spec.accepted)
        return GraphedRound(spec, packed)

    def catch_up_width(self, strategy: Strategy) -> int:
        """Pending entries per row the strategy's graphs catch up on (more are caught up eagerly first)."""
        return catch_up_width(self.runtimes[strategy])

    def run_speculative(
        self, slots: Tensor, pending: DrafterInput, strategy: Strategy
    ) -> tuple[SpecRoundResult, Tensor]:
        """Replay the speculative round of the strategy and the batch's bucket over the rows in `slots`, its catch-up
        on `pending` (at most `catch_up_width` entries per row) included; its result and its end packed.
        # slots [b], pending [b,w] -> result of [b] rows; [b,2D+5] packed"""
        b = slots.shape[0]
        bucket = self._bucket(b)
        self.static.load(slots, bucket, pending)
        captured = self.spec[(strategy, bucket)]
        captured.replay()
        out = captured.outputs.result
        nodes = strategy.max_tree_nodes - 1
        result = SpecRoundResult(out.tokens[:b], out.logprobs[:b], out.hidden[:b], out.accepted[:b], nodes)
        return result, captured.outputs.packed[:b]

    def _bucket(self, batch_size: int) -> int:
        bucket = self.bucket_for(batch_size)
        if bucket is None:
            raise ValueError(f"batch of {batch_size} exceeds the largest graph bucket {self.buckets[-1]}")
        return bucket

    def _capture(self, fn: Callable[[], GraphedRound]) -> CapturedRound:
        if self.capture is not None:
            return CapturedRound(None, self.capture(fn), fn)
        graph, outputs = capture_graph(fn, self.pool, self.warmup_stream)
        return CapturedRound(graph, outputs)


def catch_up_width(runtime: StrategyRuntime) -> int:
    """The pending entries a round of `runtime` leaves a row at most (its accepted drafts and the bonus token), which
    its graphs catch up on."""
    return runtime.max_depth + 1


def capture_graph(
    fn: Callable[[], T], pool: tuple | None = None, warmup_stream: torch.cuda.Stream | None = None
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture `fn` (fixed shapes, no host sync) as a CUDA graph; returns the graph and the outputs its replay
    rewrites. It is warmed up first on a side stream: lazy kernel and workspace initialisation must not happen
    inside a capture."""
    stream = warmup_stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_RUNS):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs
