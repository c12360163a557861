"""Training examples for the drafter: token ids with the policy hidden states that preceded them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class FeatureSequence:
    """Drafter entries of one sequence: entry i reads token x_{p} and feature f_{p-1}, p = start_position + i.

    tokens: [S] long; features: [S,F] (features[i] = f_{p-1}, the policy's final-norm hidden state, F = H; or with
    EAGLE-3's fused input, F = m·H: m-1 lower layers' outputs, then f_{p-1} last); the target of entry i is the last H
    columns of features[i + 1] (= f_p), so the last entry has none. `policy_version` tags the policy that produced
    the features (co-training keeps recent versions).
    """

    tokens: Tensor
    features: Tensor
    start_position: int
    policy_version: int = 0

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.features.dim() != 2 or self.tokens.shape[0] != self.features.shape[0]:
            raise ValueError(
                f"FeatureSequence: tokens [S] and features [S,H] needed, got {tuple(self.tokens.shape)} "
                f"and {tuple(self.features.shape)}"
            )
        if self.start_position < 1:
            raise ValueError(f"FeatureSequence.start_position must be >= 1, got {self.start_position}")

    @property
    def finite(self) -> bool:
        """Whether every feature is finite: one NaN or inf entry makes every training step that samples the
        sequence non-finite, so buffers keep only finite sequences."""
        return bool(torch.isfinite(self.features).all())

    @property
    def num_targets(self) -> int:
        return max(0, self.tokens.shape[0] - 1)

    @classmethod
    def from_full_sequence(cls, ids: Tensor, features: Tensor, policy_version: int = 0) -> FeatureSequence:
        """From a whole sequence x_0..x_T and its features f_0..f_T.  # ids [T+1], features [T+1,H]"""
        return cls(ids[1:], features[:-1], start_position=1, policy_version=policy_version)


@dataclass
class FeatureBatch:
    """Right-padded batch of FeatureSequences.

    tokens [B,S], features [B,S,F], targets [B,S,H] (the last H feature columns shifted by one), positions [B,S],
    mask [B,S] bool (True where a target exists).
    """

    tokens: Tensor
    features: Tensor
    targets: Tensor
    positions: Tensor
    mask: Tensor

    @classmethod
    def collate(
        cls,
        seqs: list[FeatureSequence],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        target_size: int,
    ) -> FeatureBatch:
        """Pad `seqs` into one batch; targets are the last `target_size` feature columns: the drafter's hidden size
        (a fused drafter's features are wider than what it predicts, so the caller always says it). ValueError for
        no sequences, or sequences whose features differ in width."""
        if not seqs:
            raise ValueError("FeatureBatch.collate: no sequences (a batch needs at least one)")
        sizes = sorted({s.features.shape[1] for s in seqs})
        if len(sizes) > 1:
            raise ValueError(f"FeatureBatch.collate: the sequences' features are of widths {sizes}; a batch needs one")
        width = max(s.tokens.shape[0] for s in seqs)
        size = sizes[0]
        hidden = target_size
        if not 0 < hidden <= size:
            raise ValueError(f"FeatureBatch.collate: target_size {hidden} must be in 1..{size} (the features' width)")
        b = len(seqs)
        tokens = torch.zeros(b, width, dtype=torch.long)
        features = torch.zeros(b, width, size, dtype=dtype)  # padded in the batch's dtype: float64 stays exact
        targets = torch.zeros(b, width, hidden, dtype=dtype)
        positions = torch.zeros(b, width, dtype=torch.long)
        mask = torch.zeros(b, width, dtype=torch.bool)
        for row, s in enumerate(seqs):
            n = s.tokens.shape[0]
            tokens[row, :n] = s.tokens
            features[row, :n] = s.features
            targets[row, : n - 1] = s.features[1:, size - hidden :]
            positions[row] = s.start_position + torch.arange(width)
            mask[row, : n - 1] = True
        return cls(
            tokens.to(device),
            features.to(device),
            targets.to(device),
            positions.to(device),
            mask.to(device),
        )
