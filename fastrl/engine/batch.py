"""The batch state on the device: per-slot lengths, last tokens, sampling settings and seeds.

Written once when a request is admitted (or readmitted after preemption), advanced by each decode round on the
device itself; a round's inputs are one gather of the active slots, whatever the batch size or the lengths.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fastrl.engine.request import Request
from fastrl.sampling.sampler import SamplingBatch
from fastrl.speculative.inputs import DecodeInputs


class SlotState:
    """Device tensors indexed by slot (see the module docstring).

    lengths [S]: tokens whose KV is final (prompt + output minus the last, not yet fed, token);
    last [S]: the last emitted token, fed at position `lengths`; temperature/top_k/top_p/seeds [S]: sampling.
    Host-side per slot: whether it is greedy / filtered (the sampler's shortcut flags).
    """

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.device = device
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.last = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.sampling = SamplingBatch(
            temperature=torch.zeros(num_slots, dtype=torch.float32, device=device),
            top_k=torch.zeros(num_slots, dtype=torch.long, device=device),
            top_p=torch.ones(num_slots, dtype=torch.float32, device=device),
            seeds=torch.zeros(num_slots, dtype=torch.long, device=device),
            all_greedy=True,
            any_filter=False,
        )
        self._greedy = [True] * num_slots
        self._filter = [False] * num_slots

    def admit(self, requests: list[Request], lengths: list[int]) -> Tensor:
        """Write the requests' settings into their slots; `lengths[i]` is request i's length, its last token the
        last of its prompt and output. Returns their slots as a tensor.  # -> [B] long"""
        slots = self.slots(requests)
        fresh = SamplingBatch.from_params([r.params for r in requests], [r.seed for r in requests], self.device)
        s = self.sampling
        s.temperature[slots], s.top_k[slots], s.top_p[slots], s.seeds[slots] = (
            fresh.temperature,
            fresh.top_k,
            fresh.top_p,
            fresh.seeds,
        )
        self.lengths[slots] = torch.tensor(lengths, dtype=torch.long, device=self.device)
        self.last[slots] = torch.tensor([r.last_token for r in requests], dtype=torch.long, device=self.device)
        for r in requests:
            self._greedy[r.slot] = r.params.greedy
            self._filter[r.slot] = r.params.top_k > 0 or r.params.top_p < 1
        return slots

    def slots(self, requests: list[Request]) -> Tensor:
        """The requests' slots as one device tensor.  # -> [B] long"""
        return torch.tensor([r.slot for r in requests], dtype=torch.long, device=self.device)

    def inputs(self, requests: list[Request]) -> DecodeInputs:
        """The round's inputs: one gather per field over the requests' slots.  # -> [B] rows"""
        slots = self.slots(requests)
        sampling = replace(
            self.sampling.index(slots),
            all_greedy=all(self._greedy[r.slot] for r in requests),
            any_filter=any(self._filter[r.slot] for r in requests),
        )
        return DecodeInputs(slots, self.lengths[slots], self.last[slots], sampling)

    def advance(self, slots: Tensor, tokens: Tensor, emitted: Tensor) -> None:
        """After a round: each row advanced by `emitted` tokens, the last of them now its last token (rows that
        finished are stale and rewritten at the next admission).  # slots [B], tokens [B,D+1], emitted [B]"""
        self.lengths[slots] += emitted
        self.last[slots] = tokens.gather(1, (emitted - 1).unsqueeze(1)).squeeze(1)
