"""The EAGLE drafter: one decoder layer over fc(concat(embed(token), policy_hidden)), sharing the policy's
frozen embedding and LM head (they are passed in at call time, never copied or registered)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.models.layers import DecoderLayer
from fastrl.models.masks import attention_mask
from fastrl.models.rope import RotaryEmbedding


def drafter_layer_config(policy_config: ModelConfig) -> ModelConfig:
    """The drafter's layer geometry: the policy's, with a single layer."""
    return dataclasses.replace(policy_config, num_hidden_layers=1)


class EagleDrafter(nn.Module):
    """Predicts the policy's next hidden state from (token x_p, policy hidden f_{p-1}) at position p.

    Drafter entry p reads token x_p and the feature f_{p-1} (the policy's final-norm hidden state at position p-1,
    or the drafter's own prediction of it inside a draft tree), and outputs g_p, a prediction of f_p; the policy's
    LM head on g_p gives the draft distribution of x_{p+1}. Entries live in a one-layer KVCache at cache index p
    (index 0 is never written: x_0 has no preceding feature).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = drafter_layer_config(config)
        hidden = self.config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = DecoderLayer(self.config, layer_idx=0, input_norm=False)
        self.rotary = RotaryEmbedding(self.config)

    def new_cache(self, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device | str) -> KVCache:
        """A one-layer KV cache for this drafter."""
        c = self.config
        return KVCache(1, num_slots, max_len, c.num_key_value_heads, c.head_dim, dtype=dtype, device=device)

    def forward(
        self,
        policy: CausalLM,
        tokens: Tensor,
        features: Tensor,
        positions: Tensor,
        cache: KVCache | None = None,
        slots: Tensor | None = None,
        cache_index: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """# tokens [B,S], features [B,S,H], positions [B,S] -> predicted features [B,S,H]

        Masks follow `CausalLM.forward`: with a cache, `attn_mask` [B,S,L] over cache entries [0, L) (None: causal
        by cache index); without one, over the S new entries (None: causal by position).
        """
        x = self.fc(torch.cat([policy.embed(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        cos, sin = self.rotary(positions, x.dtype)
        if cache is None:
            mask = attention_mask(positions, None, attn_mask)
            return self.layer(x, cos, sin, None, None, None, mask)
        if slots is None:
            raise ValueError("EagleDrafter: slots [B] are required with a cache")
        index = positions if cache_index is None else cache_index
        mask = attention_mask(positions, index, attn_mask)
        return self.layer(x, cos, sin, cache, cache.rows(slots), index, mask)
