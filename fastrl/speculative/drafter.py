"""The EAGLE drafter: one decoder layer over fc(concat(embed(token), policy_hidden)), sharing the policy's
frozen embedding and LM head (they are passed in at call time, never copied or registered)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from fastrl.models.attention import AttentionBackend
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache, PageTable
from fastrl.models.layers import DecoderLayer
from fastrl.models.masks import attention_mask
from fastrl.models.rope import RotaryEmbedding
from fastrl.speculative.cpu_drafter_step import drafter_step_for


def drafter_layer_config(policy_config: ModelConfig) -> ModelConfig:
    """The drafter's layer geometry: the policy's, with a single layer."""
    return dataclasses.replace(policy_config, num_hidden_layers=1)


class EagleDrafter(nn.Module):
    """Predicts the policy's next hidden state from (token x_p, policy hidden f_{p-1}) at position p.

    Drafter entry p reads token x_p and the feature f_{p-1} (the policy's final-norm hidden state at position p-1,
    or the drafter's own prediction of it inside a draft tree), and outputs g_p, a prediction of f_p; the policy's
    LM head on g_p gives the draft distribution of x_{p+1}. Entries live in a one-layer KVCache at cache index p
    (index 0 is never written: x_0 has no preceding feature).

    `extra_layers` is empty: the policy feature is the final-norm state alone (`FusedEagleDrafter` reads more).
    """

    extra_layers: tuple[int, ...] = ()

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = drafter_layer_config(config)
        hidden = self.config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = DecoderLayer(self.config, layer_idx=0, input_norm=False)
        self.rotary = RotaryEmbedding(self.config)
        self.register_buffer("draft_vocab", None, persistent=False)
        self._head: Tensor | None = None
        self._head_key: tuple | None = None
        self.prior_hazard: float | None = None
        """Per-depth chance that a greedy chain's next draft is accepted, fitted to the accept lengths measured on
        held-out rollouts when the checkpoint was trained (None when it records none): the selector's prior."""

    @property
    def feature_size(self) -> int:
        """Width of the policy features this drafter reads: (len(extra_layers) + 1) * H."""
        return (len(self.extra_layers) + 1) * self.config.hidden_size

    def check_features(self, features: Tensor) -> None:
        """ValueError unless `features` are [.., H]: the policy's final-norm states or the drafter's own outputs."""
        if features.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"{type(self).__name__}: features must be [.., {self.config.hidden_size}], got {tuple(features.shape)}"
            )

    def input_features(self, features: Tensor) -> Tensor:
        """The feature fc reads beside the token's embedding.  # [.., H] -> [.., H]"""
        self.check_features(features)
        return features

    def set_draft_vocab(self, ids: Tensor | None) -> None:
        """Restrict drafting to the token ids `ids` (the reduced draft vocabulary, FR-Spec / EAGLE-3's d2t), or
        drop the restriction with None. ValueError unless `ids` is 1-D, distinct and inside the vocabulary. A
        vocabulary of the live one's size on its device is copied into the live tensor (and the restricted head
        refreshed in place), so CUDA graphs captured over them read the new ids; any other replaces them.

        # ids [K] long
        """
        if ids is None:
            self.draft_vocab, self._head, self._head_key = None, None, None
            return
        vocab = self.config.vocab_size
        if ids.dim() != 1 or ids.numel() < 1 or ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"draft_vocab must be a non-empty 1-D integer tensor, got {tuple(ids.shape)} {ids.dtype}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"draft_vocab ids must lie in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]")
        if ids.unique().numel() != ids.numel():
            raise ValueError("draft_vocab ids must be distinct")
        device = self.fc.weight.device
        live = self.draft_vocab
        if live is not None and live.device == device and live.shape == ids.shape:
            # in place: captured CUDA graphs read this tensor and the restricted head by address
            live.copy_(ids.to(device=device, dtype=torch.long))
            self._head_key = None  # draft_head copies the new rows into the head it keeps
            return
        self.draft_vocab = ids.to(device=device, dtype=torch.long).clone()
        self._head, self._head_key = None, None

    def draft_logits(self, policy: CausalLM, feature: Tensor) -> Tensor:
        """Logits of the draft distribution: the policy's LM head, restricted to `draft_vocab` when one is set.

        The restricted head is cached and refreshed in place when the policy's head changes (its tensor version
        moves), so a captured CUDA graph keeps reading current weights. # [..,H] -> [..,K] (K = V unrestricted)
        """
        if self.draft_vocab is None:
            return policy.logits(feature)
        return nn.functional.linear(feature, self.draft_head(policy))

    def cached_head(self) -> Tensor | None:
        """The restricted head ``draft_head`` keeps (None before its first use or without a draft vocabulary)."""
        return self._head

    def drop_cached_head(self) -> None:
        """Forget the restricted head (the drafter moved device: ``draft_head`` reads it afresh where the policy is;
        a head kept would stay where it was, outside the module's tensors)."""
        self._head, self._head_key = None, None

    def draft_head(self, policy: CausalLM) -> Tensor:
        """The policy's LM-head rows of the draft vocabulary, refreshed when the head changed.  # -> [K,H]"""
        if self.draft_vocab is None:
            raise ValueError("draft_head needs a draft_vocab")
        weight = policy.lm_head.weight
        key = (id(weight), weight._version, weight.device, weight.dtype, self.draft_vocab.data_ptr())
        if self._head_key != key:
            rows = weight.detach().index_select(0, self.draft_vocab.to(weight.device))
            if self._head is not None and self._head.shape == rows.shape and self._head.dtype == rows.dtype:
                self._head.copy_(rows)
            else:
                self._head = rows
            self._head_key = key
        return self._head

    def new_cache(
        self,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        table: PageTable | None = None,
        backend: AttentionBackend | None = None,
    ) -> KVCache:
        """A one-layer KV cache for this drafter (paged over the policy's `table` when given, else dense; attention
        by `backend`, default `PagedSdpa`)."""
        c = self.config
        return KVCache(1, num_slots, max_len, c.num_key_value_heads, c.head_dim, dtype, device, table, backend)

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
        first_slot: int | None = None,
        step_kernel: bool = True,
    ) -> Tensor:
        """# tokens [B,S], features [B,S,H], positions [B,S] -> predicted features [B,S,H]

        Masks follow `CausalLM.forward`: with a cache, `attn_mask` [B,S,L] over cache entries [0, L) (None: causal
        by cache index); without one, over the S new entries (None: causal by position). `first_slot`: the rows
        read their keys in place (`KVCache.metadata`). `step_kernel=False` keeps the forward in PyTorch's ops
        where the CPU drafter-step kernel would take it (whose choice depends on the number of rows: a forward
        whose rows must not depend on how many there are, the prompt feed under prefix sharing, passes False).
        """
        if cache is not None:
            if slots is None:
                raise ValueError("EagleDrafter: slots [B] are required with a cache")
            index = positions if cache_index is None else cache_index
            meta = cache.metadata(slots, index, attention_mask(positions, index, attn_mask), first_slot)
            step = drafter_step_for(cache) if step_kernel else None
            ready = None if step is None else step.prepare(self, policy, cache, meta)
            if ready is not None:
                self.check_features(features)  # the kernel fuses policy states itself
                return step(self, policy, tokens, features, positions, cache, ready)
        dtype = self.fc.weight.dtype  # a training copy may run in another dtype than the policy
        x = self.fc(torch.cat([policy.embed(tokens).to(dtype), self.input_features(features).to(dtype)], dim=-1))
        cos, sin = self.rotary(positions, x.dtype)
        if cache is None:
            mask = attention_mask(positions, None, attn_mask)
            return self.layer(x, cos, sin, None, None, None, mask)
        return self.layer(x, cos, sin, cache, meta=meta)
