"""`fastrl bench`: print tables of decoding speed and write them as JSON."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.bench.history_groups import bench_groups_bs1
from fastrl.bench.host_time import bench_host_time
from fastrl.bench.kv_memory import long_tail_lengths, memory_at, trace_kv_bytes
from fastrl.bench.long_tail import bench_long_tail, cost_measurements
from fastrl.bench.plain_vs_hf import bench_plain_vs_hf
from fastrl.bench.prefix_sharing import bench_prefix_sharing
from fastrl.bench.report import format_table, write_json
from fastrl.bench.spec_bs1 import bench_bs1
from fastrl.bench.workload import bench_prompts
from fastrl.commands.bench_config import BenchConfig
from fastrl.commands.engine_setup import model_inputs, request_context, resolve_drafter, resolve_model_dir
from fastrl.commands.output_guard import guard_outputs
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.strategy.strategy import Strategy
from fastrl.telemetry.arm_table import arm_table
from fastrl.telemetry.run_stats import DEFAULT_THRESHOLDS, run_stats, write_run_plot


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the selected suites; returns the JSON payload (also written to cfg.output, checked and locked first)."""
    model_dir = resolve_model_dir(cfg.model)
    with guard_outputs({"output": cfg.output}, model_inputs(model_dir, cfg.drafter)):
        return _run_bench(cfg, model_dir)


