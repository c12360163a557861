"""A fused drafter for tests: FusedEagleDrafter with random (not identity) fuse weights, so every layer it reads
moves its drafts and a feature fed wrong shows."""

from __future__ import annotations

import torch

from fastrl.models.config import ModelConfig
from fastrl.speculative.fused_drafter import FusedEagleDrafter


def random_fused_drafter(config: ModelConfig, extra_layers: tuple[int, ...], seed: int = 0) -> FusedEagleDrafter:
    """A FusedEagleDrafter (seeded) whose `fuse` mixes every block with random weights of unit gain."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        drafter = FusedEagleDrafter(config, extra_layers)
    width = drafter.fuse.in_features
    with torch.no_grad():
        drafter.fuse.weight.copy_(torch.randn(drafter.fuse.weight.shape, generator=generator) / width**0.5 * 2)
    return drafter.eval()
