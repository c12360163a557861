"""Sampling: parameters, seed-coupled Gumbel noise, logit processing and the batched sampler."""

from fastrl.sampling.noise import (
    CLASSIC_ACCEPT_STREAM,
    CLASSIC_RESAMPLE_STREAM,
    SAMPLE_STREAM,
    gumbel_noise,
    hash_bits,
    uniform_noise,
)
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import log_probs, process_logits
from fastrl.sampling.sampler import SampleResult, SamplingBatch, perturbed_logits, sample

__all__ = [
    "CLASSIC_ACCEPT_STREAM",
    "CLASSIC_RESAMPLE_STREAM",
    "SAMPLE_STREAM",
    "SampleResult",
    "SamplingBatch",
    "SamplingParams",
    "gumbel_noise",
    "hash_bits",
    "log_probs",
    "perturbed_logits",
    "process_logits",
    "sample",
    "uniform_noise",
]