def _run_bench(cfg: BenchConfig, model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ValueError(f"fastrl bench tokenizes its prompts and needs a tokenizer in {model_dir}")
    model = load_model(model_dir, device=cfg.device)
    pad_id = tokenizer.pad_token_id or 0
    needs_hf = {"plain_vs_hf", "spec_bs1", "groups_bs1"} & set(cfg.suites)
    hf_model = None
    if needs_hf:
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(cfg.device).eval()
        hf_model.generation_config.eos_token_id = None if "plain_vs_hf" in cfg.suites else hf_model.config.eos_token_id
    payload: dict[str, Any] = {
        "model": cfg.model or str(model_dir),
        "model_dir": str(model_dir),
        "workload": cfg.workload,
        "device": cfg.device,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    if "plain_vs_hf" in cfg.suites:
        prompts = bench_prompts(tokenizer, cfg.workload, max(cfg.batch_sizes), cfg.seed)
        length = request_context(model.config, [len(p) for p in prompts], cfg.new_tokens)
        rows = [
            bench_plain_vs_hf(model, hf_model, prompts, bs, cfg.new_tokens, cfg.repeats, pad_id, cfg.device, length)
            for bs in cfg.batch_sizes
        ]
        print(
            f"\nplain decoding (greedy), tokens/s, median of {cfg.repeats}\n"
            + format_table(
                ["batch", "new_tokens", "fastrl tok/s", "HF tok/s", "fastrl/HF"],
                [[r.batch_size, r.new_tokens, r.fastrl_tok_s, r.hf_tok_s, r.ratio] for r in rows],
            ),
            flush=True,
        )
        payload["plain_vs_hf"] = [asdict(r) | {"ratio": r.ratio} for r in rows]
    if hf_model is not None:
        hf_model.generation_config.eos_token_id = hf_model.config.eos_token_id
    drafter = None
    if {"spec_bs1", "long_tail", "groups_bs1"} & set(cfg.suites):
        drafter = resolve_drafter(cfg.drafter, model_dir, model, needed=True)
    if "spec_bs1" in cfg.suites:
        prompts = bench_prompts(tokenizer, cfg.workload, cfg.bs1_prompts, cfg.seed + 1)
        rows = bench_bs1(
            model,
            drafter,
            hf_model,
            prompts,
            cfg.bs1_strategies,
            cfg.bs1_max_new_tokens,
            cfg.repeats,
            cfg.bs1_temperatures,
            pad_id,
            request_context(model.config, [len(p) for p in prompts], cfg.bs1_max_new_tokens),
        )
        print(
            f"\nbatch size 1, {cfg.bs1_prompts} prompts decoded one at a time, median of {cfg.repeats}\n"
            + format_table(
                ["method", "T", "tok/s", "speedup", "accept len", "limit", "of limit"],
                [
                    [
                        r.method,
                        r.temperature,
                        r.tok_s,
                        r.speedup,
                        _opt(r.accept_length),
                        _opt(r.physical_limit),
                        _opt(r.fraction_of_limit),
                    ]
                    for r in rows
                ],
            ),
            flush=True,
        )
        payload["spec_bs1"] = [asdict(r) | {"fraction_of_limit": r.fraction_of_limit} for r in rows]
    if "long_tail" in cfg.suites:
        groups = -(-cfg.long_tail_requests // cfg.long_tail_group_size)
        prompts = bench_prompts(tokenizer, cfg.workload, groups, cfg.seed + 2)
        prompts = [p for p in prompts for _ in range(cfg.long_tail_group_size)][: cfg.long_tail_requests]
        rows = bench_long_tail(
            model,
            drafter,
            prompts,
            cfg.long_tail_selectors,
            cfg.long_tail_max_new_tokens,
            cfg.long_tail_repeats,
            batch_size=cfg.long_tail_requests,
            bandit=BanditConfig(strategies=list(cfg.long_tail_bandit_strategies), epsilon=0.1, min_pulls=3),
            max_model_len=request_context(model.config, [len(p) for p in prompts], cfg.long_tail_max_new_tokens),
        )
        print(
            f"\nlong-tail batch: {cfg.long_tail_requests} requests at T=1 "
            f"({cfg.long_tail_group_size} per prompt), one engine, wall time\n"
            + format_table(
                ["selector", "wall s", "speedup", "rounds", "accept len"],
                [[r.selector, r.wall_s, r.speedup, r.rounds, r.mean_accept_length] for r in rows],
            ),
            flush=True,
        )
        payload["long_tail"] = [
            {
                "selector": r.selector,
                "wall_s": r.wall_s,
                "speedup": r.speedup,
                "rounds": r.rounds,
                "mean_accept_length": r.mean_accept_length,
            }
            for r in rows
        ]
        out_dir = Path(cfg.output).parent
        costs = out_dir / "round_costs.json"
        write_json(costs, cost_measurements(rows))
        for r in rows:
            if r.selector in ("bandit", "ema"):
                stats_path = out_dir / f"long_tail_{r.selector}.json"
                stats_path.write_text(json.dumps(run_stats(r.round_stats, r.selector, r.strategy_selector), indent=2))
                write_run_plot(out_dir / f"long_tail_{r.selector}.png", r.round_stats, r.selector, r.strategy_selector)
                table = arm_table(r.round_stats, DEFAULT_THRESHOLDS)
                print(
                    f"\n{r.selector}: rounds per batch-size bucket and strategy\n"
                    + format_table(
                        ["bucket", "strategy", "pulls", "goodput tok/s", "accept len"],
                        [[a.bucket, a.strategy, a.pulls, a.mean_goodput, a.mean_accept_length] for a in table],
                    )
                )
        print(f"\nmeasured round costs: {costs} (fit the simulator: python -m fastrl.adaptive.sim --costs {costs})")
    if "groups_bs1" in cfg.suites:
        prompts = bench_prompts(tokenizer, cfg.workload, cfg.groups_prompts, cfg.seed + 4)
        rows = bench_groups_bs1(
            model,
            drafter,
            hf_model,
            prompts,
            cfg.groups_n,
            list(cfg.groups_selectors),
            list(cfg.groups_bandit_strategies),
            cfg.groups_max_new_tokens,
            cfg.repeats,
            list(cfg.groups_temperatures),
            pad_id,
        )
        print(
            f"\nGRPO groups at batch size 1: {cfg.groups_prompts} prompts x {cfg.groups_n} samples, siblings in turn\n"
            + format_table(
                ["method", "T", "tok/s", "speedup", "accept len", "draft share"],
                [
                    [r.method, r.temperature, r.tok_s, r.speedup, _opt(r.accept_length), _opt(r.draft_share)]
                    for r in rows
                ],
            ),
            flush=True,
        )
        payload["groups_bs1"] = [asdict(r) for r in rows]
    if "kv_memory" in cfg.suites:
        _bench_kv_memory(cfg, model, tokenizer, model_dir, payload)
    if "host_time" in cfg.suites:
        _bench_host_time(cfg, model, model_dir, payload)
    if "prefix_sharing" in cfg.suites:
        prompts = bench_prompts(tokenizer, cfg.workload, cfg.prefix_sharing_prompts, cfg.seed + 3)
        rows = bench_prefix_sharing(
            model,
            prompts,
            list(cfg.prefix_sharing_group_sizes),
            cfg.repeats,
            cfg.device,
            request_context(model.config, [len(p) for p in prompts], 1),
        )
        print(
            f"\nprefix sharing: {cfg.prefix_sharing_prompts} prompts x n samples, prefill of the whole batch\n"
            + format_table(
                ["n", "prompt tokens", "unshared s", "shared s", "speedup", "rows run"],
                [
                    [r.samples_per_prompt, r.prompt_tokens, r.unshared_s, r.shared_s, r.speedup, r.rows_computed]
                    for r in rows
                ],
            ),
            flush=True,
        )
        payload["prefix_sharing"] = [asdict(r) | {"speedup": r.speedup} for r in rows]
    write_json(cfg.output, payload)
    return payload


def _opt(value: float | None) -> float | str:
    return "" if value is None else value


def _bench_host_time(cfg: BenchConfig, model, model_dir: Path, payload: dict[str, Any]) -> None:
    """Host CPU time per decode round outside the forwards: us per extra row, long rows vs short rows."""
    speculative = any(not Strategy.parse(s).is_disabled for s in cfg.host_time_strategies)
    drafter = resolve_drafter(cfg.drafter, model_dir, model, speculative)
    rows = bench_host_time(model, drafter, list(cfg.host_time_strategies))
    print(
        "\nhost CPU time per decode round outside the policy and drafter forwards (T=1, median of 8 rounds)\n"
        + format_table(
            ["strategy", "us per extra row (64->256)", "850 vs 100-token rows", "batch 64 us", "batch 256 us"],
            [[r.strategy, r.per_row_us, r.long_vs_short, r.small_batch_us, r.large_batch_us] for r in rows],
        ),
        flush=True,
    )
    payload["host_time"] = [asdict(r) for r in rows]


def _bench_kv_memory(cfg: BenchConfig, model, tokenizer, model_dir: Path, payload: dict[str, Any]) -> None:
    """KV bytes held vs tokens alive over a long-tail run, and memory at each of cfg.kv_memory_new_tokens."""
    prompts = bench_prompts(tokenizer, cfg.workload, cfg.kv_memory_requests, cfg.seed + 5)
    cap = model.config.max_position_embeddings - max(len(p) for p in prompts) - 8
    lengths = long_tail_lengths(len(prompts), cap, cfg.seed + 5)
    trace = trace_kv_bytes(model, prompts, lengths, request_context(model.config, [len(p) for p in prompts], cap))
    print(
        f"\nKV bytes over a long-tail run: {trace.requests} requests, {trace.rounds} steps, responses "
        f"{min(lengths)}..{max(lengths)} tokens\n"
        + format_table(
            ["held/(alive+scratch) max", "mean", "peak held MB", "peak alive MB", "scratch MB", "slot cache MB"],
            [
                [trace.max_ratio, trace.mean_ratio]
                + [
                    b / 2**20
                    for b in (trace.peak_held_bytes, trace.peak_alive_bytes, trace.scratch_bytes, trace.dense_bytes)
                ]
            ],
        ),
        flush=True,
    )
    rows = [memory_at(str(model_dir), n, cfg.kv_memory_requests, cfg.seed) for n in cfg.kv_memory_new_tokens]
    print(
        f"\n{cfg.kv_memory_requests} task prompts at T=0 per max_new_tokens, each in a fresh process\n"
        + format_table(
            ["max_new_tokens", "tokens", "peak KV MB", "peak RSS increase MB", "RSS vs first"],
            [
                [
                    r.max_new_tokens,
                    r.generated_tokens,
                    r.peak_kv_bytes / 2**20,
                    r.rss_increase_bytes / 2**20,
                    r.rss_increase_bytes / rows[0].rss_increase_bytes,
                ]
                for r in rows
            ],
        ),
        flush=True,
    )
    payload["kv_memory"] = {"trace": asdict(trace), "by_max_new_tokens": [asdict(r) for r in rows]}
