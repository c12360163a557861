"""What drafter training generates: every (prompt, temperature, sample) request in a fixed order with its seed, and
the shards of those requests' rollouts on disk (generated on first need, read back on every later epoch or run)."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.json_values import is_int
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams

M = TypeVar("M", bound=nn.Module)


GREEDY_PASS = "one sample a prompt"
"""What a T=0 pass draws (``greedy_pass`` of a stream's settings): greedy samples of one prompt are all alike, so it
draws one (streams saved before drew `samples`, identical ones: ``stream_trainer.LATER_KEYS``)."""


@dataclass
class RolloutPlan:
    """Requests of one pass per temperature over the prompts, `samples` per prompt at a temperature above 0 and one
    at 0 (a prompt's samples adjacent, so a shard's engine shares their prefill). Request r has seed
    `seed * 100003 + r`. The engine runs in `dtype` (an engine dtype name), on a cast copy of a policy held in
    another."""

    prompts: list[list[int]]
    temperatures: list[float]
    samples: int
    max_new_tokens: int
    seed: int
    dtype: str = "float32"

    def __len__(self) -> int:
        return len(self.prompts) * sum(self.samples_at(t) for t in self.temperatures)

    def samples_at(self, temperature: float) -> int:
        """Samples a prompt gets in the pass at ``temperature``: one when greedy (they would all be alike)."""
        return 1 if temperature == 0 else self.samples

    def request(self, r: int) -> GenerateInput:
        """Request r: the passes in order, each prompt's samples adjacent within a pass."""
        if not 0 <= r < len(self):
            raise IndexError(f"request {r} outside the plan's {len(self)}")
        index = r
        for temperature in self.temperatures:
            n = self.samples_at(temperature)
            if index < len(self.prompts) * n:
                params = SamplingParams(
                    max_new_tokens=self.max_new_tokens, temperature=temperature, seed=self.seed * 100003 + r
                )
                return GenerateInput(self.prompts[index // n], params)
            index -= len(self.prompts) * n
        raise AssertionError("unreachable: r < len(self)")

    def engine_config(self, batch_size: int, device: str) -> EngineConfig:
        """An engine whose KV cache holds the longest prompt plus max_new_tokens (not the model's whole context:
        SmolLM2's 8192 positions would cost 377 MB of float32 KV cache per slot)."""
        max_model_len = max(len(p) for p in self.prompts) + self.max_new_tokens + 1
        return EngineConfig(max_batch_size=batch_size, max_model_len=max_model_len, device=device, dtype=self.dtype)

    def generate(self, policy: CausalLM, requests: range, batch_size: int, device: str) -> list[list[int]]:
        """Prompt + response ids of `requests`, in one batched engine (plain decoding); `policy` keeps its dtype."""
        config = self.engine_config(max(1, min(batch_size, len(requests))), device)  # no slot without a request
        engine = Engine(cast_copy(policy, config.torch_dtype), config)
        outs = engine.generate([self.request(r) for r in requests], progress=len(requests) > 1)
        return [o.prompt_ids + o.token_ids for o in outs]


def cast_copy(module: M, dtype: torch.dtype) -> M:
    """`module` itself when its parameters are in `dtype`, else a copy cast to it, for inference (an engine casts
    the modules it is given in place: a policy or drafter in training keeps its own dtype). Each parameter is cast
    straight into the copy (no full-precision copy on the way; tied weights stay tied)."""
    if next(module.parameters()).dtype == dtype:
        return module
    memo = {id(p): nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in module.parameters()}
    return copy.deepcopy(module, memo).to(dtype)


@dataclass
class RolloutShards:
    """The plan's rollouts in shards of `shard_size` requests, kept as JSON files in `directory`: a shard is
    generated the first time it is needed (written atomically) and read back afterwards, so memory holds one shard
    and an interrupted run regenerates nothing it finished. Only a run of the settings recorded beside the shards
    reads them back (``stream_trainer.open_stream`` checks before any work)."""

    plan: RolloutPlan
    shard_size: int
    directory: Path

    @property
    def count(self) -> int:
        return -(-len(self.plan) // self.shard_size)

    def requests(self, shard: int) -> range:
        return range(shard * self.shard_size, min(len(self.plan), (shard + 1) * self.shard_size))

    def responses(self, shard: int, ids: list[list[int]]) -> list[list[int]]:
        """The response part of the shard's prompt + response ``ids`` (what the policy itself generated)."""
        return [row[len(self.plan.request(r).prompt_ids) :] for row, r in zip(ids, self.requests(shard), strict=True)]

    def ids(self, shard: int, policy: CausalLM, batch_size: int, device: str) -> list[list[int]]:
        """Prompt + response ids of the shard's requests, generated now or read from its file."""
        path = self.directory / f"shard_{shard:05d}.json"
        if path.is_file():
            return self._read(path, shard, policy.config.vocab_size)
        ids = self.plan.generate(policy, self.requests(shard), batch_size, device)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ids))
        os.replace(tmp, path)
        return ids

    def _read(self, path: Path, shard: int, vocab_size: int) -> list[list[int]]:
        """A shard file written earlier; ValueError naming it (and saying how to regenerate it) when it is not this
        plan's shard: one non-empty list of token ids in [0, vocab_size) per request."""
        expected = len(self.requests(shard))
        try:
            ids = json.loads(path.read_text())
            if not isinstance(ids, list) or len(ids) != expected:
                raise ValueError(f"expected a list of {expected} token-id lists")
            for row in ids:
                if not isinstance(row, list) or not row:
                    raise ValueError("a request's ids are not a non-empty list")
                if not all(is_int(t) and 0 <= t < vocab_size for t in row):
                    raise ValueError(f"token ids must be integers in [0, {vocab_size})")
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not shard {shard} of this run ({err}); delete it to generate it again") from None
        return ids
