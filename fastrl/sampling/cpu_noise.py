"""The sampler's uniform bits on a CPU in one C++ pass (`fastrl/models/kernels/uniform_bits.cpp`).

`noise.uniform_bits` computes every (row, vocab index) hash in PyTorch's element-wise ops: ~100 dispatches a call
(the rows' keys, then the words over [rows, vocab]), most of a decode round's host time at batch 1 on a CPU. The
kernel computes the same 32-bit arithmetic in one pass; its bits equal PyTorch's (tests/sampling/test_cpu_noise.py,
and the pure-Python reference of tests/sampling/test_gumbel_noise.py). Built at first use like fastrl's other CPU
kernels; where it cannot be built, PyTorch's path runs (a warning says why, once).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from fastrl.models.kernel_build import load_kernel

_P, _I, _U = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32


class UniformBitsKernel:
    """The kernel's entry point and a count of its calls."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.fastrl_uniform_bits
        self._fn.argtypes, self._fn.restype = [_P, _P, _I, _I, _U, _U, _P], None
        self.calls = 0

    def __call__(self, seeds: Tensor, positions: Tensor, vocab_size: int, salts: tuple[int, int]) -> Tensor:
        """The uniforms' 24-bit integers of every (row, index), as `noise.uniform_bits` gives them; `salts` are the
        two lanes' starting salts for the stream.  # seeds, positions [N] int64 on the CPU -> [N, V] int32"""
        seeds, positions = seeds.contiguous(), positions.contiguous()
        out = torch.empty(seeds.shape[0], vocab_size, dtype=torch.int32)
        self._fn(seeds.data_ptr(), positions.data_ptr(), seeds.shape[0], vocab_size, *salts, out.data_ptr())
        self.calls += 1
        return out


@functools.cache
def uniform_bits_kernel() -> UniformBitsKernel | None:
    """The kernel, built on first use; None where it cannot be built (a warning says why)."""
    library = load_kernel("uniform_bits")
    return None if library is None else UniformBitsKernel(library)
