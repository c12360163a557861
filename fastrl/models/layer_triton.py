"""A decoder layer's elementwise work in Triton, one launch where PyTorch's eager ops take several.

Three kernel bodies, undecorated: `fastrl.models.layer_kernels.LayerKernels` wraps them with `triton.jit` when it is
built (importing this module compiles nothing, and `TRITON_INTERPRET=1` set before then interprets them).

Each computes what the eager code of `fastrl.models.layers` computes, rounding where it rounds: a value the eager
code keeps in the input dtype between two ops is rounded to that dtype here too (products of two half-precision
values are exact in float32, so `rope` and `silu_mul`'s product and the residual add are bitwise the eager ops');
only the norm's sum of squares (a different summation order) and the exponential (Triton's, not CUDA's `expf`) can
differ, in the last bit of float32, before the rounding to the output dtype. Everything is per row or per element:
a row's result never depends on the other rows of the batch (what keeps a speculative round equal to plain
decoding).
"""

from __future__ import annotations

import triton.language as tl


def rms_norm(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """# x [R,N] (res [R,N]), w [N] -> out [R,N] (sum [R,N] = x + res, rounded to x's dtype, normalised instead)

    out = w * (s * rsqrt(mean(s^2) + eps)) with the statistics in float32, the normalised value rounded to the
    input dtype before the scale (`layers.RMSNorm`'s numerics); one program per row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=live, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * n_cols + cols, mask=live, other=0.0)
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=live)
    xf = x.to(tl.float32)
    mean = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * (1.0 / tl.sqrt(mean + eps))).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=live, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=live)


def rope(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    heads,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
):
    """# x [T,heads,2*HALF], cos/sin [T,2*HALF] -> out [T,heads,2*HALF]

    Each head's pairs (i, i + HALF) rotated by the token's angle: out = x * cos + cat(-x2, x1) * sin, each product
    and the sum rounded to x's dtype as the eager ops round them; one program per token, all its heads at once."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF_BLOCK)
    h = tl.arange(0, HEADS)
    dim_live = d < HALF
    live = (h[:, None] < heads) & dim_live[None, :]
    table = t * 2 * HALF
    c1 = tl.load(cos_ptr + table + d, mask=dim_live, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + table + HALF + d, mask=dim_live, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + table + d, mask=dim_live, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + table + HALF + d, mask=dim_live, other=0.0).to(tl.float32)[None, :]
    at = t * heads * 2 * HALF + h[:, None] * 2 * HALF + d[None, :]
    x1 = tl.load(x_ptr + at, mask=live, other=0.0)
    x2 = tl.load(x_ptr + at + HALF, mask=live, other=0.0)
    dt = x1.dtype
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = ((a1 * c1).to(dt).to(tl.float32) + (-a2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((a2 * c2).to(dt).to(tl.float32) + (a1 * s2).to(dt).to(tl.float32)).to(dt)
    tl.store(out_ptr + at, o1, mask=live)
    tl.store(out_ptr + at + HALF, o2, mask=live)


def silu_mul(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """# gate [n], up [n] -> out [n] = silu(gate) * up, silu rounded to the dtype first (as `F.silu` returns it)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    g = tl.load(gate_ptr + i, mask=live, other=0.0)
    u = tl.load(up_ptr + i, mask=live, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    tl.store(out_ptr + i, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=live)
