"""One drafter forward over a paged cache on a CPU: PyTorch's ops against fastrl's drafter-step kernel, per batch
and new entries per row (the bundled model's shipped drafter).

    python -m fastrl.bench.drafter_step            # one thread; prints µs per forward and PyTorch / kernel

Both run `EagleDrafter.forward` on the same inputs, cache and page table (shuffled pages, ragged rows of 100-300
keys, a chain mask over each row's new entries): the PyTorch side with the kernel's `prepare` declining every forward,
the kernel side with it taking every forward the attention kernel has an instance for (past `MAX_ROWS` too, to show
where the routing draws its line); the last column is what the engine's routing does. Times are medians of
alternated blocks of calls.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from fastrl.bench.cli_args import at_least
from fastrl.commands.engine_setup import resolve_drafter, resolve_model_dir
from fastrl.models.attention import AttentionMetadata
from fastrl.models.checkpoint import load_model
from fastrl.models.cpu_attention import PagedCpuAttention
from fastrl.models.kv_cache import PageTable
from fastrl.models.masks import attention_mask
from fastrl.speculative.cpu_drafter_step import CpuDrafterStep, cpu_drafter_step

CASES = [(1, 1), (1, 4), (1, 13), (4, 1), (16, 1), (8, 4), (32, 1), (48, 1), (64, 1), (64, 4), (256, 1)]  # rows, new


def time_case(rows: int, queries: int, repeats: int) -> tuple[float, float, float, bool]:
    """(PyTorch µs, kernel µs, max |difference|, whether the engine's routing gives the kernel this forward) of one
    drafter forward; the kernel column runs it wherever it can, past `MAX_ROWS` too."""
    model_dir = resolve_model_dir("")
    policy = load_model(model_dir).eval()
    drafter = resolve_drafter("", model_dir, policy, needed=True)
    generator = torch.Generator().manual_seed(rows * 100 + queries)
    lengths = torch.randint(100, 300, (rows,), generator=generator)
    width, page_size = int(lengths.max()) + queries + 1, 16
    columns = math.ceil(width / page_size)
    table = PageTable(rows, width, page_size, num_pages=rows * columns, scratch_len=page_size)
    pages = torch.randperm(rows * columns, generator=generator)
    table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.tolist())
    cache = drafter.new_cache(rows, width, torch.float32, "cpu", table, PagedCpuAttention.load())
    cache.k.normal_(generator=generator), cache.v.normal_(generator=generator)
    tokens = torch.randint(3, drafter.config.vocab_size, (rows, queries), generator=generator)
    features = torch.randn(rows, queries, drafter.feature_size, generator=generator)
    index = lengths.unsqueeze(1) + torch.arange(queries)
    keys = torch.arange(width)
    mask = (keys >= 1) & (keys <= index.unsqueeze(-1))
    slots = torch.arange(rows)
    step = cpu_drafter_step()
    if step is None:
        raise SystemExit("the drafter-step kernel cannot be built on this machine (see the warning above)")

    def anywhere(drafter, policy, cache, meta) -> AttentionMetadata | None:  # the kernel past MAX_ROWS too
        plan = meta.kernel or cache.backend.kernel_plan(cache, meta)
        return None if plan is None else replace(meta, kernel=plan)

    def run(kernel: bool) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            step.prepare = anywhere if kernel else (lambda *args: None)
            return drafter(policy, tokens, features, index, cache, slots, index, mask)

        return call

    calls = [run(False), run(True)]
    times: list[list[float]] = [[], []]
    with torch.no_grad():
        meta = cache.metadata(slots, index, attention_mask(index, index, mask))
        took = CpuDrafterStep.prepare(step, drafter, policy, cache, meta) is not None
        outputs = [call() for call in calls]
        block = max(3, 600 // (rows * queries))
        for _ in range(repeats):
            for call, acc in zip(calls, times, strict=True):
                start = time.perf_counter()
                for _ in range(block):
                    call()
                acc.append((time.perf_counter() - start) / block)
    del step.prepare  # back to the class's
    diff = (outputs[0] - outputs[1]).abs().max().item()
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6, diff, took


def main(argv: list[str] | None = None) -> None:
    """Print the table (one thread)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--repeats", type=at_least(1), default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("rows  new  PyTorch µs  kernel µs  PyTorch/kernel  max|diff|  kernel took it")
    for rows, queries in CASES:
        torch_us, kernel_us, diff, took = time_case(rows, queries, args.repeats)
        print(
            f"{rows:4} {queries:4} {torch_us:11.0f} {kernel_us:10.0f} {torch_us / kernel_us:15.2f}"
            f"  {diff:9.1e}  {took}",
            flush=True,
        )


if __name__ == "__main__":
    main()
