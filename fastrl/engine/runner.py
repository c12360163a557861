"""The model runner: the one place that holds tensors and launches model work.

It owns the policy and drafter on their device, the KV caches, the per-strategy runtime state and (on a GPU) the
CUDA graphs. The engine loop hands it requests (already holding KV slots) and gets back plain Python values:
tokens, log-probs, accept lengths, and the hidden states a caller asked for. The scheduler never sees a tensor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fastrl.engine.batch import RunningBatch
from fastrl.engine.config import EngineConfig
from fastrl.engine.drafter_feed import queue_for_drafter, take_drafter_input
from fastrl.engine.plain_round import plain_round
from fastrl.engine.prefill import prefill_shared
from fastrl.engine.request import Request
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.sampling.sampler import sample
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.round import SpecModels, catch_drafter_up, speculative_round
from fastrl.speculative.runtime import build_runtimes
from fastrl.strategy.strategy import Strategy


@dataclass
class StepOutput:
    """What one prefill or decode round produced, per request row, as plain values.

    tokens[b] / logprobs[b]: the row's candidate tokens in order (accepted drafts, then the policy's own token; one
    token for prefill and plain rounds); the engine emits them until the request finishes. accepted[b]: accepted
    draft tokens (0 for plain). hidden[b]: the hidden state behind each token, [len(tokens[b]),H] float32 on the
    CPU, only for requests that asked for hidden states (else None). prompt_hidden[b]: a prefill's prompt hidden
    states [P-1,H] for such requests.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    accepted: list[int]
    hidden: list[Tensor | None]
    prompt_hidden: list[Tensor | None] = field(default_factory=list)
    drafted: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_rows: int = 0


