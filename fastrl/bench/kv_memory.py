"""KV memory of the paged cache: bytes held against bytes of the tokens alive at every round of a long-tail
workload, and the memory of the same generations under a small and a large `max_new_tokens`.

The second figure is measured as peak resident memory in a fresh process per setting (VmHWM grows only), plus
the KV bytes the pool held at its peak; run as `python -m fastrl.bench.kv_memory MODEL_DIR NEW_TOKENS COUNT SEED`
it prints one JSON line for that setting.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass

from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams


@dataclass
class KvTrace:
    """Per-round KV bytes over one long-tail run.

    held: the pool pages handed out plus every slot's scratch; alive: the tokens of running requests; scratch: the
    scratch pages alone; dense: what a slot-per-sequence cache of the same slots and context length holds.
    """

    requests: int
    rounds: int
    max_ratio: float  # max over rounds of held / (alive + scratch)
    mean_ratio: float
    peak_held_bytes: int
    peak_alive_bytes: int
    scratch_bytes: int
    dense_bytes: int


@dataclass
class KvMemoryRow:
    """One max_new_tokens setting of the same workload: tokens generated, KV bytes at the pool's peak, and the
    peak resident memory the generation added, in a fresh process."""

    max_new_tokens: int
    generated_tokens: int
    peak_kv_bytes: int
    rss_increase_bytes: int


def long_tail_lengths(count: int, cap: int, seed: int) -> list[int]:
    """Response lengths with a heavy tail (Pareto, shape 1.1, scale 16), capped at `cap`."""
    rng = random.Random(seed)
    return [min(cap, int(16 * rng.paretovariate(1.1))) for _ in range(count)]


def trace_kv_bytes(
    model: CausalLM, prompts: list[list[int]], lengths: list[int], max_model_len: int, page_size: int = 16
) -> KvTrace:
    """Generate `prompts` (T=1, EOS ignored, lengths[i] new tokens each) in one batch, recording KV bytes per round."""
    config = EngineConfig(max_batch_size=len(prompts), max_model_len=max_model_len, page_size=page_size)
    engine = Engine(model, config)
    runner = engine.runner
    token_bytes = sum(c.page_bytes for c in runner.caches) // page_size
    scratch = runner.table.num_slots * runner.table.scratch_pages * page_size * token_bytes
    for i, (prompt, new) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(prompt, SamplingParams(max_new_tokens=new, temperature=1.0, seed=i, ignore_eos=True))
    ratios, peak_held, peak_alive = [], 0, 0
    while engine.has_unfinished():
        engine.step()
        held = runner.kv_bytes_held()
        alive = sum(r.num_tokens for r in engine.scheduler.running if not r.finished) * token_bytes
        ratios.append(held / (alive + scratch))
        peak_held, peak_alive = max(peak_held, held), max(peak_alive, alive)
    dense = len(prompts) * (runner.max_model_len + runner.table.scratch_pages * page_size) * token_bytes
    return KvTrace(
        len(prompts), len(ratios), max(ratios), sum(ratios) / len(ratios), peak_held, peak_alive, scratch, dense
    )


def memory_at(model_dir: str, max_new_tokens: int, count: int, seed: int) -> KvMemoryRow:
    """`count` task prompts generated at T=0 with `max_new_tokens`, in a fresh process: its peak RSS increase."""
    out = subprocess.run(
        [sys.executable, "-m", "fastrl.bench.kv_memory", model_dir, str(max_new_tokens), str(count), str(seed)],
        capture_output=True,
        text=True,
    )
    if out.returncode:  # the measuring process's own error, not a traceback of this one
        said = "\n".join(out.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"the kv_memory measurement at max_new_tokens={max_new_tokens} failed:\n{said}")
    return KvMemoryRow(**json.loads(out.stdout.strip().splitlines()[-1]))


def _measure(model_dir: str, max_new_tokens: int, count: int, seed: int) -> KvMemoryRow:
    """The body of `memory_at`, run inside the fresh process."""
    import torch

    from fastrl.bench.workload import bench_prompts
    from fastrl.commands.engine_setup import request_context
    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    model = load_model(model_dir)
    prompts = bench_prompts(load_tokenizer(model_dir), "task", count, seed)
    length = request_context(model.config, [len(p) for p in prompts], max_new_tokens)
    before = peak_rss_bytes()
    engine = Engine(model, EngineConfig(max_batch_size=count, max_model_len=length))
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    for p in prompts:
        engine.add_request(p, params)
    generated, peak = 0, 0
    while engine.has_unfinished():
        generated += sum(len(o.token_ids) for o in engine.step() if o.finished)
        peak = max(peak, engine.runner.kv_bytes_held())
    return KvMemoryRow(max_new_tokens, generated, peak, peak_rss_bytes() - before)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux VmHWM; unlike ru_maxrss it does not inherit the parent's peak
    through fork and exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line: peak memory needs Linux")


def main(argv: list[str] | None = None) -> None:
    """One measurement of `fastrl bench suites=[kv_memory]` (which runs it in a fresh process): print its JSON line."""
    import argparse

    import torch

    from fastrl.bench.cli_args import at_least
    from fastrl.commands.engine_setup import check_kv_memory, resolve_model_dir
    from fastrl.models.checkpoint import read_config

    parser = argparse.ArgumentParser(prog="python -m fastrl.bench.kv_memory", description=main.__doc__)
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="checkpoint directory (config.json, tokenizer)")
    parser.add_argument("max_new_tokens", metavar="MAX_NEW_TOKENS", type=at_least(1))
    parser.add_argument("count", metavar="COUNT", type=at_least(1), help="task prompts generated in one batch")
    parser.add_argument("seed", metavar="SEED", type=at_least(0))
    args = parser.parse_args(argv)
    try:
        model_dir = resolve_model_dir(args.model_dir, "MODEL_DIR")
        config = read_config(model_dir)
    except (ValueError, ImportError) as err:
        parser.error(str(err))
    if args.max_new_tokens >= config.max_position_embeddings:  # a row needs one prompt token besides its new ones
        parser.error(
            f"argument MAX_NEW_TOKENS: {args.max_new_tokens} leaves no room for a prompt in MODEL_DIR's "
            f"{config.max_position_embeddings} positions; give at most {config.max_position_embeddings - 1}"
        )
    try:  # at least each row's new tokens, whatever its prompt
        check_kv_memory("count", config, args.count, torch.float32, "cpu", args.max_new_tokens + 2)
    except ValueError as err:
        parser.error(f"argument COUNT: {err}")
    row = _measure(str(model_dir), args.max_new_tokens, args.count, args.seed)
    print(json.dumps(row.__dict__))


if __name__ == "__main__":
    main()
