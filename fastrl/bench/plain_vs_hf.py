"""Plain decoding throughput: fastrl's engine vs transformers `generate`, side by side in one process."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.bench.timing import time_median
from fastrl.bench.workload import left_pad
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams


@dataclass
class PlainVsHfRow:
    """One batch size: tokens/s of each and their ratio."""

    batch_size: int
    new_tokens: int
    fastrl_tok_s: float
    hf_tok_s: float

    @property
    def ratio(self) -> float:
        return self.fastrl_tok_s / self.hf_tok_s


def bench_plain_vs_hf(
    model: CausalLM,
    hf_model: torch.nn.Module,
    prompts: list[list[int]],
    batch_size: int,
    new_tokens: int,
    repeats: int,
    pad_id: int,
    device: str = "cpu",
    max_model_len: int | None = None,
) -> PlainVsHfRow:
    """Greedy-decode `new_tokens` for `batch_size` prompts with each; median over `repeats`. `max_model_len`
    bounds fastrl's KV cache (None: the model's whole context)."""
    batch = prompts[:batch_size]
    engine = Engine(model, EngineConfig(max_batch_size=batch_size, max_model_len=max_model_len, device=device))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    inputs = [GenerateInput(p, params) for p in batch]
    ours = time_median(lambda: engine.generate(inputs), repeats, device)

    ids, mask = left_pad(batch, pad_id)
    ids_t = torch.tensor(ids, device=device)
    mask_t = torch.tensor(mask, device=device)

    def hf_run() -> None:
        with torch.inference_mode():
            hf_model.generate(
                ids_t,
                attention_mask=mask_t,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )

    theirs = time_median(hf_run, repeats, device)
    total = batch_size * new_tokens
    return PlainVsHfRow(batch_size, new_tokens, total / ours.median_s, total / theirs.median_s)
