"""Llama-family causal language model (Llama, Qwen2, Qwen3) with HF parameter names and a position-addressed cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fastrl.models.config import ModelConfig
from fastrl.models.cpu_linear import Linear
from fastrl.models.kv_cache import KVCache
from fastrl.models.layers import DecoderLayer, RMSNorm
from fastrl.models.masks import attention_mask
from fastrl.models.rope import RotaryEmbedding


@dataclass
class ModelOutput:
    """logits: [B,S,V] (None when not computed); hidden: [B,S,H], the final-norm output (HF `last_hidden_state`);
    features: [B,S,F] what a drafter reads, the outputs of the forward's `feature_layers` (in order) then `hidden`,
    F = (len(feature_layers) + 1) * H (`hidden` itself when no feature layers were asked for)."""

    logits: Tensor | None
    hidden: Tensor
    features: Tensor


class DecoderStack(nn.Module):
    """The `model.` submodule: token embedding, decoder layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder + LM head. Parameter names match HF `*ForCausalLM`; tied embeddings share one Parameter.

    Build with `CausalLM(config)` (random init) or `fastrl.models.checkpoint.load_model(path)`.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Makes lm_head.weight the embedding Parameter when the config ties them (no-op otherwise)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings.  # [...] long -> [..., H]"""
        return self.model.embed_tokens(ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """LM head on final-norm hidden states.  # [..., H] -> [..., V]"""
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        cache: KVCache | None = None,
        slots: Tensor | None = None,
        cache_index: Tensor | None = None,
        attn_mask: Tensor | None = None,
        compute_logits: bool = True,
        kv_len: int | None = None,
        first_slot: int | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> ModelOutput:
        """One forward over S new tokens per row.  # input_ids/positions [B,S] -> logits [B,S,V], hidden [B,S,H],
        features [B,S,(len(feature_layers)+1)*H]

        positions: RoPE positions. Without `cache`, keys are the new tokens themselves and `attn_mask` is [B,S,S]
        (None: causal by position). With `cache` (and `slots` [B], required), the new K/V are first written at
        `cache_index` [B,S] (default: positions) of each row's slot, then every token attends over cache entries
        [0, L) of its slot: `attn_mask` [B,S,L] bool (True = may attend) or None for causal by cache index
        (entry j visible iff j <= cache_index), with L = `kv_len` (default max(cache_index)+1: one host sync).
        Rows whose mask row is all False (padding) give finite, meaningless outputs. `first_slot`: see
        `KVCache.metadata` (rows that are consecutive slots at home read their keys in place).
        `feature_layers`: decoder layers (0-based, ascending) whose outputs `features` holds before the final-norm
        state, for a fused (EAGLE-3 input) drafter; ValueError on an index outside the decoder.
        """
        if positions.shape != input_ids.shape:
            raise ValueError(f"positions {tuple(positions.shape)} must match input_ids {tuple(input_ids.shape)}")
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        meta = None
        if cache is None:
            if attn_mask is not None and attn_mask.shape[-1] != input_ids.shape[1]:
                raise ValueError(f"without a cache attn_mask must be [B,S,S], got {tuple(attn_mask.shape)}")
            mask = attention_mask(positions, None, attn_mask)
        else:
            if slots is None:
                raise ValueError("slots [B] are required when a cache is given")
            if cache_index is None:
                cache_index = positions
            mask = attention_mask(positions, cache_index, attn_mask, kv_len)
            meta = cache.metadata(
                slots, cache_index, mask, first_slot
            )  # one description of this forward for every layer
        layers = self.model.layers
        if feature_layers and (min(feature_layers) < 0 or max(feature_layers) >= len(layers)):
            raise ValueError(f"feature_layers {list(feature_layers)} outside the policy's {len(layers)} decoder layers")
        kept: list[Tensor] = []
        for i, layer in enumerate(layers):
            x = layer(x, cos, sin, cache, attn_mask=mask, meta=meta)
            if i in feature_layers:
                kept.append(x)
        hidden = self.model.norm(x)
        features = torch.cat(kept + [hidden], dim=-1) if kept else hidden
        logits = self.lm_head(hidden) if compute_logits else None
        return ModelOutput(logits=logits, hidden=hidden, features=features)
