"""What one round's drafting reads: the models, the rows' cache positions, their roots and sampler noise.

With a reduced draft vocabulary (the drafter's `draft_vocab`, K of the policy's V tokens) the drafter scores only
those K tokens: `logits` gives [.., K], `noise` is restricted to the same K columns, and `tokens` maps candidate
indices back to token ids. Verification always uses the full vocabulary, so exactness does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache, SlotRows
from fastrl.sampling.sampler import SamplingBatch
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.runtime import StrategyRuntime


@dataclass
class DraftContext:
    """Everything one round's drafting reads, for a batch of B rows.

    slots: the rows' drafter-cache slots (`dcache.rows(...)`); lengths [B]: position n of each root (its last
    emitted token); base: tree expansions go to drafter entries [base + 1, base + 1 + T), past every row's prefix;
    root_tokens [B]; root_feature [B,H]: the drafter's output at each root (from `catch_up`); noise [B,L,V]
    (L >= steps): the sampler noise of positions lengths + 1 + l, or None when every row is greedy. first_slot: the
    drafter's forwards read their keys in place (`KVCache.metadata`), or None to gather them.
    """

    drafter: EagleDrafter
    policy: CausalLM
    dcache: KVCache
    slots: SlotRows
    lengths: Tensor
    base: int
    root_tokens: Tensor
    root_feature: Tensor
    sampling: SamplingBatch
    runtime: StrategyRuntime
    noise: Tensor | None = None
    first_slot: int | None = None

    def __post_init__(self) -> None:
        vocab = self.drafter.draft_vocab
        if vocab is not None and self.noise is not None:
            self.noise = self.noise[..., vocab]  # [B,L,V] -> [B,L,K]

    def logits(self, feature: Tensor) -> Tensor:
        """The drafter's logits over its draft vocabulary.  # [..,H] -> [..,K] (K = V without a reduced one)"""
        return self.drafter.draft_logits(self.policy, feature)

    def level_noise(self, level: int) -> Tensor | None:
        """Sampler noise of position lengths + 1 + level over the draft vocabulary.  # -> [B,K] | None"""
        return None if self.noise is None else self.noise[:, level]

    def step(self, tokens: Tensor, features: Tensor, positions: Tensor, index: Tensor, mask: Tensor) -> Tensor:
        """One drafter forward over the rows' new entries at `index` under `mask`.

        # tokens [B,S], features [B,S,H], positions [B,S], index [B,S], mask [B,S,L] -> [B,S,H]
        """
        return self.drafter(
            self.policy, tokens, features, positions, self.dcache, self.slots, index, mask, self.first_slot
        )

    def tokens(self, indices: Tensor) -> Tensor:
        """Token ids of draft-vocabulary indices.  # [..] long -> [..] long"""
        vocab = self.drafter.draft_vocab
        return indices if vocab is None else vocab[indices]
