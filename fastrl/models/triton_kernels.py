"""Paged attention in Triton: each program reads one row's pages in place, over the row's own keys.

Two kernel bodies, undecorated: `fastrl.models.gpu_attention.PagedTritonAttention` wraps them with `triton.jit` when
it is built (so importing this module compiles nothing, and `TRITON_INTERPRET=1` set before then interprets them).

`paged_attention` runs one program per (row, kv head, query tile, key split). A query tile packs the GROUP query
heads that share the kv head with up to BLOCK_M // GROUP of the row's new tokens, as the rows of one matrix, so each
key block is loaded once for all of them and both products are tensor-core matmuls. The program walks the row's
keys [0, extent) in blocks of BLOCK_N (1 + the last key any of the row's queries may attend: nothing past it is
read), each key found through the row's page table (entry = page * PAGE_SIZE + offset), masks scores with the
forward's bool mask (causal, or prefix + tree ancestors) and keeps an online softmax in float32. With SPLITS > 1
(flash-decoding: few rows, long keys) each program takes one of SPLITS equal shares of the row's keys and writes
its unnormalised output and its (max, sum) to scratch, which `combine_splits` merges. Inputs are float16, bfloat16,
float32 (products in IEEE float32, not TF32) or float64; everything after the products is float32, float64 for
float64 inputs.
"""

from __future__ import annotations

import triton.language as tl


