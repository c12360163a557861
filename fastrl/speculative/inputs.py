"""The tensors a decode round (plain or speculative) reads, one row per running request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.sampling.sampler import SamplingBatch


@dataclass(frozen=True)
class DecodeInputs:
    """The tensors a decode round reads, one row per request.

    slots:    [B] KV-cache slot of each row
    lengths:  [B] tokens whose KV is final (prompt + output minus the last, not yet fed, token)
    last:     [B] the last emitted token of each row, fed at position `lengths`
    sampling: per-row sampling settings
    """

    slots: torch.Tensor
    lengths: torch.Tensor
    last: torch.Tensor
    sampling: SamplingBatch
