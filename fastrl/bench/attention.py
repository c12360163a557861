"""One layer's attention over a paged cache: PyTorch's (`PagedSdpa`) against fastrl's kernel (`PagedCpuAttention`
on a CPU, `PagedTritonAttention` on a GPU), per shape, batch, new tokens per row and row lengths (equal or long-tail).

    python -m fastrl.bench.attention                                   # CPU, one thread, float32
    python -m fastrl.bench.attention --device cuda --json OUT.json     # GPU, bfloat16, its own cases

Both backends read the same pages of one cache (a shuffled page table, so PyTorch gathers; the kernel follows the
table) under a chain mask over each row's new tokens. Times are medians of alternated calls (on a GPU, each call
between two synchronisations).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable

import torch

from fastrl.bench.cli_args import at_least, new_file
from fastrl.models.attention import AttentionBackend, PagedSdpa
from fastrl.models.backends import attention_backend
from fastrl.models.kv_cache import KVCache, PageTable
from fastrl.models.masks import attention_mask

SHAPES = {"bundled": (6, 2, 32), "smollm2": (9, 3, 64)}  # heads, kv heads, head size
CASES = [  # rows, new tokens per row, row lengths
    (1, 1, "equal-850"),
    (64, 1, "equal-100"),
    (256, 1, "equal-100"),
    (64, 1, "long-tail"),
    (64, 4, "long-tail"),
    (64, 4, "equal-100"),
    (64, 13, "long-tail"),
    (16, 13, "equal-300"),
]
GPU_CASES = [  # the long tail of RL: few rows over long rows, and large batches
    (1, 1, "equal-4096"),
    (1, 1, "equal-32768"),
    (1, 6, "equal-4096"),
    (1, 32, "equal-4096"),
    (8, 1, "equal-4096"),
    (64, 1, "equal-2048"),
    (256, 1, "equal-1024"),
    (256, 1, "long-tail"),
    (256, 6, "long-tail"),
    (64, 32, "long-tail"),
]


def row_lengths(kind: str, rows: int, rng: random.Random) -> list[int]:
    """`equal-N`: N tokens each; `long-tail`: 14-206 prompt tokens plus a Pareto response of up to 600."""
    if kind.startswith("equal-"):
        return [int(kind.split("-")[1])] * rows
    return [rng.randint(14, 206) + int(min(600, 16 * rng.paretovariate(1.2))) for _ in range(rows)]


def time_case(
    shape: str, rows: int, queries: int, kind: str, kernel: AttentionBackend, repeats: int, device: str, dtype
) -> tuple:
    """(PyTorch ms, kernel ms, max |difference|) of one layer's attention.  # one forward's worth"""
    heads, kv_heads, dim = SHAPES[shape]
    rng = random.Random(0)
    lengths = row_lengths(kind, rows, rng)
    width, page_size = max(lengths) + queries, 16
    columns = math.ceil(width / page_size)
    table = PageTable(rows, width, page_size, rows * columns, page_size, device)
    pages = torch.randperm(rows * columns).view(rows, columns)
    table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.view(-1).tolist())
    caches = [KVCache(1, rows, width, kv_heads, dim, dtype, device, table, b) for b in (PagedSdpa(), kernel)]
    caches[1].k, caches[1].v = caches[0].k.normal_(), caches[0].v.normal_()  # one pool, two readers
    index = torch.tensor([[n + i for i in range(queries)] for n in lengths], device=device)
    mask = attention_mask(index, index)
    q = torch.randn(rows, queries, heads, dim, dtype=dtype, device=device).transpose(1, 2)
    k, v = (torch.randn(rows, kv_heads, queries, dim, dtype=dtype, device=device) for _ in range(2))
    calls: list[Callable[[], torch.Tensor]] = []
    for cache in caches:
        meta = cache.metadata(torch.arange(rows, device=device), index, mask)
        calls.append(lambda cache=cache, meta=meta: cache.attend(0, q, k, v, meta, heads != kv_heads))
    diff = (calls[0]().float() - calls[1]().float()).abs().max().item()
    times: list[list[float]] = [[], []]
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    for _ in range(repeats):
        for call, acc in zip(calls, times, strict=True):
            sync()
            start = time.perf_counter()
            call()
            sync()
            acc.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3, diff


def main(argv: list[str] | None = None) -> None:
    """Print the table (on a CPU, one thread); `--json` also writes it."""
    from fastrl.engine.machine import check_device

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--repeats", type=at_least(1), default=30)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", type=new_file, default=None, help="write the rows here (a new file)")
    args = parser.parse_args(argv)
    try:
        check_device("--device", args.device)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(1)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    shapes = list(SHAPES.values())
    kernel = attention_backend(torch.device(args.device), dtype, shapes, 16)
    if kernel is None:
        raise SystemExit(f"fastrl's attention kernel does not run on this {args.device} (see the warning above)")
    print("shape     rows  new  lengths      PyTorch ms  kernel ms  PyTorch/kernel  max|diff|")
    rows_out = []
    for shape in SHAPES:
        for rows, queries, kind in CASES if args.device == "cpu" else GPU_CASES:
            torch_ms, kernel_ms, diff = time_case(shape, rows, queries, kind, kernel, args.repeats, args.device, dtype)
            print(
                f"{shape:8} {rows:5} {queries:4}  {kind:11} {torch_ms:10.3f} {kernel_ms:10.3f} "
                f"{torch_ms / kernel_ms:15.2f}  {diff:.1e}",
                flush=True,
            )
            rows_out.append(
                dict(
                    shape=shape,
                    rows=rows,
                    new_tokens=queries,
                    lengths=kind,
                    pytorch_ms=torch_ms,
                    kernel_ms=kernel_ms,
                    max_abs_diff=diff,
                )
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "dtype": str(dtype), "cases": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
