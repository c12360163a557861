"""The decoder layer's norm, RoPE and SwiGLU product as one Triton launch each, for inference on a GPU.

Eager PyTorch spends a bf16 RMSNorm in 8 kernels (casts, square, mean, add, rsqrt, two products), RoPE in 5 per
tensor (negated slice, cat, two products, sum) and SiLU-times-up in 2: at the GPU recipe model's shape that is ~34
launches of 1-5 µs per layer beside 7 GEMMs and one attention, half a batch-256 round's device time on an H200
(docs/benchmarks.md, issue 26 round 10). `LayerKernels` runs them as 5 launches a layer (input norm, the residual add
fused with the post-attention norm, RoPE for q and for k, SiLU-times-up; the kernel bodies are `layer_triton`).

`layers.RMSNorm`, `layers.MLP` and `layers.Attention` use it when the engine gave them one (`install_layer_kernels`,
engine config `layer_kernels`, on CUDA) and a call `applies`: no gradient wanted (training keeps PyTorch's
autograd ops), float16, bfloat16 or float32, contiguous rows. Results equal the eager ops' to the rounding the
kernels' docstring names; rows never depend on each other.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

from fastrl.models.kernel_check import passes_check

log = logging.getLogger(__name__)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SILU_BLOCK = 1024


class LayerKernels:
    """The three layer kernels, compiled at first use per shape (Triton's cache), and when each applies."""

    def __init__(self) -> None:
        import triton

        from fastrl.models import layer_triton

        self._norm = triton.jit(layer_triton.rms_norm)
        self._rope = triton.jit(layer_triton.rope)
        self._silu_mul = triton.jit(layer_triton.silu_mul)
        self._next_power_of_2 = triton.next_power_of_2

    def __reduce__(self):  # a model holding one deep-copies and pickles: the kernels are rebuilt, not copied
        return (LayerKernels, ())

    @classmethod
    @functools.cache
    def load(cls, device: torch.device | str, dtype: torch.dtype) -> LayerKernels | None:
        """The layer kernels for `dtype` on `device`, or None where Triton is missing, `dtype` is not one they take, or
        they fail `self_check` there (a warning says why). Once per process: every engine on the device shares
        them (and the shapes Triton compiled for them)."""
        if dtype not in DTYPES:
            return None
        try:
            ops = cls()
        except ImportError:
            log.warning("Triton is not installed: the decoder layers' norms, RoPE and SwiGLU run as PyTorch ops")
            return None
        if not passes_check("the layer kernels", lambda: ops.self_check(device, dtype), "the layers run PyTorch's ops"):
            return None
        return ops

    @staticmethod
    def applies(*tensors: Tensor) -> bool:
        """True when the kernels take these inputs: one dtype they handle, contiguous, no gradient wanted."""
        first = tensors[0]
        if first.dtype not in DTYPES or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return False
        return all(t.dtype == first.dtype and t.device == first.device and t.is_contiguous() for t in tensors)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """`layers.RMSNorm` over the last axis.  # x [..., N], weight [N] -> [..., N]"""
        out = torch.empty_like(x)
        self._launch_norm(x, None, weight, eps, out, None)
        return out

    def add_rms_norm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """s = x + residual (rounded to the dtype) and `layers.RMSNorm` of s, in one launch.
        # x, residual [..., N], weight [N] -> (s, norm(s)) [..., N] each"""
        total, out = torch.empty_like(x), torch.empty_like(x)
        self._launch_norm(x, residual, weight, eps, out, total)
        return total, out

    def _launch_norm(self, x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, out: Tensor, total) -> None:
        n = x.shape[-1]
        rows = x.numel() // max(1, n)
        if rows == 0:
            return
        block = self._next_power_of_2(n)
        self._norm[(rows,)](
            x,
            x if residual is None else residual,
            weight,
            out,
            out if total is None else total,
            n,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=max(1, min(16, block // 256)),
        )

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """`rope.apply_rope`.  # x [B,S,h,hd], cos/sin [B,S,1,hd] -> [B,S,h,hd]"""
        b, s, heads, dim = x.shape
        out = torch.empty_like(x)
        if b * s == 0:
            return out
        half = dim // 2
        self._rope[(b * s,)](
            x,
            cos,
            sin,
            out,
            heads,
            HALF=half,
            HEADS=self._next_power_of_2(heads),
            HALF_BLOCK=self._next_power_of_2(half),
            enable_fp_fusion=False,
        )
        return out

    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        """F.silu(gate) * up.  # gate, up [..., I] -> [..., I]"""
        out = torch.empty_like(gate)
        n = gate.numel()
        if n:
            self._silu_mul[(-(-n // SILU_BLOCK),)](gate, up, out, n, BLOCK=SILU_BLOCK, enable_fp_fusion=False)
        return out

    def self_check(self, device: torch.device | str, dtype: torch.dtype) -> str | None:
        """Each kernel against the eager ops on random inputs of a few shapes in `dtype`: the first that differs by
        more than 4 ulps of `dtype` (relative, or absolute below 1), or None. (The tests hold the residual add and
        RoPE to the eager ops bitwise; Triton's interpreter rounds float32 to bfloat16 toward zero, so this check,
        which also runs there, allows the rounding.)"""
        from fastrl.models.layers import RMSNorm  # the eager ops the kernels stand in for (layers imports this)
        from fastrl.models.rope import apply_rope

        gen = torch.Generator().manual_seed(0)

        def rand(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=gen).to(device, dtype)

        def far(got: Tensor, want: Tensor) -> bool:
            scale = want.float().abs().clamp_min(1.0)
            return ((got.float() - want.float()).abs() / scale).max().item() > 4 * torch.finfo(dtype).eps

        for rows, width, heads, dim in ((1, 64, 2, 16), (5, 200, 3, 64), (3, 1024, 16, 128)):
            x, residual, weight = rand(rows, width), rand(rows, width), rand(width)
            total, normed = self.add_rms_norm(x, residual, weight, 1e-6)
            norm = RMSNorm(width, 1e-6).to(device, dtype)
            with torch.no_grad():
                norm.weight.copy_(weight)
                want = norm(x + residual)
            if far(total, x + residual) or far(normed, want):
                return f"the residual add and norm differ from PyTorch's in {dtype}, width {width}"
            q = rand(2, rows, heads, dim)
            angle = torch.rand(2, rows, 1, dim // 2, generator=gen).to(device) * 100
            cos, sin = (torch.cat((f(angle), f(angle)), -1).to(dtype) for f in (torch.cos, torch.sin))
            if far(self.rope(q, cos, sin), apply_rope(q, cos, sin)):
                return f"RoPE differs from apply_rope in {dtype}, {heads} heads of {dim}"
            gate, up = rand(rows, width), rand(rows, width)
            if far(self.silu_mul(gate, up), torch.nn.functional.silu(gate) * up):
                return f"SiLU(gate) * up differs from PyTorch's in {dtype}"
        return None
