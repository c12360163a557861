"""The seed-coupled sampler: token = argmax(processed logits + gumbel(seed, position)).

A row's token and log-prob depend only on its own logits, sampling settings, seed and absolute position, never
on the other rows, so plain decoding and speculative verification (which evaluates many tree nodes per request)
pick the same token at the same position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fastrl.sampling.gumbel_argmax import LAZY_MIN_VOCAB, gumbel_argmax
from fastrl.sampling.noise import SAMPLE_STREAM, gumbel_noise, uniform_bits
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling settings as tensors, one row per logits row.

    Attributes:
        temperature: [N] float32, 0 = greedy.
        top_k: [N] int64, 0 = off.
        top_p: [N] float32, 1 = off.
        seeds: [N] int64 in [0, 2**63).
        all_greedy: host-side flag, True only if every row is greedy (then no noise is computed).
        any_filter: host-side flag, False only if no row uses top-k or top-p (then no sort is done).

    The host flags are conservative after :meth:`index` / :meth:`expand` (a subset of rows keeps the flags of
    the whole batch), which costs only speed, never correctness.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor
    all_greedy: bool
    any_filter: bool

    @classmethod
    def from_params(
        cls, params_list: Sequence[SamplingParams], seeds: Sequence[int], device: torch.device | str | None = None
    ) -> SamplingBatch:
        """Build a batch from per-request params and resolved seeds (``seeds[i]`` is row i's seed)."""
        if len(params_list) != len(seeds):
            raise ValueError(f"params_list and seeds must have equal length, got {len(params_list)} and {len(seeds)}")
        for seed in seeds:
            if not 0 <= seed < 2**63:
                raise ValueError(f"seeds must be integers in [0, 2**63), got {seed}")
        return cls(
            temperature=torch.tensor([p.temperature for p in params_list], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params_list], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params_list], dtype=torch.float32, device=device),
            seeds=torch.tensor(list(seeds), dtype=torch.int64, device=device),
            all_greedy=all(p.greedy for p in params_list),
            any_filter=any(p.top_k > 0 or p.top_p < 1 for p in params_list),
        )

    def __len__(self) -> int:
        return self.seeds.shape[0]

    def index(self, rows: torch.Tensor) -> SamplingBatch:
        """The batch of rows ``rows`` ([M] int64 indices into this batch; repeats allowed)."""
        # [M] -> batch of M rows
        return SamplingBatch(
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            seeds=self.seeds[rows],
            all_greedy=self.all_greedy,
            any_filter=self.any_filter,
        )

    def expand(self, repeats: torch.Tensor, total: int | None = None) -> SamplingBatch:
        """Row i repeated ``repeats[i]`` times, in order ([N] int64 -> sum(repeats) rows).

        Pass ``total = sum(repeats)`` when known to avoid a device synchronisation.
        """
        # [N] -> batch of sum(repeats) rows
        rows = torch.arange(len(self), device=self.seeds.device).repeat_interleave(repeats, output_size=total)
        return self.index(rows)


@dataclass(frozen=True)
class SampleResult:
    """Sampled tokens [N] int64 and their log-probabilities [N] (float32; float64 for float64 logits) under the
    processed distribution."""

    tokens: torch.Tensor
    logprobs: torch.Tensor