class ModelRunner:
    """Runs prefills and decode rounds for an engine (see the module docstring).

    `strategies` is the selector's strategy space: runtime state (and CUDA graphs) is built for each speculative
    one at construction, so switching strategy between rounds is a lookup.
    """

    def __init__(
        self, model: CausalLM, config: EngineConfig, drafter: EagleDrafter | None, strategies: list[Strategy]
    ) -> None:
        self.config = config
        self.device = torch.device(config.device)
        dtype = config.torch_dtype
        self.model = model.to(device=self.device, dtype=dtype).eval()
        speculative = [s for s in strategies if not s.is_disabled]
        if speculative and drafter is None:
            raise ValueError(f"strategies {[str(s) for s in speculative]} need a drafter; none was given")
        mc = model.config
        for s in speculative:
            if s.topk > mc.vocab_size:
                raise ValueError(f"strategy {s}: topk {s.topk} exceeds the vocabulary ({mc.vocab_size})")
        self.drafter = drafter.to(device=self.device, dtype=dtype).eval() if speculative and drafter else None
        if self.drafter is not None and self.drafter.draft_vocab is not None:
            width = self.drafter.draft_vocab.numel()
            for s in speculative:
                if s.topk > width:
                    raise ValueError(f"strategy {s}: topk {s.topk} exceeds the drafter's draft vocabulary ({width})")
        self.runtimes = build_runtimes(speculative, self.device)
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        max_nodes = max((s.num_draft_tokens for s in speculative), default=1)
        use_graphs = config.cuda_graphs and self.device.type == "cuda"
        slots = config.max_batch_size + (1 if use_graphs else 0)  # graphs pad batches on a scratch slot
        self.cache = KVCache(
            mc.num_hidden_layers,
            slots,
            self.max_model_len + max_nodes,
            mc.num_key_value_heads,
            mc.head_dim,
            dtype=dtype,
            device=self.device,
        )
        self.spec_models: SpecModels | None = None
        if self.drafter is not None:
            area = max(r.tree_area for r in self.runtimes.values())
            dcache = self.drafter.new_cache(slots, self.max_model_len + area + 2, dtype, self.device)
            self.spec_models = SpecModels(self.model, self.drafter, self.cache, dcache)
        self.graphs = self._capture_graphs() if use_graphs else None

    @property
    def speculative(self) -> bool:
        """Whether this runner can run speculative rounds (it has a drafter)."""
        return self.drafter is not None

    def prefill(self, requests: list[Request]) -> StepOutput:
        """Prefill the prompts of `requests` (in their slots) and sample each one's first token.

        Requests with the same prompt (the n samples of a GRPO group) prefill once; the others copy its KV.
        """
        result = prefill_shared(self.model, self.cache, requests, self.config.prefix_sharing)
        batch = RunningBatch.build(requests, self.device)
        # Every request samples from its prompt's logits with its own seed.
        sampled = sample(result.last_logits, batch.sampling, result.lengths)
        tokens, logprobs = sampled.tokens.tolist(), sampled.logprobs.tolist()
        hidden: list[Tensor | None] = []
        prompt_hidden: list[Tensor | None] = []
        for row, request in enumerate(requests):
            length = len(request.prompt_ids)
            states = result.hidden[row]
            if self.drafter is not None:
                queue_for_drafter(request, request.prompt_ids[1:] + [tokens[row]], states[:length])
            want = request.want_hidden_states
            prompt_hidden.append(states[: length - 1].detach().to("cpu", torch.float32) if want else None)
            hidden.append(states[length - 1 : length].detach().to("cpu", torch.float32) if want else None)
        return StepOutput(
            tokens=[[t] for t in tokens],
            logprobs=[[lp] for lp in logprobs],
            accepted=[0] * len(requests),
            hidden=hidden,
            prompt_hidden=prompt_hidden,
            prefill_rows=result.computed_rows,
        )

    def decode(self, requests: list[Request], strategy: Strategy) -> StepOutput:
        """One decode round over `requests` with `strategy` (plain when disabled or without a drafter)."""
        batch = RunningBatch.build(requests, self.device)
        if strategy.is_disabled or self.spec_models is None:
            if self.graphs is not None:
                result = self.graphs.run_plain(batch.inputs)
            else:
                result = plain_round(self.model, self.cache, batch.inputs)
            tokens, logprobs, hidden = result.tokens.unsqueeze(1), result.logprobs.unsqueeze(1), result.hidden
            hidden = hidden.unsqueeze(1)
            accepted = [0] * len(requests)
            drafted, draft_s, verify_s = 0, 0.0, 0.0
        else:
            pending = take_drafter_input(requests, self.model.config.hidden_size, self.device)
            if self.graphs is not None:
                start = time.perf_counter()
                if self.drafter.draft_vocab is not None:
                    self.drafter.draft_head(self.model)  # refresh the restricted head the graphs read
                root_feature = catch_drafter_up(self.spec_models, batch.inputs, pending, self.graphs.base)
                spec = self.graphs.run_speculative(batch.inputs, root_feature, strategy)
                spec.draft_time_s = time.perf_counter() - start
            else:
                spec = speculative_round(self.spec_models, batch.inputs, pending, self.runtimes[strategy])
            tokens, logprobs, hidden = spec.tokens, spec.logprobs, spec.hidden
            accepted = spec.accept_len.tolist()
            drafted, draft_s, verify_s = strategy.num_draft_tokens - 1, spec.draft_time_s, spec.verify_time_s
        token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()
        out_tokens, out_logprobs, out_hidden = [], [], []
        for row, request in enumerate(requests):
            count = accepted[row] + 1
            out_tokens.append(token_rows[row][:count])
            out_logprobs.append(logprob_rows[row][:count])
            if self.drafter is not None:
                queue_for_drafter(request, token_rows[row][:count], hidden[row, :count])
            want = request.want_hidden_states
            out_hidden.append(hidden[row, :count].detach().to("cpu", torch.float32) if want else None)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepOutput(out_tokens, out_logprobs, accepted, out_hidden, [], drafted, draft_s, verify_s)

    def _capture_graphs(self):
        """CUDA graphs of every round this runner can run (plain per bucket, speculative per strategy and bucket)."""
        from fastrl.engine.cuda_graphs import CudaGraphRounds, StaticInputs, graph_buckets

        mc = self.model.config
        size = self.config.max_batch_size
        static = StaticInputs.allocate(size, mc.hidden_size, self.config.torch_dtype, self.device, size)
        graphs = CudaGraphRounds(
            self.model, self.cache, self.spec_models, self.runtimes, graph_buckets(size), self.max_model_len, static
        )
        with torch.inference_mode():  # as every round runs: no autograd state kept alive by the graphs' outputs
            graphs.capture_all()
        return graphs
