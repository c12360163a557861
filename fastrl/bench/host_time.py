"""Host time per decode round (CPU time outside the policy's and the drafter's forwards) and plain-decoding
throughput, in CPU seconds of this process (steadier than wall time on a shared machine).

`bench_host_time` is the `fastrl bench suites=[host_time]` suite: for plain rounds and one speculative strategy it
measures the cost of each extra row (the slope between two batch sizes at ~100-token rows) and the cost of a round
at long rows against short ones, all in one run.

Run as a script it uses only the engine's public API, so the same file times another checkout by path; alternate
them to compare two trees side by side:

    PYTHONPATH=/path/to/base python fastrl/bench/host_time.py throughput 1,64,256 64
    PYTHONPATH=$PWD          python fastrl/bench/host_time.py throughput 1,64,256 64

`host` runs the host-time suite itself the same way (`python fastrl/bench/host_time.py host disable,3_1_4`), so
its figures for two trees can be alternated too.

`sampled` is `throughput` at temperature 1 (per-request seeds), on the bundled model or a named one as the fourth
argument: `python fastrl/bench/host_time.py sampled 1,16 32 smollm2`. `gumbel` times the lazy Gumbel-argmax
against the full one, bits to token, on a few shapes (`python fastrl/bench/host_time.py gumbel`).

`round` prints one round's host time per strategy at one batch size (`python fastrl/bench/host_time.py round
disable,3_1_4 1`: the tail's batch).

`view` compares, in one process and pair by pair, rounds that read keys in place (home pages) with the same pool
gathering them: `python fastrl/bench/host_time.py view 64,256 64`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.strategy.strategy import Strategy

MAX_ROUND_BATCH = 1024  # rows `round` times (its engine holds every row's ~450-token context)
CONTEXT, LONGEST_PROMPT = 256, 60  # max_model_len of the engines of `throughput` and `config_ab`; their longest prompt


class ForwardClock:
    """CPU time spent inside the given modules' forwards (outermost call only, so nested modules count once)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.inside = 0.0
        self._depth = 0
        self._entered = 0.0
        self._hooks = []
        for module in modules:
            self._hooks.append(module.register_forward_pre_hook(self._pre))
            self._hooks.append(module.register_forward_hook(self._post))

    def _pre(self, *_: object) -> None:
        if self._depth == 0:
            self._entered = time.process_time()
        self._depth += 1

    def _post(self, *_: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.inside += time.process_time() - self._entered

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


def round_host_time(
    model: CausalLM, drafter: nn.Module | None, strategy: str, batch: int, prompt_len: int, rounds: int = 8
) -> float:
    """CPU seconds of one decode step outside the policy's and drafter's forwards (T=1), median over `rounds`
    steps after two warm-up steps; every row has `prompt_len` prompt tokens."""
    selector = FixedSelector(Strategy.parse(strategy))
    rng = random.Random(0)
    config = EngineConfig(max_batch_size=batch, max_model_len=prompt_len + 8 * (rounds + 4))
    engine = Engine(model, config, drafter=drafter if selector.strategies[0].uses_drafter else None, selector=selector)
    params = SamplingParams(max_new_tokens=4 * (rounds + 4), temperature=1.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(3, model.config.vocab_size) for _ in range(prompt_len)], params)
    engine.step()  # prefill
    engine.step()
    clock = ForwardClock([m for m in (model, model.lm_head, drafter) if m is not None])
    host = []
    try:
        for _ in range(rounds):
            clock.inside = 0.0
            start = time.process_time()
            engine.step()
            host.append(time.process_time() - start - clock.inside)
    finally:
        clock.remove()
    return statistics.median(host)


@dataclass
class HostTimeRow:
    """One strategy's host time per round: us per extra row (batch small -> large at short rows) and the ratio of a
    round at long rows to one at short rows (batch `length_batch`)."""

    strategy: str
    per_row_us: float
    long_vs_short: float
    small_batch_us: float
    large_batch_us: float


def bench_host_time(
    model: CausalLM,
    drafter: nn.Module | None,
    strategies: list[str],
    batches: tuple[int, int] = (64, 256),
    lengths: tuple[int, int] = (100, 850),
    length_batch: int = 16,
) -> list[HostTimeRow]:
    """The host-time suite (see the module docstring): per strategy, interleaved so load drifts hit all alike."""
    rows = []
    for strategy in strategies:
        small, large = (round_host_time(model, drafter, strategy, b, lengths[0]) for b in batches)
        short, long = (round_host_time(model, drafter, strategy, length_batch, n) for n in lengths)
        slope = (large - small) / (batches[1] - batches[0]) * 1e6
        rows.append(HostTimeRow(strategy, slope, long / short, small * 1e6, large * 1e6))
    return rows


