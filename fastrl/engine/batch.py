"""The batch state on the device: per-slot lengths, last tokens, sampling settings, seeds and finish rules.

Written once when a request is admitted (or readmitted after preemption), advanced by each decode round on the
device itself; a round's inputs are one gather of the active slots, whatever the batch size or the lengths.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fastrl.engine.finish import Finish, finish_rows
from fastrl.engine.request import Request
from fastrl.sampling.sampler import SamplingBatch
from fastrl.speculative.inputs import DecodeInputs


class SlotState:
    """Device tensors indexed by slot (see the module docstring).

    lengths [S]: tokens whose KV is final (prompt + output minus the last, not yet fed, token);
    last [S]: the last emitted token, fed at position `lengths`; temperature/top_k/top_p/seeds [S]: sampling;
    stop_ids [S,W]: the ids that end each slot's request (its stop ids, and EOS unless ignore_eos), padded with -1;
    length_limit [S]: prompt length + max_new_tokens. Host-side per slot: whether it is greedy / filtered (the
    sampler's shortcut flags).
    """

    def __init__(self, num_slots: int, device: torch.device, max_model_len: int, eos_ids: tuple[int, ...] = ()) -> None:
        self.device = device
        self.max_model_len = max_model_len
        self.eos_ids = tuple(eos_ids)
        self.stop_ids = torch.full((num_slots, 1), -1, dtype=torch.long, device=device)
        self.length_limit = torch.zeros(num_slots, dtype=torch.long, device=device)
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
        limits = [len(r.prompt_ids) + r.params.max_new_tokens for r in requests]
        self.length_limit[slots] = torch.tensor(limits, dtype=torch.long, device=self.device)
        stops = [list(r.params.stop_token_ids) + ([] if r.params.ignore_eos else list(self.eos_ids)) for r in requests]
        width = max(len(s) for s in stops)
        if width > self.stop_ids.shape[1]:  # widen (rarely: a request with more stop ids than any before)
            wider = torch.full((self.stop_ids.shape[0], width), -1, dtype=torch.long, device=self.device)
            wider[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        width = self.stop_ids.shape[1]
        padded = [s + [-1] * (width - len(s)) for s in stops]
        self.stop_ids[slots] = torch.tensor(padded, dtype=torch.long, device=self.device)
        for r in requests:
            self._greedy[r.slot] = r.params.greedy
            self._filter[r.slot] = r.params.top_k > 0 or r.params.top_p < 1
        return slots

    def slots(self, requests: list[Request]) -> Tensor:
        """The requests' slots as one device tensor.  # -> [B] long"""
        return torch.tensor([r.slot for r in requests], dtype=torch.long, device=self.device)

    def inputs(self, slot_ids: list[int]) -> DecodeInputs:
        """The round's inputs for the rows in slots `slot_ids`: one gather per field.  # -> [B] rows"""
        slots = torch.tensor(slot_ids, dtype=torch.long, device=self.device)
        sampling = replace(
            self.sampling.index(slots),
            all_greedy=all(map(self._greedy.__getitem__, slot_ids)),
            any_filter=any(map(self._filter.__getitem__, slot_ids)),
        )
        return DecodeInputs(slots, self.lengths[slots], self.last[slots], sampling)

    def finish(self, slots: Tensor, tokens: Tensor, logprobs: Tensor, candidates: Tensor, before: Tensor) -> Finish:
        """The finish rules over a round's candidates (`fastrl.engine.finish`); `before` [B] is each request's
        token count before them.  # slots [B], tokens/logprobs [B,K], candidates [B] -> Finish"""
        return finish_rows(
            tokens, logprobs, candidates, before, self.stop_ids[slots], self.length_limit[slots], self.max_model_len
        )

    def advance(self, slots: Tensor, tokens: Tensor, emitted: Tensor) -> None:
        """After a round: each row advanced by `emitted` tokens, the last of them now its last token (rows that
        finished are stale and rewritten at the next admission).  # slots [B], tokens [B,D+1], emitted [B]"""
        self.lengths[slots] += emitted
        self.last[slots] = tokens.gather(1, (emitted - 1).unsqueeze(1)).squeeze(1)
