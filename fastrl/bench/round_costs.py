"""Microbenchmarks of one round's parts: a plain decode forward, a verify forward over N tree tokens, one drafter
step. They give the physical limit of a speculative round: accepted × t_plain / (t_verify + steps × t_draft)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.bench.timing import time_median
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy


@dataclass
class RoundCosts:
    """Median seconds of one plain forward, one verify forward (N tokens) and one drafter step (topk tokens)."""

    t_plain: float
    t_verify: float
    t_draft: float

    def physical_limit(self, strategy: Strategy, accept_length: float) -> float:
        """Speedup bound of a round: accept_length × t_plain / (t_verify + steps × t_draft)."""
        return accept_length * self.t_plain / (self.t_verify + strategy.steps * self.t_draft)


@torch.inference_mode()
def measure_round_costs(
    policy: CausalLM, drafter: EagleDrafter, strategy: Strategy, context: int, repeats: int = 20
) -> RoundCosts:
    """Time the forwards at a prefix of `context` tokens with batch size 1 (fresh caches, no sampling)."""
    device = next(policy.parameters()).device
    n = strategy.num_draft_tokens
    cfg = policy.config
    from fastrl.models.kv_cache import KVCache

    cache = KVCache(cfg.num_hidden_layers, 1, context + n + 1, cfg.num_key_value_heads, cfg.head_dim, device=device)
    dcache = drafter.new_cache(1, context + n + 1, torch.float32, device)
    slots = torch.zeros(1, dtype=torch.long, device=device)
    keys = context + n

    def plain() -> None:
        pos = torch.tensor([[context]], device=device)
        policy(
            torch.tensor([[5]], device=device),
            pos,
            cache=cache,
            slots=slots,
            attn_mask=torch.ones(1, 1, context + 1, dtype=torch.bool, device=device),
        )

    def verify() -> None:
        pos = torch.full((1, n), context, device=device) + torch.arange(n, device=device)
        mask = torch.ones(1, n, keys, dtype=torch.bool, device=device)
        policy(torch.full((1, n), 5, device=device), pos, cache=cache, slots=slots, attn_mask=mask)

    def draft() -> None:
        k = strategy.topk
        pos = torch.full((1, k), context, device=device)
        feats = torch.zeros(1, k, drafter.feature_size, device=device)
        mask = torch.ones(1, k, context + 1, dtype=torch.bool, device=device)
        out = drafter(policy, torch.full((1, k), 5, device=device), feats, pos, dcache, slots, pos, mask)
        drafter.draft_logits(policy, out)  # over the draft vocabulary when the drafter has one, as rounds do

    t = [time_median(fn, repeats, str(device), warmup=3).median_s for fn in (plain, verify, draft)]
    return RoundCosts(*t)
