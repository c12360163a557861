"""Admission in batches (`engine.admit_batch`) on a queue longer than the slots, as an RL step's rollouts are:
tokens/s, prefill calls and decode rounds for each setting, the settings taking turns in every repeat (paired),
each engine warmed up first, and how many requests decoded the tokens the first setting did (all of them in
float64; in bfloat16 another batch composition rounds otherwise and may flip a near-tie).

    python -m fastrl.bench.admission --requests 2048 --batch-size 256 --admit 1,32
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fastrl.bench.cli_args import at_least, int_list
from fastrl.engine.config import EngineConfig, check_dtype, default_dtype
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.models.device_sync import drain
from fastrl.sampling.params import SamplingParams


@dataclass
class AdmissionRow:
    """One admit_batch setting: wall seconds per repeat, what its engine ran (its last repeat), and the requests
    whose tokens equal the first setting's first repeat."""

    admit_batch: int
    runs_s: list[float] = field(default_factory=list)
    tokens: int = 0
    prefill_calls: int = 0
    decode_rounds: int = 0
    identical: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)


def bench_admission(
    policy: CausalLM,
    inputs: list[GenerateInput],
    slots: int,
    settings: list[int],
    repeats: int,
    device: str,
    dtype: str = "float32",
) -> list[AdmissionRow]:
    """Each setting generates `inputs` on `slots` slots once per repeat, in turn, on an engine warmed up first (two
    requests); ValueError when float64 tokens differ from the first setting's (admission must not change one)."""
    rows = [AdmissionRow(a) for a in settings]
    reference = None
    for _ in range(repeats):
        for row in rows:
            config = EngineConfig(max_batch_size=slots, device=device, dtype=dtype, admit_batch=row.admit_batch)
            engine = Engine(policy, config)
            engine.generate(inputs[:2])  # first-use costs (kernels, graphs) out of the timing
            calls, rounds = engine.prefill_rows.calls, len(engine.round_stats)
            drain(device)
            start = time.perf_counter()
            outputs = engine.generate(inputs)
            drain(device)
            row.runs_s.append(time.perf_counter() - start)
            tokens = [o.token_ids for o in outputs]
            reference = reference or tokens
            row.identical = sum(a == b for a, b in zip(tokens, reference, strict=True))
            if dtype == "float64" and row.identical < len(tokens):
                raise ValueError(f"admit_batch={row.admit_batch} changed the float64 tokens of a request")
            row.tokens = sum(map(len, tokens))
            row.prefill_calls = engine.prefill_rows.calls - calls
            row.decode_rounds = len(engine.round_stats) - rounds
    return rows


def default_admit(batch_size: int) -> list[int]:
    """``--admit``'s default: admission at once (1) against in batches of an eighth of the slots (the engine's own
    default, ``EngineConfig.admission_slots``), one setting where the two coincide (under 16 slots)."""
    return sorted({1, max(1, batch_size // 8)})


def check_arguments(args: argparse.Namespace) -> tuple[list[int], Path]:
    """``main``'s admit_batch settings (``--admit`` or its default) and the checkpoint ``--model`` names; ValueError
    naming the flag of the first bad value that argparse's types leave, before any model loads."""
    from fastrl.commands.engine_setup import check_kv_memory, resolve_model_dir
    from fastrl.engine.machine import check_device
    from fastrl.models.checkpoint import read_config
    from fastrl.sampling.params import check_temperature

    settings = args.admit if args.admit is not None else default_admit(args.batch_size)
    if any(a > args.batch_size for a in settings):
        raise ValueError(f"--admit: each setting must be in [1, --batch-size={args.batch_size}], got {settings}")
    check_temperature("--temperature", args.temperature)
    check_device("--device", args.device)
    dtype = args.dtype or default_dtype(args.device)
    check_dtype("--dtype", dtype)
    model_dir = resolve_model_dir(args.model, "--model")
    # the engines' KV cache: every slot the model's whole context (EngineConfig's default max_model_len)
    check_kv_memory("--batch-size", read_config(model_dir), args.batch_size, getattr(torch, dtype), args.device)
    return settings, model_dir


def main(argv: list[str] | None = None) -> None:
    """Admission in batches: tokens/s, prefill calls and decode rounds per admit_batch (paired repeats)."""
    from fastrl.bench.workload import bench_prompts
    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--requests", type=at_least(1), default=2048)
    parser.add_argument("--batch-size", type=at_least(1), default=256, help="engine slots")
    parser.add_argument(
        "--admit",
        type=int_list(1),
        default=None,
        help="admit_batch settings, comma-separated, each in [1, --batch-size]; the first is the base (default: 1 "
        "and --batch-size // 8, the engine's default: admission at once against in batches; 1,32 at 256 slots)",
    )
    parser.add_argument("--max-new-tokens", type=at_least(1), default=1024)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 (greedy) or at least 1e-6")
    parser.add_argument("--repeats", type=at_least(1), default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="", help="engine dtype (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--model", default="", help="named model (smollm2) or checkpoint dir (default: bundled)")
    args = parser.parse_args(argv)
    try:
        settings, model_dir = check_arguments(args)
        dtype = args.dtype or default_dtype(args.device)
        torch.set_num_threads(1)
        policy, tokenizer = load_model(model_dir).to(args.device).eval(), load_tokenizer(model_dir)
    except ValueError as err:
        parser.error(str(err))
    prompts = bench_prompts(tokenizer, "auto", args.requests, 2)
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=i))
        for i, p in enumerate(prompts)
    ]
    rows = bench_admission(policy, inputs, args.batch_size, settings, args.repeats, args.device, dtype)
    base = rows[0].median_s
    print(f"{args.requests} requests on {args.batch_size} slots ({args.device}, {dtype}), {rows[0].tokens} tokens:")
    for row in rows:
        runs = [round(s, 2) for s in row.runs_s]
        print(
            f"  admit_batch {row.admit_batch:4d}: {row.median_s:7.2f} s (median; runs {runs})"
            f" {row.tokens / row.median_s:8.0f} tok/s  x{base / row.median_s:.3f}  prefill calls "
            f"{row.prefill_calls:5d}  decode rounds {row.decode_rounds:5d}  identical {row.identical}/{len(inputs)}"
        )


if __name__ == "__main__":
    main()
