"""EAGLE-3's fused input: the drafter reads a learned projection of several policy layers' hidden states (a low, a
middle and the last) instead of the last layer alone; inside a draft chain it reads its own outputs as before."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


class FusedEagleDrafter(EagleDrafter):
    """An EagleDrafter whose policy features are [.., m·H]: `m` layers' states, the final-norm state last
    (`fastrl.cotrain.features.policy_features(extra_layers=...)`). `fuse` maps them to H before the drafter's own
    fc; it starts as the identity on the last block, so a fresh fused drafter begins as the last-layer one.

    `extra_layers` are the policy decoder layers whose outputs precede the final-norm state.
    """

    def __init__(self, config: ModelConfig, extra_layers: tuple[int, ...]) -> None:
        super().__init__(config)
        if not extra_layers:
            raise ValueError("FusedEagleDrafter needs at least one extra layer")
        self.extra_layers = tuple(extra_layers)
        hidden = self.config.hidden_size
        width = (len(self.extra_layers) + 1) * hidden
        self.fuse = nn.Linear(width, hidden, bias=False)
        with torch.no_grad():
            self.fuse.weight.zero_()
            self.fuse.weight[:, width - hidden :] = torch.eye(hidden)

    def forward(self, policy: CausalLM, tokens: Tensor, features: Tensor, positions: Tensor, *args, **kwargs) -> Tensor:
        """As `EagleDrafter.forward`; `features` [B,S,m·H] (policy states, fused here) or [B,S,H] (the drafter's
        own outputs).  # -> [B,S,H]"""
        if features.shape[-1] == self.fuse.in_features:
            features = self.fuse(features.to(self.fuse.weight.dtype))
        return super().forward(policy, tokens, features, positions, *args, **kwargs)