def perturbed_logits(
    logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """Processed logits plus Gumbel(seed, position) noise; greedy rows get raw logits, no noise.

    Its row argmax is the sampled token; its row top-k is a Gumbel-top-k draw without replacement, which the
    drafter uses to choose candidates that agree with the policy's sampler. `noise` may pass the rows'
    ``sampling_noise`` computed beforehand (a speculative round computes each position's noise once).
    """
    # [N,V], batch of N, [N] -> [N,V] float32 (float64 for float64 logits)
    processed = process_logits(logits, batch.temperature, batch.top_k, batch.top_p, apply_filters=batch.any_filter)
    return _perturb(processed, batch, positions, noise)


def sampling_noise(batch: SamplingBatch, positions: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
    """The sampler's Gumbel noise for each row at its position; None when every row is greedy (no noise used).

    # batch of N, [N] -> [N,V] float32 | None
    """
    if batch.all_greedy:
        return None
    return gumbel_noise(batch.seeds, positions, vocab_size, device=positions.device, stream=SAMPLE_STREAM)


def _perturb(
    processed: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor, noise: torch.Tensor | None = None
) -> torch.Tensor:
    # [N,V] -> [N,V]
    if batch.all_greedy:
        return processed
    if noise is None:
        noise = sampling_noise(batch, positions, processed.shape[-1])
    greedy = (batch.temperature == 0)[:, None]
    return torch.where(greedy, processed, centred(processed) + noise)


def centred(processed: torch.Tensor) -> torch.Tensor:
    """Each row less its largest value, before the noise is added: the argmax is the same, but near the top of the
    row, where it is decided, the values keep the noise's precision. Otherwise a float32 row scaled by a low
    temperature (30 / 1e-5 = 3e6, a float32 step of 0.25) rounds the noise to that step, and the ties it makes go to
    the lower index: two equal logits drawn 73/27 at T = 1e-6 while their log-probs say 50/50. (x - m is exact for
    x within a factor 2 of m.)  # [N,V] -> [N,V]"""
    return processed - processed.amax(dim=-1, keepdim=True)


def sample(
    logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor, noise: torch.Tensor | None = None
) -> SampleResult:
    """Sample one token per row.

    For rows with temperature > 0 the token is ``argmax(processed + gumbel(seed, position))``, an exact draw from
    ``softmax(processed)``; for temperature 0 rows it is ``argmax(logits)`` (first index on ties). The log-prob
    is ``log_softmax(processed)[token]``; for temperature 0 rows that is the log-softmax of the raw logits, i.e.
    the log-prob under the temperature-1 unfiltered distribution.

    Args:
        logits: [N, V] raw logits.
        batch: sampling settings for the N rows.
        positions: [N] int64 absolute position (index in prompt + response) of the token being sampled.
        noise: optionally ``sampling_noise(batch, positions, V)`` computed beforehand.
    """
    # [N,V], batch of N, [N] -> tokens [N] int64, logprobs [N] float32 (float64 for float64 logits)
    if logits.dim() != 2 or logits.shape[0] != len(batch) or positions.shape != (len(batch),):
        raise ValueError(
            f"expected logits [N, V], positions [N] with N = {len(batch)}, got {tuple(logits.shape)}, "
            f"{tuple(positions.shape)}"
        )
    processed = process_logits(logits, batch.temperature, batch.top_k, batch.top_p, apply_filters=batch.any_filter)
    tokens = _sampled_tokens(processed, batch, positions, noise)
    logprobs = torch.log_softmax(processed, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return SampleResult(tokens=tokens, logprobs=logprobs)


def _sampled_tokens(
    processed: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor, noise: torch.Tensor | None
) -> torch.Tensor:
    """argmax of the perturbed logits; on wide CPU rows whose noise is not given, the lazy Gumbel-argmax (the
    same tokens, most Gumbel values never computed).  # [N,V] -> [N] int64"""
    vocab = processed.shape[-1]
    if batch.all_greedy or noise is not None or processed.device.type != "cpu" or vocab < LAZY_MIN_VOCAB:
        return _perturb(processed, batch, positions, noise).argmax(dim=-1)
    bits = uniform_bits(batch.seeds, positions, vocab, device=processed.device, stream=SAMPLE_STREAM)
    tokens = gumbel_argmax(centred(processed), bits)
    greedy = batch.temperature == 0
    if bool(greedy.any()):  # a CPU tensor: no device synchronisation
        tokens = torch.where(greedy, processed.argmax(dim=-1), tokens)
    return tokens
