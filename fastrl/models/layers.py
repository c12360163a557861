"""Building blocks of a Llama-family decoder layer, with HF parameter names (RMSNorm, MLP, attention, layer)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastrl.models.attention import AttentionMetadata
from fastrl.models.config import ModelConfig
from fastrl.models.cpu_linear import Linear
from fastrl.models.kv_cache import KVCache, SlotRows
from fastrl.models.layer_kernels import LayerKernels
from fastrl.models.masks import sdpa_mask
from fastrl.models.rope import apply_rope


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale. Statistics in float32 for float32 and narrower inputs (HF
    LlamaRMSNorm numerics), in float64 for float64 inputs: a float64 engine must not round through float32, where a
    last-bit difference between a plain row and a verify row can flip a float32 rounding (~1e-7 apart)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernels: LayerKernels | None = None  # set by `install_layer_kernels`

    def forward(self, x: Tensor) -> Tensor:
        """Normalises the last axis.  # [..., D] -> [..., D]"""
        if self.kernels is not None and self.kernels.applies(x, self.weight):
            return self.kernels.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_norm(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """s = x + residual and the norm of s (one launch with the layer kernels).  # 2 x [..., D] -> 2 x [..., D]"""
        if self.kernels is not None and x.shape == residual.shape and self.kernels.applies(x, residual, self.weight):
            return self.kernels.add_rms_norm(x, residual, self.weight, self.eps)
        total = x + residual
        return total, self(total)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.kernels: LayerKernels | None = None  # set by `install_layer_kernels`

    def forward(self, x: Tensor) -> Tensor:
        """# [B,S,H] -> [B,S,H]"""
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.kernels is not None and self.kernels.applies(gate, up):
            return self.down_proj(self.kernels.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE, optional q/k/v(/o) bias and optional per-head q/k RMSNorm (Qwen3).

    With a cache, the cache's attention backend stores the new K/V and attends over the entries `meta` names
    (one `AttentionMetadata` per forward); without one, the keys are the new tokens under `attn_mask`.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        h, kvh, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer_idx = layer_idx
        self.head_dim = hd
        self.enable_gqa = kvh != h
        self.q_proj = Linear(config.hidden_size, h * hd, bias=config.attention_bias)
        self.k_proj = Linear(config.hidden_size, kvh * hd, bias=config.attention_bias)
        self.v_proj = Linear(config.hidden_size, kvh * hd, bias=config.attention_bias)
        self.o_proj = Linear(h * hd, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm: RMSNorm | None = RMSNorm(hd, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm: RMSNorm | None = RMSNorm(hd, config.rms_norm_eps) if config.qk_norm else None
        self.kernels: LayerKernels | None = None  # set by `install_layer_kernels`

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        attn_mask: Tensor | None,
        cache: KVCache | None = None,
        meta: AttentionMetadata | None = None,
    ) -> Tensor:
        """# x [B,S,H], cos/sin [B,S,1,hd], attn_mask [B,1,S,S] bool (no cache) -> [B,S,H]"""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim)
        k = self.k_proj(x).view(b, s, -1, self.head_dim)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self._rope(q, cos, sin).transpose(1, 2)
        k = self._rope(k, cos, sin).transpose(1, 2)
        if cache is not None and meta is not None:
            out = cache.attend(self.layer_idx, q, k, v, meta, self.enable_gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=self.enable_gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """# x [B,S,h,hd], cos/sin [B,S,1,hd] -> [B,S,h,hd]"""
        if (
            self.kernels is not None
            and cos.shape == sin.shape == (*x.shape[:2], 1, x.shape[-1])
            and self.kernels.applies(x, cos, sin)
        ):
            return self.kernels.rope(x, cos, sin)
        return apply_rope(x, cos, sin)


class DecoderLayer(nn.Module):
    """One pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).

    `layer_idx` is the layer's index into the KVCache it is given (a standalone drafter layer with its own one-layer
    cache uses 0). `input_norm=False` drops `input_layernorm` (EAGLE-1 drafters feed the fused features straight in).

    To run one standalone (e.g. the EAGLE drafter), build the per-forward inputs the way `CausalLM.forward` does:
    `cos, sin = RotaryEmbedding(config)(positions, dtype)` and `mask = attention_mask(positions, cache_index,
    attn_mask, kv_len)` from fastrl.models.masks (with a cache: pass `cache_index`, defaulting to positions), and
    `slots` as a [B] LongTensor or `cache.rows(slots)`.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, input_norm: bool = True) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm: RMSNorm | None = RMSNorm(config.hidden_size, config.rms_norm_eps) if input_norm else None
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: KVCache | None = None,
        slots: SlotRows | Tensor | None = None,
        cache_index: Tensor | None = None,
        attn_mask: Tensor | None = None,
        meta: AttentionMetadata | None = None,
    ) -> Tensor:
        """# hidden [B,S,H], cos/sin [B,S,1,hd], slots [B], cache_index [B,S], attn_mask [B,1,S,L] bool -> [B,S,H]

        attn_mask (True = may attend) is either the prepared SDPA mask [B,1,S,L] that `masks.attention_mask` builds
        once per forward, or a raw [B,S,L] mask (prepared here). It is required with a cache (its last axis is the
        number of cache entries attended); None without a cache means causal over the new tokens in order.
        A model running several layers passes `meta` (from `cache.metadata`, built once per forward) instead of
        slots / cache_index / attn_mask.
        """
        if meta is not None:
            attn_mask = meta.mask
        elif attn_mask is None:
            if cache is not None:
                raise ValueError("DecoderLayer: attn_mask is required when a cache is given")
            s = hidden.shape[1]
            attn_mask = torch.ones(s, s, dtype=torch.bool, device=hidden.device).tril()
        elif attn_mask.dim() == 3:
            attn_mask = sdpa_mask(attn_mask)
        if cache is not None and meta is None:
            if slots is None or cache_index is None:
                raise ValueError("DecoderLayer: slots and cache_index are required with a cache (or pass meta)")
            meta = cache.metadata(slots, cache_index, attn_mask)
        normed = hidden if self.input_layernorm is None else self.input_layernorm(hidden)
        hidden, normed = self.post_attention_layernorm.add_norm(
            hidden, self.self_attn(normed, cos, sin, attn_mask, cache, meta)
        )
        return hidden + self.mlp(normed)


def install_layer_kernels(model: nn.Module, ops: LayerKernels | None) -> None:
    """Gives every norm, MLP and attention of `model` the layer kernels (None: PyTorch's ops again). They use them only
    where `LayerKernels.applies` (no gradient wanted), so a model being trained keeps autograd."""
    for module in model.modules():
        if isinstance(module, (RMSNorm, MLP, Attention)):
            module.kernels = ops
