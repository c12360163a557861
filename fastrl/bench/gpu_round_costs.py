"""Round costs of real model shapes on a GPU, eager and as CUDA graphs: t_verify(K)/t_plain and t_draft/t_plain.

Random weights suffice (costs do not depend on values): the model is built directly on the device in the compute
dtype. Times are CUDA-event medians at batch size 1 over a `context`-token prefix.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fastrl.engine.cuda_graphs import capture_graph
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.speculative.drafter import EagleDrafter

# Public shapes of real checkpoints (config.json values), for cost measurements with random weights.
SHAPES = {
    "qwen2.5-1.5b": ModelConfig(
        "qwen2", 151936, 1536, 8960, 28, 12, 2, rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=4096
    ),
    "qwen2.5-7b": ModelConfig("qwen2", 152064, 3584, 18944, 28, 28, 4, rope_theta=1e6, max_position_embeddings=4096),
}
VERIFY_TOKENS = (2, 4, 8, 16, 32, 64)


@dataclass
class ShapeCosts:
    """Milliseconds per forward: plain (1 token), verify (K tokens), one drafter step (topk tokens + LM head)."""

    shape: str
    graphs: bool
    t_plain_ms: float
    t_draft_ms: float
    t_verify_ms: dict[int, float] = field(default_factory=dict)

    def ratios(self) -> dict[str, float]:
        out = {f"verify_{k}/plain": v / self.t_plain_ms for k, v in self.t_verify_ms.items()}
        out["draft/plain"] = self.t_draft_ms / self.t_plain_ms
        return out


def cuda_time_ms(fn: Callable[[], object], repeats: int = 30, warmup: int = 5) -> float:
    """Median milliseconds of `fn` by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def as_graph(fn: Callable[[], object]) -> Callable[[], None]:
    """Capture `fn` (fixed shapes, no host sync) once; returns the replay."""
    return capture_graph(fn)[0].replay


@torch.inference_mode()
def measure_shape(
    name: str, context: int = 512, topk: int = 4, dtype: torch.dtype = torch.bfloat16
) -> list[ShapeCosts]:
    """Eager and graph costs of one named shape (see SHAPES) with random weights built on the device."""
    config = SHAPES[name]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            policy = CausalLM(config).eval()
            drafter = EagleDrafter(config).eval()
    finally:
        torch.set_default_dtype(previous)
    rows = measure_costs(policy, drafter, name, context, topk)
    del policy, drafter
    torch.cuda.empty_cache()
    return rows


@torch.inference_mode()
def measure_costs(
    policy: CausalLM, drafter: EagleDrafter, name: str, context: int = 512, topk: int = 4
) -> list[ShapeCosts]:
    """Eager and graph round costs of a policy and drafter already on the GPU (in their dtype)."""
    config = policy.config
    device = next(policy.parameters()).device
    dtype = next(policy.parameters()).dtype
    keys = context + max(VERIFY_TOKENS) + 1
    cache = KVCache(config.num_hidden_layers, 1, keys, config.num_key_value_heads, config.head_dim, dtype, device)
    dcache = drafter.new_cache(1, keys, dtype, device)
    slots = torch.zeros(1, dtype=torch.long, device=device)

    def forward(k: int) -> Callable[[], object]:
        pos = context + torch.arange(k, device=device).unsqueeze(0)
        ids = torch.full((1, k), 5, device=device)
        mask = torch.ones(1, k, keys, dtype=torch.bool, device=device)
        return lambda: policy(ids, pos, cache=cache, slots=slots, attn_mask=mask)

    def draft() -> Callable[[], object]:
        pos = torch.full((1, topk), context, device=device)
        feats = torch.zeros(1, topk, config.hidden_size, dtype=dtype, device=device)
        ids = torch.full((1, topk), 5, device=device)
        mask = torch.ones(1, topk, keys, dtype=torch.bool, device=device)
        return lambda: policy.logits(drafter(policy, ids, feats, pos, dcache, slots, pos, mask))

    rows = []
    for graphs in (False, True):
        wrap = as_graph if graphs else (lambda f: f)
        row = ShapeCosts(name, graphs, cuda_time_ms(wrap(forward(1))), cuda_time_ms(wrap(draft())))
        for k in VERIFY_TOKENS:
            row.t_verify_ms[k] = cuda_time_ms(wrap(forward(k)))
        rows.append(row)
    return rows
