"""The exact Gumbel-argmax that computes the Gumbel values of only the entries that can win.

``argmax(x + gumbel_from_bits(bits))`` takes two float64 logs per entry. A Gumbel value is a monotone
non-decreasing function of its entry's 24-bit uniform integer, so the value at the largest integer of the entry's
bucket (its top `BOUND_BITS` bits), read from a small table, bounds it from above. Per row:

    bound    ub_i = x_i + table[bits_i >> (24 - BOUND_BITS)]    >= x_i + g_i   (rounding is monotone)
    anchor   t = x_j + g_j at j = argmax(ub), computed exactly   <= max_i (x_i + g_i)
    winners  an entry with ub_i < t has x_i + g_i < t, so it is not the argmax; the others (one or two as a rule)
             get their exact value, and the first of those equal to their maximum is torch.argmax's answer (a row
             with a NaN has the first NaN as anchor and t = NaN: no candidate, and the anchor is the answer).

The token is bit for bit the one of the full computation (`tests/sampling/test_gumbel_argmax.py`: the table's
bound on all 2**24 integers, and the two argmaxes on adversarial rows). It pays on wide rows: on this project's
2-core CPU (one thread, bits to token, full / lazy CPU time) 1.62x at 256 x 4096, 1.98x at 64 x 32000, 1.70x at
16 x 49152, but 0.65x at 256 x 91 (its fixed ops cost more than the logs saved), so `sample` uses it from
`LAZY_MIN_VOCAB` entries up. The candidates' number depends on the data, so it runs on CPU
tensors only (no host synchronisation, no shape that changes under a CUDA graph elsewhere).
"""

from __future__ import annotations

import functools

import torch

from fastrl.sampling.noise import UNIFORM_BITS, gumbel_from_bits

BOUND_BITS = 12  # 4096 float32 bounds (16 KB), indexed by the top bits of an entry's 24-bit uniform integer
LAZY_MIN_VOCAB = 4096  # narrower rows are cheaper in full


@functools.lru_cache(maxsize=1)
def gumbel_bound_table() -> torch.Tensor:
    """table[k] >= the Gumbel value of every 24-bit integer whose top BOUND_BITS bits are k (CPU, read only).

    # -> [2**BOUND_BITS] float32: the value at the bucket's largest integer, one float32 ulp up as a margin
    """
    top = (torch.arange(1, 2**BOUND_BITS + 1, dtype=torch.int32) << (UNIFORM_BITS - BOUND_BITS)) - 1
    values = gumbel_from_bits(top)
    return torch.nextafter(values, torch.full_like(values, float("inf")))


def gumbel_argmax(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``argmax(x + gumbel_from_bits(bits), dim=-1)``, exactly, computing the Gumbel values of the entries that
    can reach each row's maximum only.

    Args:
        x: [N, V] float32 or float64 CPU tensor (processed logits; -inf, inf and NaN allowed).
        bits: [N, V] int32 uniform integers from :func:`fastrl.sampling.noise.uniform_bits`.
    """
    # [N,V] float, [N,V] int32 -> [N] int64
    if x.dim() != 2 or x.shape != bits.shape or x.device.type != "cpu" or bits.device.type != "cpu":
        raise ValueError(
            f"gumbel_argmax takes [N, V] CPU tensors of one shape, got x {tuple(x.shape)} on {x.device} and bits "
            f"{tuple(bits.shape)} on {bits.device}"
        )
    bucket = (bits >> (UNIFORM_BITS - BOUND_BITS)).view(-1)
    ub = x + gumbel_bound_table().index_select(0, bucket).view(bits.shape)  # [N,V], in the dtype of x + g
    anchor = ub.argmax(dim=-1, keepdim=True)  # [N,1]
    t = x.gather(1, anchor) + gumbel_from_bits(bits.gather(1, anchor))  # [N,1] exact value of the anchor
    # A row with a NaN has its first NaN as anchor (argmax's rule, for ub as for x + g) and t = NaN: no candidate,
    # and the anchor is the answer.
    rows, cols = torch.ge(ub, t).nonzero(as_tuple=True)  # [C] candidates, row-major (rows ascending)
    exact = x[rows, cols] + gumbel_from_bits(bits[rows, cols])  # [C]
    row_max = torch.empty(x.shape[0], dtype=exact.dtype).scatter_reduce_(0, rows, exact, "amax", include_self=False)
    first_winner = torch.where(exact == row_max[rows], cols, x.shape[1])  # [C] col of a winner, else V
    return anchor.squeeze(1).scatter_reduce_(0, rows, first_winner, "amin", include_self=False)