def random_prompts(vocab_size: int, batch: int) -> list[list[int]]:
    """The timed engines' prompts: `batch` of 20 to LONGEST_PROMPT random ids in [3, vocab_size), drawn from seed 0."""
    rng = random.Random(0)
    return [[rng.randrange(3, vocab_size) for _ in range(rng.randint(20, LONGEST_PROMPT))] for _ in range(batch)]


def config_ab(model: CausalLM, batch: int, new_tokens: int, pairs: int, first: dict, second: dict) -> list[float]:
    """Paired CPU-time ratios (first / second) of greedy generation by two engines whose `EngineConfig`s differ by
    the keys given (prompts of 20-60 random tokens, EOS ignored, `max_model_len` 256)."""
    prompts = random_prompts(model.config.vocab_size, batch)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engines = [
        Engine(model, EngineConfig(max_batch_size=batch, max_model_len=CONTEXT, **keys)) for keys in (first, second)
    ]

    def run(engine: Engine) -> float:
        start = time.process_time()
        engine.generate([GenerateInput(p, params) for p in prompts])
        return time.process_time() - start

    run(engines[0]), run(engines[1])  # warm-up
    return [run(engines[0]) / run(engines[1]) for _ in range(pairs)]


def home_view_ab(model: CausalLM, batch: int, new_tokens: int, pairs: int) -> list[float]:
    """`config_ab` of PyTorch attention gathering every key (the default pool given as `kv_cache_tokens`: no home
    pages) over the same reading its rows' keys in place (gather / view)."""
    pool = Engine(model, EngineConfig(max_batch_size=batch, max_model_len=CONTEXT)).runner.pool
    sdpa = {"attention_kernel": False}
    gather = {**sdpa, "kv_cache_tokens": pool.num_pages * pool.page_size}
    return config_ab(model, batch, new_tokens, pairs, gather, sdpa)


def throughput(model: CausalLM, batch: int, new_tokens: int, repeats: int = 3, temperature: float = 0.0) -> float:
    """Tokens per CPU second of plain decoding at `batch` (prompts of 20-60 random tokens, EOS ignored; greedy, or
    sampled with per-request seeds at `temperature` > 0), median of repeats."""
    prompts = random_prompts(model.config.vocab_size, batch)
    selector = FixedSelector(Strategy.parse("disable"))
    engine = Engine(model, EngineConfig(max_batch_size=batch, max_model_len=CONTEXT), selector=selector)
    params = [
        SamplingParams(max_new_tokens=new_tokens, temperature=temperature, seed=i, ignore_eos=True)
        for i in range(batch)
    ]
    inputs = [GenerateInput(p, q) for p, q in zip(prompts, params, strict=True)]
    engine.generate(inputs)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.process_time()
        engine.generate(inputs)
        times.append(time.process_time() - start)
    return batch * new_tokens / statistics.median(times)


def lazy_argmax_ab(shapes: list[tuple[int, int]], pairs: int = 21) -> list[tuple[int, int, float, float]]:
    """CPU seconds (median of alternated pairs) of the full Gumbel-argmax and the lazy one, from the uniforms'
    bits to the token, per [rows, vocabulary] shape: (rows, vocab, full, lazy). Needs a tree with
    `sampling/gumbel_argmax.py`."""
    from fastrl.sampling.gumbel_argmax import gumbel_argmax
    from fastrl.sampling.noise import gumbel_from_bits, uniform_bits

    results = []
    for rows, vocab in shapes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(rows, vocab, generator=gen) * 3
        seeds = torch.randint(0, 2**62, (rows,), generator=gen)
        bits = uniform_bits(seeds, torch.randint(0, 1000, (rows,), generator=gen), vocab)
        ways = (lambda x, bits: (x + gumbel_from_bits(bits)).argmax(-1), gumbel_argmax)
        if not torch.equal(ways[0](x, bits), ways[1](x, bits)):
            raise AssertionError(f"lazy and full Gumbel-argmax differ at {rows} x {vocab}")
        full, lazy = [], []
        for _ in range(pairs):
            for way, acc in zip(ways, (full, lazy), strict=True):
                start = time.process_time()
                way(x, bits)
                acc.append(time.process_time() - start)
        results.append((rows, vocab, statistics.median(full), statistics.median(lazy)))
    return results


