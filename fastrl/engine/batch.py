"""Tensors describing the running batch for one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.engine.request import Request
from fastrl.sampling.sampler import SamplingBatch
from fastrl.speculative.inputs import DecodeInputs


@dataclass
class RunningBatch:
    """The running requests of one round, as tensors on the engine's device.

    slots:    [B] KV-cache slot of each row
    lengths:  [B] tokens whose KV is final (prompt + output minus the last, not yet fed, token)
    last:     [B] the last emitted token of each row, fed at position `lengths`
    sampling: per-row sampling settings
    """

    requests: list[Request]
    slots: torch.Tensor
    lengths: torch.Tensor
    last: torch.Tensor
    sampling: SamplingBatch

    @classmethod
    def build(cls, requests: list[Request], device: torch.device) -> RunningBatch:
        slots = torch.tensor([r.slot for r in requests], dtype=torch.long, device=device)
        lengths = torch.tensor([r.num_tokens - 1 for r in requests], dtype=torch.long, device=device)
        last = torch.tensor([r.last_token for r in requests], dtype=torch.long, device=device)
        sampling = SamplingBatch.from_params([r.params for r in requests], [r.seed for r in requests], device)
        return cls(requests, slots, lengths, last, sampling)

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def inputs(self) -> DecodeInputs:
        return DecodeInputs(self.slots, self.lengths, self.last, self.sampling)
