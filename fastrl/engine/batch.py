"""The batch state on the device: per-slot lengths, last tokens, sampling settings, seeds and finish rules.

Written once when a request is admitted (or readmitted after preemption), advanced by each decode round on the
device itself; a round's inputs are one gather of the active slots, whatever the batch size or the lengths.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fastrl.engine.finish import Finish, finish_rows
from fastrl.engine.read_back import pack
from fastrl.engine.request import Request
from fastrl.sampling.sampler import SamplingBatch
from fastrl.speculative.inputs import DecodeInputs


class SlotState:
    """Device tensors indexed by slot (see the module docstring).

    lengths [S]: tokens whose KV is final (prompt + output minus the last, not yet fed, token);
    last [S]: the last emitted token, fed at position `lengths`; temperature/top_k/top_p/seeds [S]: sampling;
    stop_map [S,V] bool: the tokens that end each slot's request (its stop ids, and EOS unless ignore_eos; ids past
    the vocabulary are never sampled and left out), one byte per slot and token (257 slots of a 152k vocabulary:
    39 MB); length_limit [S]: prompt length + max_new_tokens. Host-side per slot: whether it is greedy / filtered
    (the sampler's shortcut flags).

    Every tensor keeps its storage for the engine's life: a CUDA graph that ends a round (`close_round`) reads and
    writes them in place.
    """

    def __init__(
        self,
        num_slots: int,
        device: torch.device,
        max_model_len: int,
        vocab_size: int,
        eos_ids: tuple[int, ...] = (),
        scratch_slot: int | None = None,
    ) -> None:
        """`scratch_slot`: a slot no request holds, where a graph's padding rows run (each round ends with its length
        and last token back at 0, so the next padded round reads the positions a fresh slot has)."""
        self.device = device
        self.scratch_slot = scratch_slot
        self.max_model_len = max_model_len
        self.eos_ids = tuple(eos_ids)
        self.vocab_size = vocab_size
        self.stop_map = torch.zeros(num_slots, vocab_size, dtype=torch.bool, device=device)
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
        self.stop_map[slots] = False
        rows, ids = [], []
        for r in requests:
            stops = set(r.params.stop_token_ids) | (set() if r.params.ignore_eos else set(self.eos_ids))
            kept = [t for t in stops if t < self.vocab_size]
            rows += [r.slot] * len(kept)
            ids += kept
        if ids:
            self.stop_map[torch.tensor(rows, device=self.device), torch.tensor(ids, device=self.device)] = True
        for r in requests:
            self._greedy[r.slot] = r.params.greedy
            self._filter[r.slot] = r.params.top_k > 0 or r.params.top_p < 1
        return slots

    def slots(self, requests: list[Request]) -> Tensor:
        """The requests' slots as one device tensor.  # -> [B] long"""
        return self.slot_tensor([r.slot for r in requests])

    def slot_tensor(self, slot_ids: list[int]) -> Tensor:
        """Slot ids as one device tensor.  # -> [B] long"""
        return torch.tensor(slot_ids, dtype=torch.long, device=self.device)

    def inputs(self, slot_ids: list[int]) -> DecodeInputs:
        """The round's inputs for the rows in slots `slot_ids`: one gather per field, the sampler's shortcuts where
        every row allows them.  # -> [B] rows"""
        greedy = all(map(self._greedy.__getitem__, slot_ids))
        return self.gather(self.slot_tensor(slot_ids), greedy, any(map(self._filter.__getitem__, slot_ids)))

    def gather(self, slots: Tensor, all_greedy: bool = False, any_filter: bool = True) -> DecodeInputs:
        """The inputs of the rows in `slots`, one gather per field, no host work: what a CUDA graph reads from its
        static slots (whose sampling always takes the full path: the defaults).  # slots [B] -> [B] rows"""
        sampling = replace(self.sampling.index(slots), all_greedy=all_greedy, any_filter=any_filter)
        return DecodeInputs(slots, self.lengths[slots], self.last[slots], sampling)

    def finish(self, slots: Tensor, tokens: Tensor, logprobs: Tensor, candidates: Tensor, before: Tensor) -> Finish:
        """The finish rules over a round's candidates (`fastrl.engine.finish`); `before` [B] is each request's
        token count before them.  # slots [B], tokens/logprobs [B,K], candidates [B] -> Finish"""
        stop = self.stop_map[slots.unsqueeze(1), tokens]  # [B,K]: each candidate a stop token of its row
        return finish_rows(tokens, logprobs, candidates, before, stop, self.length_limit[slots], self.max_model_len)

    def close_round(self, slots: Tensor, lengths: Tensor, tokens: Tensor, logprobs: Tensor, accepted: Tensor) -> Tensor:
        """A decode round's end, on the device: the finish rules over its candidates (accepted drafts + 1), each
        row advanced by them, and the results packed for the round's one read to the host (`read_back.unpack`).
        No host synchronisation: a CUDA graph holds it after the round's own work.
        # slots/lengths/accepted [B], tokens/logprobs [B,K] -> [B,2K+3] float64"""
        candidates = accepted + 1
        finish = self.finish(slots, tokens, logprobs, candidates, lengths + 1)
        self.advance(slots, tokens, candidates)
        if self.scratch_slot is not None:  # padding rows start every round where a fresh slot does
            self.lengths.narrow(0, self.scratch_slot, 1).zero_()
            self.last.narrow(0, self.scratch_slot, 1).zero_()
        return pack(tokens, logprobs, accepted, finish)

    def advance(self, slots: Tensor, tokens: Tensor, emitted: Tensor) -> None:
        """After a round: each row advanced by `emitted` tokens, the last of them now its last token (rows that
        finished are stale and rewritten at the next admission).  # slots [B], tokens [B,D+1], emitted [B]"""
        self.lengths[slots] += emitted
        self.last[slots] = tokens.gather(1, (emitted - 1).unsqueeze(1)).squeeze(1)
