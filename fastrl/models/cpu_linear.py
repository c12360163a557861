"""Linear layers of a decode or verify forward on a CPU: fastrl's small-row kernel (`kernels/small_linear.cpp`).

PyTorch's CPU matrix product (one thread) streams a large weight once per input row at a few rows, so a verify
forward over a few tokens costs several plain forwards. With torch 2.13 (this project's CPU pin) SmolLM2-135M's
49152 x 576 LM head takes 7.3 ms at one row, 14.8 at two, 22.3 at three and 12.8 at four; the kernel reads each
weight row once for up to 16 input rows and takes 3.4, 3.6, 3.9 and 4.2 ms there (a one-row product too: PyTorch's
one-row path streams the weight at half the kernel's rate on this CPU). `Linear` (an `nn.Linear`, same parameters
and state dict) sends to it `MIN_ROWS` to `MAX_ROWS` input rows of a weight of at least `MIN_WEIGHT` elements,
float32 or float64, one torch thread (the kernel runs on one core; more threads are PyTorch's), on a CPU, no
gradient wanted. The routing was set by whole forwards (`python -m fastrl.bench.small_linear --decode smollm2
--batch-sizes 1,2,3,4,8 --min-rows 1`), where every weight comes from memory: a product timed alone keeps a
mid-sized weight in the CPU's caches and favours PyTorch. SmolLM2's plain decoding with every weight from 2^18
elements routed, against PyTorch alone: 1.52x faster at batch 1, 2.08x at 2, 2.26x at 3, 1.63x at 4, 1.18x at 8
(torch 2.13; with an earlier torch, whose product read the weight once at 1-3 rows, the kernel began at 4 rows).
Its result is PyTorch's to rounding (tests/models/test_cpu_linear.py), as PyTorch's own results at different row
counts already differ from each other in the last bits; the exactness tests hold engines using it to plain decoding
and to transformers."""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastrl.models.kernel_build import load_kernel

MIN_ROWS = 1
"""Fewest input rows sent to the kernel (every row count up to `MAX_ROWS`: see the module docstring)."""
MAX_ROWS = 15
"""Most input rows sent to the kernel (from 16 rows PyTorch packs the weight and is faster)."""
MIN_WEIGHT = 1 << 18
"""Fewest weight elements for which the kernel is used (SmolLM2's 576 x 576 projections and up; below, the call's
own ~10 µs outweighs what it saves)."""

_P, _I = ctypes.c_void_p, ctypes.c_int64


class SmallLinear:
    """The kernel's two entry points (float32, float64), the routing (`min_rows` to `max_rows` input rows, weights of
    at least `min_weight` elements; `MIN_ROWS`, `MAX_ROWS` and `MIN_WEIGHT` unless a benchmark changes them) and a
    count of the products it ran."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._entry = {}
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            fn = getattr(library, f"fastrl_small_linear_{suffix}")
            fn.argtypes, fn.restype = [_P, _I, _I, _P, _P, _I, _I, _P, _I], None
            self._entry[dtype] = fn
        self.min_rows, self.max_rows, self.min_weight = MIN_ROWS, MAX_ROWS, MIN_WEIGHT
        self.calls = 0

    def applies(self, x: Tensor, weight: Tensor) -> bool:
        """True when `x @ weight.T` goes to the kernel (see the module docstring)."""
        if weight.numel() < self.min_weight or x.device.type != "cpu" or weight.device.type != "cpu":
            return False
        if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:  # PyTorch's product names the error
            return False
        rows = x.numel() // max(1, x.shape[-1])
        if not self.min_rows <= rows <= self.max_rows or x.dtype != weight.dtype or x.dtype not in self._entry:
            return False
        if torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad):
            return False
        return weight.is_contiguous() and torch.get_num_threads() == 1

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """`F.linear(x, weight, bias)` by the kernel (`applies` must hold).  # x [..., K], weight [N, K] -> [..., N]"""
        n, k = weight.shape
        if bias is not None and (bias.dtype != weight.dtype or bias.shape != (n,) or not bias.is_contiguous()):
            return F.linear(x, weight, bias)
        rows = x.reshape(-1, k)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], n, dtype=x.dtype)
        self._entry[x.dtype](
            rows.data_ptr(),
            rows.stride(0),
            rows.shape[0],
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            n,
            k,
            out.data_ptr(),
            out.stride(0),
        )
        self.calls += 1
        return out.view(*x.shape[:-1], n)


@functools.cache
def small_linear() -> SmallLinear | None:
    """The kernel's runner, built on first use; None where it cannot be built (a warning says why)."""
    library = load_kernel("small_linear")
    return None if library is None else SmallLinear(library)


def small_linear_routing() -> tuple[int, int, int] | None:
    """What decides which products the kernel runs (rows from, rows to, fewest weight elements); None without the
    kernel. Round costs measured under one routing (the calibration cache) do not hold under another."""
    kernel = small_linear()
    return None if kernel is None else (kernel.min_rows, kernel.max_rows, kernel.min_weight)


class Linear(nn.Linear):
    """`nn.Linear` whose forwards over a few rows of a large weight on a CPU run the small-row kernel (see the module
    docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        """# [..., in] -> [..., out]"""
        weight = self.weight
        if x.device.type == "cpu":  # only then is the kernel built (a GPU run compiles nothing)
            kernel = small_linear()
            if kernel is not None and kernel.applies(x, weight):
                return kernel(x, weight, self.bias)
        return F.linear(x, weight, self.bias)
