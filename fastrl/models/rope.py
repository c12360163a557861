"""Rotary position embeddings (RoPE) with optional Llama-3 frequency scaling, for arbitrary position tensors."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fastrl.models.config import ModelConfig, RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> Tensor:
    """Inverse frequencies, fp32 on CPU, computed exactly as HF does.  # -> [head_dim/2]"""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for RoPE at arbitrary (per-row, non-monotone) positions.

    `inv_freq` is a plain fp32 attribute (not a buffer: it stays fp32 whatever dtype the model is cast to, and is
    absent from state dicts); it follows the positions' device on first use.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin, computed in fp32 then cast to `dtype`.  # [B,S] long -> 2 x [B,S,1,hd]"""
        inv_freq = self.inv_freq
        if inv_freq.device != positions.device:
            inv_freq = self.inv_freq = inv_freq.to(positions.device)
        freqs = positions.unsqueeze(-1).float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(2)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates pairs (i, i + hd/2) of every head by the position angle.  # [B,S,h,hd], 2 x [B,S,1,hd] -> [B,S,h,hd]"""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
