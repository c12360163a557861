"""The engine: continuous batching over a position-addressed KV cache, one decode round (plain or speculative)
per step, the strategy of each round chosen by a StrategySelector."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.batch import RunningBatch
from fastrl.engine.config import EngineConfig
from fastrl.engine.drafter_feed import queue_for_drafter, take_drafter_input
from fastrl.engine.plain_round import plain_round
from fastrl.engine.prefill import prefill
from fastrl.engine.request import FinishReason, Request, RequestOutput, now
from fastrl.engine.scheduler import Scheduler
from fastrl.engine.server_info import ServerInfo
from fastrl.engine.spec_round import SpecModels, catch_drafter_up, speculative_round
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.sampler import sample
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.runtime import build_runtimes
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import DISABLE


@dataclass
class GenerateInput:
    """One prompt for `Engine.generate`: token ids, sampling params, optional id and hidden-state capture."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None
    return_hidden_states: bool = False


class Engine:
    """Generates from a CausalLM with continuous batching and, given a drafter, EAGLE speculation.

    Streaming use: `add_request(...)` any time, then `step()` until `has_unfinished()` is False; each step returns
    a snapshot of every request that progressed or finished. Batch use: `generate(inputs)`. Before each decode
    round `selector.choose(batch_size)` picks the strategy (`disable` = plain round), after it `selector.observe`
    gets the round's RoundStats (also kept in `round_stats`). Outputs never depend on the strategy.
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        drafter: EagleDrafter | None = None,
        selector: StrategySelector | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.device = torch.device(self.config.device)
        dtype = self.config.torch_dtype
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.selector: StrategySelector = selector or FixedSelector(DISABLE)
        speculative = [s for s in self.selector.strategies if not s.is_disabled]
        if speculative and drafter is None:
            raise ValueError(f"strategies {[str(s) for s in speculative]} need a drafter; none was given")
        mc = model.config
        for s in speculative:
            if s.topk > mc.vocab_size:
                raise ValueError(f"strategy {s}: topk {s.topk} exceeds the vocabulary ({mc.vocab_size})")
        self.drafter = drafter.to(device=self.device, dtype=dtype).eval() if speculative else None
        self.runtimes = build_runtimes(speculative, self.device)
        self.max_model_len = min(self.config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        max_nodes = max((s.num_draft_tokens for s in speculative), default=1)
        use_graphs = self.config.cuda_graphs and self.device.type == "cuda"
        slots = self.config.max_batch_size + (1 if use_graphs else 0)  # graphs pad batches on a scratch slot
        self.cache = KVCache(
            mc.num_hidden_layers,
            slots,
            self.max_model_len + max_nodes,
            mc.num_key_value_heads,
            mc.head_dim,
            dtype=dtype,
            device=self.device,
        )
        self.dcache = None
        if self.drafter is not None:
            area = max(r.tree_area for r in self.runtimes.values())
            self.dcache = self.drafter.new_cache(slots, self.max_model_len + area + 2, dtype, self.device)
        self.spec_models = (
            None if self.drafter is None else SpecModels(self.model, self.drafter, self.cache, self.dcache)
        )
        self.graphs = self._capture_graphs() if use_graphs else None
        self.scheduler = Scheduler(self.config.max_batch_size, self.max_model_len, mc.vocab_size)
        eos = mc.eos_token_id
        self.eos_ids = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
        self.round_stats: list[RoundStats] = []
        self._info = ServerInfo()
        self._seed_rng = random.Random(self.config.seed)
        self._rejected: list[Request] = []
        self._live_ids: set[str] = set()
        self._next_id = 0

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        return_hidden_states: bool = False,
    ) -> str:
        """Queue a request; returns its id. An invalid request finishes at the next step with an error."""
        params = params or SamplingParams()
        if request_id is None:
            request_id = f"req-{self._next_id}"
        self._next_id += 1
        if request_id in self._live_ids:
            raise ValueError(f"request id {request_id!r} is already running in this engine")
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        request = Request(request_id, list(prompt_ids), params, seed, want_hidden_states=return_hidden_states)
        request.timings.arrival = now()
        problem = self.scheduler.validate(request)
        if problem is not None:
            request.finish_reason = FinishReason.ERROR
            request.error = f"request {request_id}: {problem}"
            request.timings.finished = request.timings.arrival
            self._rejected.append(request)
        else:
            self.scheduler.add(request)
        self._live_ids.add(request_id)
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or bool(self._rejected)

    def server_info(self) -> ServerInfo:
        """A live view: active strategy, recent accept length, running and waiting requests."""
        self._info.running = len(self.scheduler.running)
        self._info.waiting = len(self.scheduler.waiting)
        return self._info

    # ---- stepping -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Admit and prefill waiting requests, then run one decode round over the other running requests."""
        progressed: dict[str, list[int]] = {}
        finished: list[Request] = self._rejected
        self._rejected = []
        admitted = self.scheduler.admit()
        if admitted:
            self._prefill(admitted, progressed)
        active = [r for r in self.scheduler.running if not r.finished and r.request_id not in progressed]
        if active:
            self._decode(active, progressed)
        finished += self.scheduler.release_finished()
        for r in finished:
            self._live_ids.discard(r.request_id)
        done_ids = {r.request_id for r in finished}
        outputs = [r.to_output(progressed.get(r.request_id)) for r in finished]
        outputs += [
            r.to_output(progressed[r.request_id])
            for r in self.scheduler.running
            if r.request_id in progressed and r.request_id not in done_ids
        ]
        return outputs

    def generate(self, inputs: Iterable[GenerateInput], progress: bool = False) -> list[RequestOutput]:
        """Run a batch to completion; outputs come back in input order."""
        from tqdm.auto import tqdm

        ids = [self.add_request(i.prompt_ids, i.params, i.request_id, i.return_hidden_states) for i in inputs]
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", unit="req", disable=not progress) as bar:
            while self.has_unfinished():
                for out in self.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
                if progress:
                    bar.set_postfix(self.server_info().postfix(), refresh=False)
        return [results[i] for i in ids]

    # ---- internals ------------------------------------------------------------------------------------------
    def _capture_graphs(self):
        """CUDA graphs of every round this engine can run (plain per bucket, speculative per strategy and bucket)."""
        from fastrl.engine.cuda_graphs import CudaGraphRounds, StaticInputs, graph_buckets

        mc = self.model.config
        static = StaticInputs.allocate(
            self.config.max_batch_size, mc.hidden_size, self.config.torch_dtype, self.device, self.config.max_batch_size
        )
        graphs = CudaGraphRounds(
            self.model,
            self.cache,
            self.spec_models,
            self.runtimes,
            graph_buckets(self.config.max_batch_size),
            self.max_model_len,
            static,
        )
        with torch.inference_mode():  # as every round runs: no autograd state kept alive by the graphs' outputs
            graphs.capture_all()
        return graphs

    def _prefill(self, requests: list[Request], progressed: dict[str, list[int]]) -> None:
        result = prefill(self.model, self.cache, requests)
        batch = RunningBatch.build(requests, self.device)
        sampled = sample(result.last_logits, batch.sampling, result.lengths)
        tokens = sampled.tokens.tolist()
        logprobs = sampled.logprobs.tolist()
        for row, request in enumerate(requests):
            length = len(request.prompt_ids)
            if self.drafter is not None:
                queue_for_drafter(request, request.prompt_ids[1:] + [tokens[row]], result.hidden[row, :length])
            if request.want_hidden_states:
                request.prompt_hidden_states = result.hidden[row, : length - 1].detach().to("cpu", torch.float32)
            self._emit(request, tokens[row], logprobs[row], result.hidden[row, length - 1], progressed)

    def _decode(self, requests: list[Request], progressed: dict[str, list[int]]) -> None:
        strategy = self.selector.choose(len(requests))
        batch = RunningBatch.build(requests, self.device)
        start = time.perf_counter()
        if strategy.is_disabled or self.drafter is None:
            if self.graphs is not None:
                result = self.graphs.run_plain(batch.inputs)
            else:
                result = plain_round(self.model, self.cache, batch.inputs)
            tokens = result.tokens.unsqueeze(1)
            logprobs = result.logprobs.unsqueeze(1)
            hidden = result.hidden.unsqueeze(1)
            accepted = [0] * len(requests)
            drafted, draft_s, verify_s = 0, 0.0, 0.0
        else:
            pending = take_drafter_input(requests, self.model.config.hidden_size, self.device)
            if self.graphs is not None:
                root_feature = catch_drafter_up(self.spec_models, batch.inputs, pending, self.graphs.base)
                spec = self.graphs.run_speculative(batch.inputs, root_feature, strategy)
            else:
                spec = speculative_round(self.spec_models, batch, pending, self.runtimes[strategy])
            tokens, logprobs, hidden = spec.tokens, spec.logprobs, spec.hidden
            accepted = spec.accept_len.tolist()
            drafted, draft_s, verify_s = strategy.num_draft_tokens - 1, spec.draft_time_s, spec.verify_time_s
        emitted = self._apply_round(requests, tokens, logprobs, hidden, accepted, progressed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats = RoundStats(
            strategy=strategy,
            batch_size=len(requests),
            drafted_tokens=[drafted] * len(requests),
            accepted_tokens=accepted,
            emitted_tokens=emitted,
            wall_time_s=max(time.perf_counter() - start, 1e-9),
            draft_time_s=draft_s,
            verify_time_s=verify_s,
        )
        self.round_stats.append(stats)
        self._info.observe(stats)
        self.selector.observe(stats)

    def _apply_round(
        self,
        requests: list[Request],
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        hidden: torch.Tensor,
        accepted: list[int],
        progressed: dict[str, list[int]],
    ) -> list[int]:
        """Emit each row's accepted tokens plus one, stopping where the request finishes; returns the counts.

        # tokens/logprobs [B,D+1], hidden [B,D+1,H]
        """
        token_rows = tokens.tolist()
        logprob_rows = logprobs.tolist()
        emitted = []
        for row, request in enumerate(requests):
            count = accepted[row] + 1
            n = 0
            for j in range(count):
                n += 1
                if self._emit(request, token_rows[row][j], logprob_rows[row][j], hidden[row, j], progressed):
                    break
            request.accept_lengths.append(n)
            if self.drafter is not None and not request.finished:
                queue_for_drafter(request, token_rows[row][:count], hidden[row, :count])
            emitted.append(n)
        return emitted

    def _emit(
        self, request: Request, token: int, logprob: float, hidden: torch.Tensor, progressed: dict[str, list[int]]
    ) -> bool:
        """Append one generated token; True when the request finished with it."""
        if request.timings.first_token is None:
            request.timings.first_token = now()
        request.output_ids.append(token)
        request.logprobs.append(logprob)
        progressed.setdefault(request.request_id, []).append(token)
        if request.want_hidden_states:
            request.hidden_states.append(hidden.detach().to("cpu", torch.float32).unsqueeze(0))
        if not math.isfinite(logprob):  # NaN or infinite logits: this token and any after it mean nothing
            request.finish_reason = FinishReason.ERROR
            request.error = (
                f"request {request.request_id}: non-finite logits at generated token {len(request.logprobs) - 1}"
            )
            request.timings.finished = now()
            return True
        done = self.scheduler.check_finished(request, self.eos_ids)
        if done:
            request.timings.finished = now()
        return done
