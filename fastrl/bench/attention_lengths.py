"""Where a plain decode round's attention could get cheaper on a CPU: two microbenchmarks of
`scaled_dot_product_attention` at one query per row (the bundled model's heads: 6 over 2 KV heads, head dim 32).

`layout`: keys read as the pool's view (`[B, L, kvh, hd]` storage seen as `[B, kvh, L, hd]`, what a home-page round
attends over) against contiguous `[B, kvh, L, hd]` keys, and the copy that would make them so.

`lengths`: every row over the batch's longest length (masked, as the engine does) against rows sorted by length in G
groups, each over its own longest (keys gathered per group), on the lengths of the `host_time.py throughput`
benchmark and on a long-tailed batch. CPU seconds of this process, medians of repeats:

    python fastrl/bench/attention_lengths.py
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 32


def cpu_us(fn: Callable[[], object], repeats: int = 15) -> float:
    """Median CPU microseconds of `fn` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e6


def layout(batch: int = 256, length: int = 100, width: int = 208) -> dict[str, float]:
    """SDPA on the pool's view vs contiguous keys, and the copy between them (µs)."""
    store_k = torch.randn(batch, width, KV_HEADS, HEAD_DIM)
    store_v = torch.randn(batch, width, KV_HEADS, HEAD_DIM)
    k, v = store_k[:, :length].transpose(1, 2), store_v[:, :length].transpose(1, 2)  # [B,kvh,L,hd] views
    kc, vc = k.contiguous(), v.contiguous()
    q = torch.randn(batch, HEADS, 1, HEAD_DIM)
    mask = (torch.arange(length) < torch.randint(length // 2, length + 1, (batch, 1))).view(batch, 1, 1, length)
    return {
        "view": cpu_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)),
        "contiguous": cpu_us(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)),
        "copy to contiguous": cpu_us(lambda: (k.contiguous(), v.contiguous())),
    }


def grouped_vs_padded(lengths: list[int], groups: int) -> tuple[float, float]:
    """(padded µs, grouped µs) of one layer's attention for rows of these lengths.  # B rows, one query each"""
    batch, longest = len(lengths), max(lengths)
    q = torch.randn(batch, HEADS, 1, HEAD_DIM)
    k, v = torch.randn(batch, KV_HEADS, longest, HEAD_DIM), torch.randn(batch, KV_HEADS, longest, HEAD_DIM)
    mask = (torch.arange(longest) < torch.tensor(lengths).unsqueeze(1)).view(batch, 1, 1, longest)
    order = sorted(range(batch), key=lengths.__getitem__)
    size = batch // groups
    parts = []
    for g in range(groups):
        rows = order[g * size : (g + 1) * size] if g < groups - 1 else order[g * size :]
        own = max(lengths[r] for r in rows)
        index = torch.tensor(rows)
        parts.append((index, own, mask[index][..., :own]))

    def padded() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def grouped() -> torch.Tensor:
        out = torch.empty_like(q)
        for index, own, part_mask in parts:
            keys, values = k[index, :, :own], v[index, :, :own]  # the gather a grouped round would do
            out[index] = F.scaled_dot_product_attention(q[index], keys, values, attn_mask=part_mask, enable_gqa=True)
        return out

    if not torch.allclose(padded(), grouped(), atol=1e-5):
        raise AssertionError("grouped attention differs from padded attention")
    return cpu_us(padded), cpu_us(grouped)


def main(argv: list[str] | None = None) -> None:
    """Print the layout and grouped-attention timings (one thread)."""
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help, and no arguments
    torch.set_num_threads(1)
    for name, us in layout().items():
        print(f"layout, batch 256, 100 keys: {name} {us:.0f} us", flush=True)
    rng = random.Random(0)
    workloads = {
        "throughput benchmark (prompts 20-60 + 32 tokens)": [rng.randint(20, 60) + 32 for _ in range(256)],
        "long tail (Pareto lengths 16-1000)": [min(1000, int(16 * rng.paretovariate(1.0))) for _ in range(256)],
    }
    for name, lengths in workloads.items():
        for groups in (4, 8):
            padded, grouped = grouped_vs_padded(lengths, groups)
            print(
                f"{name}: max {max(lengths)}, mean {sum(lengths) / len(lengths):.0f}; padded {padded:.0f} us, "
                f"{groups} groups {grouped:.0f} us, padded / grouped {padded / grouped:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