def parse_arguments(argv: list[str]) -> tuple[argparse.Namespace, Path | None]:
    """The command and its arguments, and the checkpoint directory (None for `gumbel`); a bad argument is argparse's
    usage error naming it, before any model loads."""
    try:
        from fastrl.bench.cli_args import at_least, int_list, strategy_list
    except ImportError:  # run by path against a checkout older than it (see the module doc): this file's sibling
        from cli_args import at_least, int_list, strategy_list
    from fastrl.commands.engine_setup import check_kv_memory, resolve_model_dir
    from fastrl.models.checkpoint import read_config

    parser = argparse.ArgumentParser(
        prog="python -m fastrl.bench.host_time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in ("throughput", "sampled", "view", "kernel"):
        command = commands.add_parser(name, help="tokens per CPU second, or CPU-time ratios, per batch size")
        command.add_argument("batches", metavar="BATCHES", type=int_list(1), help="batch sizes, e.g. 1,64,256")
        command.add_argument("new_tokens", metavar="NEW_TOKENS", type=at_least(1), nargs="?", default=64)
        command.add_argument("model", metavar="MODEL", nargs="?", default="", help="named model or checkpoint dir")
    host = commands.add_parser("host", help="the host-time suite on the bundled model")
    host.add_argument("strategies", metavar="STRATEGIES", type=strategy_list, help="e.g. disable,3_1_4")
    one = commands.add_parser("round", help="host time of one round per strategy at one batch size (bundled model)")
    one.add_argument("strategies", metavar="STRATEGIES", type=strategy_list, help="e.g. disable,3_1_4")
    one.add_argument("batch", metavar="BATCH", type=at_least(1), nargs="?", default=1, help="rows (default 1)")
    commands.add_parser("gumbel", help="lazy against full Gumbel-argmax, no model")
    args = parser.parse_args(argv)
    if args.command == "gumbel":
        return args, None
    most = CONTEXT - LONGEST_PROMPT
    if args.command not in ("host", "round") and args.new_tokens > most:
        parser.error(
            f"argument NEW_TOKENS: {args.new_tokens} does not fit the engines' {CONTEXT}-token context after prompts "
            f"of up to {LONGEST_PROMPT} tokens (the rows would stop early); give at most {most}"
        )
    try:
        model_dir = resolve_model_dir(getattr(args, "model", ""), "MODEL")
    except (ValueError, ImportError) as err:
        parser.error(str(err))
    if args.command == "round" and args.batch > MAX_ROUND_BATCH:
        parser.error(f"argument BATCH: at most {MAX_ROUND_BATCH} rows, got {args.batch}")
    if args.command in ("host", "round"):
        return args, model_dir
    config = read_config(model_dir)
    if args.new_tokens > config.max_position_embeddings - LONGEST_PROMPT:
        parser.error(
            f"argument NEW_TOKENS: {args.new_tokens} does not fit MODEL's {config.max_position_embeddings} positions "
            f"after prompts of up to {LONGEST_PROMPT} tokens"
        )
    engines = 2 if args.command in ("view", "kernel") else 1
    try:
        check_kv_memory("batch", config, max(args.batches), torch.float32, "cpu", CONTEXT * engines)
    except ValueError as err:
        parser.error(f"argument BATCHES: {err}")
    return args, model_dir


def main(argv: list[str] | None = None) -> None:
    """Run one command of the module docstring and print its figures."""
    from fastrl.models.checkpoint import load_model

    args, model_dir = parse_arguments(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    if model_dir is None:
        for rows, vocab, full, lazy in lazy_argmax_ab([(256, 91), (1024, 91), (256, 4096), (64, 32000), (16, 49152)]):
            print(
                f"{rows} x {vocab}: full {full * 1e3:.3f} ms, lazy {lazy * 1e3:.3f} ms, full / lazy {full / lazy:.2f}"
            )
        return
    model = load_model(model_dir)
    if args.command in ("host", "round"):
        from fastrl.commands.bench_config import BenchConfig
        from fastrl.commands.engine_setup import resolve_drafter

        speculative = any(not Strategy.parse(s).is_disabled for s in args.strategies)
        drafter = resolve_drafter(BenchConfig().drafter, model_dir, model, speculative)
        if args.command == "round":  # rows of ~100 tokens, the median of 40 rounds
            for strategy in args.strategies:
                seconds = round_host_time(model, drafter, strategy, args.batch, 100, rounds=40)
                print(f"{strategy}: {seconds * 1e6:.0f} us of host time a round at batch {args.batch}", flush=True)
            return
        for row in bench_host_time(model, drafter, args.strategies):
            print(
                f"{row.strategy}: {row.per_row_us:.1f} us per extra row (64 -> 256: {row.small_batch_us:.0f} -> "
                f"{row.large_batch_us:.0f} us), 850- vs 100-token rows {row.long_vs_short:.2f}",
                flush=True,
            )
        return
    for batch in args.batches:
        if args.command == "view":
            ratios = home_view_ab(model, batch, args.new_tokens, 5)
            print(f"batch {batch}: gather / view CPU time {[round(r, 2) for r in ratios]}", flush=True)
        elif args.command == "kernel":
            ratios = config_ab(model, batch, args.new_tokens, 5, {"attention_kernel": False}, {})
            print(f"batch {batch}: PyTorch attention / kernel CPU time {[round(r, 2) for r in ratios]}", flush=True)
        else:
            temperature = 1.0 if args.command == "sampled" else 0.0
            rate = throughput(model, batch, args.new_tokens, temperature=temperature)
            print(f"batch {batch}: {rate:.1f} tok/CPU-s ({args.command})", flush=True)


if __name__ == "__main__":
    main()