def paged_attention(
    q_ptr,
    k_ptr,
    v_ptr,
    pages_ptr,
    mask_ptr,
    extents_ptr,
    blocks_ptr,
    out_ptr,
    part_ptr,
    stats_ptr,
    num_queries,
    q_stride_b,
    q_stride_h,
    q_stride_s,
    o_stride_b,
    o_stride_h,
    o_stride_s,
    pages_stride,
    mask_stride_b,
    mask_stride_s,
    blocks_stride,
    entry_stride,
    SCALE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SPLITS: tl.constexpr,
    ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """# q [B,h,S,hd], k/v cache [E,kvh,hd], pages [B,C], mask [B,1,S,L] uint8, extents [B], blocks [B,L/BLOCK_N]
    uint8 -> out [B,h,S,hd] (SPLITS > 1: part [B,S,h,SPLITS,DIM_BLOCK], stats [B,S,h,SPLITS,2] instead).

    A block of keys no query of the row may attend (blocks[b, i] == 0: the gap between a row's prefix and a drafter
    step's tree area at the end of the context) is skipped. SCALE (1/sqrt(hd)) is a compile-time constant, so it
    multiplies the scores in their own precision. Scores, softmax and sums in ACC (float32; float64 for float64
    inputs); PRECISION: the products' input precision ("ieee" for float32/64)."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2) // SPLITS
    split = tl.program_id(2) % SPLITS
    m = tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + m % GROUP
    query = tile * (BLOCK_M // GROUP) + m // GROUP
    live = (m < (BLOCK_M // GROUP) * GROUP) & (query < num_queries)  # [BLOCK_M]
    d = tl.arange(0, DIM_BLOCK)
    in_dim = d < HEAD_DIM
    row64 = row.to(tl.int64)
    q = tl.load(
        q_ptr + row64 * q_stride_b + head[:, None] * q_stride_h + query[:, None] * q_stride_s + d[None, :],
        mask=live[:, None] & in_dim[None, :],
        other=0.0,
    )
    extent = tl.load(extents_ptr + row).to(tl.int32)
    share = tl.cdiv(tl.cdiv(extent, SPLITS), BLOCK_N) * BLOCK_N
    start = split * share
    stop = tl.minimum(extent, start + share)
    best = tl.full([BLOCK_M], float("-inf"), ACC)
    total = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, DIM_BLOCK], ACC)
    mask_row = mask_ptr + row64 * mask_stride_b + query[:, None] * mask_stride_s
    blocks_row = blocks_ptr + row64 * blocks_stride
    for first in range(start, stop, BLOCK_N):
        if tl.load(blocks_row + first // BLOCK_N) != 0:
            key = first + tl.arange(0, BLOCK_N)
            inside = key < stop
            page = tl.load(pages_ptr + row64 * pages_stride + key // PAGE_SIZE, mask=inside, other=0).to(tl.int64)
            offset = (page * PAGE_SIZE + key % PAGE_SIZE)[:, None] * entry_stride + kv_head * HEAD_DIM + d[None, :]
            k = tl.load(k_ptr + offset, mask=inside[:, None] & in_dim[None, :], other=0.0)
            v = tl.load(v_ptr + offset, mask=inside[:, None] & in_dim[None, :], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC) * SCALE  # [BLOCK_M, BLOCK_N]
            allowed = tl.load(mask_row + key[None, :], mask=live[:, None] & inside[None, :], other=0)
            scores = tl.where(allowed != 0, scores, float("-inf"))
            top = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(top == float("-inf"), 0.0, top)  # nothing seen yet: no NaN from -inf - -inf
            p = tl.exp(scores - shift[:, None])
            decay = tl.exp(best - shift)
            total = total * decay + tl.sum(p, 1)
            # A key a query may not see must add nothing, but in the product 0 * NaN is NaN: values that are not
            # finite enter as 0, and a query that may see one is made NaN (as the product would make it)
            finite = (v == v) & (tl.abs(v) < float("inf"))  # [BLOCK_N, DIM_BLOCK]
            bad = tl.max(tl.where(finite, 0, 1), 1)  # [BLOCK_N]: key with a value that is not finite
            seen_bad = tl.max(tl.where((allowed != 0) & (bad[None, :] != 0), 1, 0), 1)  # [BLOCK_M]
            v = tl.where(finite, v, 0.0)
            acc = acc * decay[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION, out_dtype=ACC)
            acc = tl.where(seen_bad[:, None] != 0, float("nan"), acc)
            best = top
    if SPLITS == 1:
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        o_ptr = out_ptr + row64 * o_stride_b + head[:, None] * o_stride_h + query[:, None] * o_stride_s + d[None, :]
        tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=live[:, None] & in_dim[None, :])
    else:
        slot = ((row64 * num_queries + query) * (GROUP * tl.num_programs(1)) + head) * SPLITS + split  # [BLOCK_M]
        tl.store(part_ptr + slot[:, None] * DIM_BLOCK + d[None, :], acc, mask=live[:, None])
        tl.store(stats_ptr + slot * 2, best, mask=live)
        tl.store(stats_ptr + slot * 2 + 1, total, mask=live)


def combine_splits(
    part_ptr,
    stats_ptr,
    out_ptr,
    num_rows,
    heads,
    num_queries,
    o_stride_b,
    o_stride_h,
    o_stride_s,
    HEAD_DIM: tl.constexpr,
    DIM_BLOCK: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Merges the splits' outputs of BLOCK_R (row, query, head) triples per program: each split's sum and output
    scaled by exp(its max - the overall max).  # part [R,SPLITS,DIM_BLOCK], stats [R,SPLITS,2] -> out [B,h,S,hd]"""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < num_rows
    r64 = r.to(tl.int64)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, DIM_BLOCK)
    stats = stats_ptr + (r64[:, None] * SPLITS + s[None, :]) * 2
    best = tl.load(stats, mask=live[:, None], other=float("-inf"))  # [BLOCK_R, SPLITS]
    total = tl.load(stats + 1, mask=live[:, None], other=0.0)
    top = tl.max(best, 1)
    weight = tl.exp(best - tl.where(top == float("-inf"), 0.0, top)[:, None])  # [BLOCK_R, SPLITS]
    norm = tl.sum(weight * total, 1)
    parts = tl.load(
        part_ptr + (r64[:, None, None] * SPLITS + s[None, :, None]) * DIM_BLOCK + d[None, None, :],
        mask=live[:, None, None],
        other=0.0,
    )  # [BLOCK_R, SPLITS, DIM_BLOCK]
    out = tl.sum(parts * weight[:, :, None], 1) / tl.where(norm > 0, norm, 1.0)[:, None]
    head = r64 % heads
    query = (r64 // heads) % num_queries
    row = r64 // (heads * num_queries)
    o_ptr = out_ptr + row[:, None] * o_stride_b + head[:, None] * o_stride_h + query[:, None] * o_stride_s + d[None, :]
    tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=live[:, None] & (d < HEAD_DIM)[None, :])
