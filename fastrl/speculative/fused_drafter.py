"""EAGLE-3's fused input: the drafter reads a learned projection of several policy layers' hidden states (a low, a
middle and the last) instead of the last layer alone; inside a draft chain it reads its own outputs as before."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fastrl.models.config import ModelConfig
from fastrl.speculative.drafter import EagleDrafter


def check_extra_layers(extra_layers: tuple[int, ...], num_policy_layers: int | None = None) -> None:
    """ValueError naming `extra_layers` unless they are distinct, ascending, >= 0 and (when `num_policy_layers` is
    given) inside the policy's decoder layers."""
    layers = list(extra_layers)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in layers):
        raise ValueError(f"extra_layers must be integers, got {layers}")
    if any(i < 0 for i in layers):
        raise ValueError(f"extra_layers must be >= 0, got {layers}")
    if any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
        raise ValueError(f"extra_layers must be distinct and ascending, got {layers}")
    if num_policy_layers is not None and layers and layers[-1] >= num_policy_layers:
        raise ValueError(f"extra_layers {layers} lie outside the policy's {num_policy_layers} decoder layers")


class FusedEagleDrafter(EagleDrafter):
    """An EagleDrafter whose policy features are [.., m·H]: the outputs of the policy decoder layers
    `extra_layers` (in that order), then the final-norm state (`CausalLM.forward(feature_layers=...)`, and offline
    `fastrl.cotrain.features.policy_features(extra_layers=...)`). `fuse` maps them to H before the drafter's own
    fc; it starts as the identity on the last block, so a fresh fused drafter begins as the last-layer one.
    """

    def __init__(self, config: ModelConfig, extra_layers: tuple[int, ...]) -> None:
        super().__init__(config)
        if not extra_layers:
            raise ValueError("FusedEagleDrafter needs at least one extra layer (extra_layers is empty)")
        check_extra_layers(tuple(extra_layers))
        self.extra_layers = tuple(extra_layers)
        hidden = self.config.hidden_size
        width = (len(self.extra_layers) + 1) * hidden
        self.fuse = nn.Linear(width, hidden, bias=False)
        with torch.no_grad():
            self.fuse.weight.zero_()
            self.fuse.weight[:, width - hidden :] = torch.eye(hidden)

    def check_features(self, features: Tensor) -> None:
        """ValueError unless `features` are [.., m·H] (policy states) or [.., H] (the drafter's own outputs)."""
        if features.shape[-1] not in (self.fuse.in_features, self.config.hidden_size):
            raise ValueError(
                f"FusedEagleDrafter: features must be [.., {self.fuse.in_features}] (policy states) or "
                f"[.., {self.config.hidden_size}] (its own outputs), got {tuple(features.shape)}"
            )

    def input_features(self, features: Tensor) -> Tensor:
        """Policy states fused to one feature; the drafter's own outputs as they are.  # [.., m·H | H] -> [.., H]"""
        self.check_features(features)
        if features.shape[-1] == self.fuse.in_features:
            return self.fuse(features.to(self.fuse.weight.dtype))
        return features
