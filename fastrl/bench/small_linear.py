"""Linear products over a few rows on a CPU: PyTorch's against fastrl's small-row kernel, per weight shape and row
count, and plain decoding of a named model with the kernel's routing on and off, alternated in one process.

    python -m fastrl.bench.small_linear                           # products at SmolLM2-135M's shapes
    python -m fastrl.bench.small_linear --decode smollm2 --batch-sizes 1,4,8

One thread. Product times are medians of alternated blocks of calls; a row marked `*` is one the routing gives the
kernel (`fastrl.models.cpu_linear`). Decoding: greedy, EOS ignored, CPU seconds of `Engine.generate` (prefill
included), the two sides alternated within each repeat; the tokens must agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from fastrl.bench.cli_args import at_least, int_list
from fastrl.models.cpu_linear import small_linear

SHAPES = [(49152, 576), (8192, 576), (1536, 576), (576, 1536), (576, 576), (192, 576)]
"""(out, in): SmolLM2-135M's LM head, its drafter's 8,192-token head, MLP up/gate and down, q/o and k/v."""
ROWS = [1, 2, 3, 4, 8, 13, 15, 16]

PROMPT_LEN = 24  # tokens of each decoding prompt


def _median_ms(fn: Callable[[], object], calls: int, blocks: int) -> float:
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def bench_products(blocks: int) -> None:
    """Print ms per product, PyTorch and the kernel, for every shape and row count."""
    kernel = small_linear()
    if kernel is None:
        raise SystemExit("the small-row kernel could not be built here (no C++ compiler?)")
    print("out x in        rows  PyTorch ms  kernel ms  PyTorch/kernel")
    for out, width in SHAPES:
        weight = torch.randn(out, width)
        calls = max(1, int(2e6 // weight.numel()))
        for rows in ROWS:
            x = torch.randn(rows, width)
            with torch.no_grad():
                torch.testing.assert_close(kernel(x, weight, None), F.linear(x, weight), rtol=1e-4, atol=1e-3)
                pytorch = _median_ms(lambda x=x, weight=weight: F.linear(x, weight), calls, blocks)
                mine = _median_ms(lambda x=x, weight=weight: kernel(x, weight, None), calls, blocks)
                routed = "*" if kernel.applies(x, weight) else " "
            line = f"{out:6} x {width:5} {rows:5}{routed} {pytorch:10.3f} {mine:10.3f} {pytorch / mine:15.2f}"
            print(line, flush=True)


def bench_decode(
    model_dir: Path, batch_sizes: list[int], new_tokens: int, repeats: int, min_rows: int = 0, min_weight: int = 0
) -> None:
    """Print plain decoding's CPU seconds with the routing on and off, per batch size (`min_rows`, `min_weight`: a
    routing to try instead of the shipped one; 0 keeps the shipped value)."""
    from fastrl.engine.engine import GenerateInput
    from fastrl.models.checkpoint import load_model
    from fastrl.sampling.params import SamplingParams

    policy = load_model(model_dir).eval()
    vocab = policy.config.vocab_size
    rng = torch.Generator().manual_seed(0)
    kernel = small_linear()
    if kernel is None:
        raise SystemExit("the small-row kernel could not be built here (no C++ compiler?)")
    shipped = (kernel.min_rows, kernel.max_rows, kernel.min_weight)
    try:
        kernel.min_rows, kernel.min_weight = min_rows or shipped[0], min_weight or shipped[2]
        for batch in batch_sizes:
            params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
            prompts = [torch.randint(3, vocab, (PROMPT_LEN,), generator=rng).tolist() for _ in range(batch)]
            inputs = [GenerateInput(p, params) for p in prompts]
            seconds, tokens = _alternate(policy, inputs, repeats, kernel, shipped[1])
            if tokens[True] != tokens[False]:
                print(f"batch {batch}: tokens differ with and without the kernel (a near tie in float32)")
            pairs = ", ".join(f"{off / on:.2f}" for on, off in zip(seconds[True], seconds[False], strict=True))
            on_s, off_s = statistics.median(seconds[True]), statistics.median(seconds[False])
            ratio = off_s / on_s
            print(f"batch {batch:3}: kernel {on_s:.2f} s, PyTorch {off_s:.2f} s, PyTorch/kernel {ratio:.2f} ({pairs})")
    finally:
        kernel.min_rows, kernel.max_rows, kernel.min_weight = shipped


def _alternate(policy, inputs: list, repeats: int, kernel, on_rows: int) -> tuple[dict, dict]:
    """CPU seconds of plain decoding of `inputs` (all in one batch) with the kernel's routing on (up to `on_rows`
    rows) and off, alternated `repeats` times; and the tokens of each side."""
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine
    from fastrl.strategy.strategy import DISABLE

    seconds: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list] = {}
    for repeat in range(repeats):
        for on in (True, False) if repeat % 2 == 0 else (False, True):
            kernel.max_rows = on_rows if on else 0  # off: no row count qualifies
            engine = Engine(policy, EngineConfig(max_batch_size=len(inputs)), selector=FixedSelector(DISABLE))
            start = time.process_time()
            tokens[on] = [o.token_ids for o in engine.generate(inputs)]
            seconds[on].append(time.process_time() - start)
    return seconds, tokens


def main(argv: list[str] | None = None) -> None:
    """Print the product table, or with --decode the decoding comparison."""
    from fastrl.commands.engine_setup import check_kv_memory, resolve_model_dir
    from fastrl.models.checkpoint import read_config

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--blocks", type=at_least(1), help="products: blocks of calls timed (default 9)")
    parser.add_argument("--decode", default="", help="a named model or checkpoint directory to decode with")
    parser.add_argument("--batch-sizes", type=int_list(1), help="decode: batch sizes (default 1,4,8)")
    parser.add_argument("--new-tokens", type=at_least(1), help="decode: tokens per request (default 32)")
    parser.add_argument("--repeats", type=at_least(1), help="decode: alternations (default 3)")
    parser.add_argument("--min-rows", type=at_least(0), help="decode: try this routing's fewest rows")
    parser.add_argument("--min-weight", type=at_least(0), help="decode: try this routing's fewest weight elements")
    args = parser.parse_args(argv)
    decode_only = {"batch_sizes": [1, 4, 8], "new_tokens": 32, "repeats": 3, "min_rows": 0, "min_weight": 0}
    given = [name for name in decode_only if getattr(args, name) is not None]
    if given and not args.decode:
        parser.error(f"argument --{given[0].replace('_', '-')}: only --decode uses it; give --decode MODEL too")
    for name, default in decode_only.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.blocks is not None and args.decode:
        parser.error("argument --blocks: only the product table uses it, not --decode; leave one out")
    torch.set_num_threads(1)
    if not args.decode:
        bench_products(args.blocks or 9)
        return
    try:
        model_dir = resolve_model_dir(args.decode, "--decode")
    except (ValueError, ImportError) as err:
        parser.error(str(err))
    config = read_config(model_dir)
    if PROMPT_LEN + args.new_tokens > config.max_position_embeddings:
        parser.error(
            f"argument --new-tokens: {args.new_tokens} after {PROMPT_LEN}-token prompts passes --decode's "
            f"{config.max_position_embeddings} positions (the rows would stop early); give at most "
            f"{config.max_position_embeddings - PROMPT_LEN}"
        )
    try:  # one engine at a time, each slot the model's whole context (EngineConfig's default)
        check_kv_memory("--batch-sizes", config, max(args.batch_sizes), torch.float32, "cpu")
    except ValueError as err:
        parser.error(str(err))
    bench_decode(model_dir, args.batch_sizes, args.new_tokens, args.repeats, args.min_rows, args.min_weight)


if __name__ == "__main__":
    main()
