"""The suites of `fastrl bench`, each a function of one ``SuiteContext`` that prints its table and adds its rows to
the run's JSON payload (``SUITE_RUNS`` by name; `fastrl bench` runs the selected ones in ``SUITES`` order)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
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
from fastrl.bench.report import format_table, json_text
from fastrl.bench.spec_bs1 import bench_bs1
from fastrl.bench.workload import bench_prompts
from fastrl.commands.bench_config import BenchConfig
from fastrl.commands.engine_setup import request_context, resolve_drafter
from fastrl.commands.output_guard import GuardedOutputs, write_text, write_through
from fastrl.strategy.strategy import Strategy
from fastrl.telemetry.arm_table import arm_table
from fastrl.telemetry.run_stats import DEFAULT_THRESHOLDS, run_stats, write_run_plot


@dataclass
class SuiteContext:
    """What every suite reads: the config, the loaded policy, its tokenizer and drafter, the checked outputs."""

    cfg: BenchConfig
    model_dir: Path
    model: Any
    tokenizer: Any
    drafter: Any
    targets: GuardedOutputs
    _hf: Any = None

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0

    def prompts(self, count: int, seed_offset: int) -> list[list[int]]:
        return bench_prompts(self.tokenizer, self.cfg.workload, count, self.cfg.seed + seed_offset)

    def hf_model(self, stop_at_eos: bool) -> Any:
        """transformers' copy of the policy (loaded once), for the suites that time HF ``generate`` beside
        fastrl: ``stop_at_eos`` False makes it generate every new token, as fastrl's plain suite does."""
        from transformers import AutoModelForCausalLM

        if self._hf is None:
            self._hf = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            self._hf = self._hf.to(self.cfg.device).eval()
        self._hf.generation_config.eos_token_id = self._hf.config.eos_token_id if stop_at_eos else None
        return self._hf

    def context(self, prompts: list[list[int]], new_tokens: int) -> int:
        return request_context(self.model.config, [len(p) for p in prompts], new_tokens)


def _plain_vs_hf(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    cfg = ctx.cfg
    prompts = ctx.prompts(max(cfg.batch_sizes), 0)
    room = ctx.model.config.max_position_embeddings - max(len(p) for p in prompts) - 1
    if cfg.new_tokens > room:  # fastrl would stop at the context while HF runs past it: not the same work
        raise ValueError(
            f"bench.new_tokens={cfg.new_tokens}: the longest prompt leaves room for {room} tokens in the model's "
            f"context ({ctx.model.config.max_position_embeddings}); use new_tokens={room} or less"
        )
    hf = ctx.hf_model(stop_at_eos=False)
    length = ctx.context(prompts, cfg.new_tokens)
    rows = [
        bench_plain_vs_hf(ctx.model, hf, prompts, bs, cfg.new_tokens, cfg.repeats, ctx.pad_id, cfg.device, length)
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


def _spec_bs1(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    cfg = ctx.cfg
    prompts = ctx.prompts(cfg.bs1_prompts, 1)
    rows = bench_bs1(
        ctx.model,
        ctx.drafter,
        ctx.hf_model(stop_at_eos=True),
        prompts,
        cfg.bs1_strategies,
        cfg.bs1_max_new_tokens,
        cfg.repeats,
        cfg.bs1_temperatures,
        ctx.pad_id,
        ctx.context(prompts, cfg.bs1_max_new_tokens),
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


def _long_tail(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    cfg = ctx.cfg
    groups = -(-cfg.long_tail_requests // cfg.long_tail_group_size)
    prompts = [p for p in ctx.prompts(groups, 2) for _ in range(cfg.long_tail_group_size)]
    prompts = prompts[: cfg.long_tail_requests]
    rows = bench_long_tail(
        ctx.model,
        ctx.drafter,
        prompts,
        cfg.long_tail_selectors,
        cfg.long_tail_max_new_tokens,
        cfg.long_tail_repeats,
        batch_size=cfg.long_tail_requests,
        bandit=BanditConfig(strategies=list(cfg.long_tail_bandit_strategies), epsilon=0.1, min_pulls=3),
        max_model_len=ctx.context(prompts, cfg.long_tail_max_new_tokens),
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
    targets = ctx.targets
    write_text(targets["round_costs"], json_text(cost_measurements(rows)))
    for r in rows:
        if r.selector in ("bandit", "ema"):
            stats = run_stats(r.round_stats, r.selector, r.strategy_selector)
            write_text(targets[f"long_tail_{r.selector}"], json_text(stats))
            write_through(
                targets[f"long_tail_{r.selector}_plot"],
                lambda path, r=r: write_run_plot(path, r.round_stats, r.selector, r.strategy_selector),
            )
            table = arm_table(r.round_stats, DEFAULT_THRESHOLDS)
            print(
                f"\n{r.selector}: rounds per batch-size bucket and strategy\n"
                + format_table(
                    ["bucket", "strategy", "pulls", "goodput tok/s", "accept len"],
                    [[a.bucket, a.strategy, a.pulls, a.mean_goodput, a.mean_accept_length] for a in table],
                )
            )
    costs = targets["round_costs"].given
    print(f"\nmeasured round costs: {costs} (fit the simulator: python -m fastrl.adaptive.sim --costs {costs})")


def _groups_bs1(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    cfg = ctx.cfg
    rows = bench_groups_bs1(
        ctx.model,
        ctx.drafter,
        ctx.hf_model(stop_at_eos=True),
        ctx.prompts(cfg.groups_prompts, 4),
        cfg.groups_n,
        list(cfg.groups_selectors),
        list(cfg.groups_bandit_strategies),
        cfg.groups_max_new_tokens,
        cfg.repeats,
        list(cfg.groups_temperatures),
        ctx.pad_id,
    )
    print(
        f"\nGRPO groups at batch size 1: {cfg.groups_prompts} prompts x {cfg.groups_n} samples, siblings in turn\n"
        + format_table(
            ["method", "T", "tok/s", "speedup", "accept len", "draft share"],
            [[r.method, r.temperature, r.tok_s, r.speedup, _opt(r.accept_length), _opt(r.draft_share)] for r in rows],
        ),
        flush=True,
    )
    payload["groups_bs1"] = [asdict(r) for r in rows]


def _prefix_sharing(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    cfg = ctx.cfg
    prompts = ctx.prompts(cfg.prefix_sharing_prompts, 3)
    rows = bench_prefix_sharing(
        ctx.model, prompts, list(cfg.prefix_sharing_group_sizes), cfg.repeats, cfg.device, ctx.context(prompts, 1)
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


def _opt(value: float | None) -> float | str:
    return "" if value is None else value


def _host_time(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    """Host CPU time per decode round outside the forwards: us per extra row, long rows vs short rows."""
    cfg = ctx.cfg
    speculative = any(not Strategy.parse(s).is_disabled for s in cfg.host_time_strategies)
    drafter = resolve_drafter(cfg.drafter, ctx.model_dir, ctx.model, speculative)
    rows = bench_host_time(ctx.model, drafter, list(cfg.host_time_strategies))
    print(
        "\nhost CPU time per decode round outside the policy and drafter forwards (T=1, median of 8 rounds)\n"
        + format_table(
            ["strategy", "us per extra row (64->256)", "850 vs 100-token rows", "batch 64 us", "batch 256 us"],
            [[r.strategy, r.per_row_us, r.long_vs_short, r.small_batch_us, r.large_batch_us] for r in rows],
        ),
        flush=True,
    )
    payload["host_time"] = [asdict(r) for r in rows]


def _kv_memory(ctx: SuiteContext, payload: dict[str, Any]) -> None:
    """KV bytes held vs tokens alive over a long-tail run, and memory at each of cfg.kv_memory_new_tokens."""
    cfg, model = ctx.cfg, ctx.model
    prompts = ctx.prompts(cfg.kv_memory_requests, 5)
    cap = model.config.max_position_embeddings - max(len(p) for p in prompts) - 8
    lengths = long_tail_lengths(len(prompts), cap, cfg.seed + 5)
    trace = trace_kv_bytes(model, prompts, lengths, ctx.context(prompts, cap))
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
    rows = [memory_at(str(ctx.model_dir), n, cfg.kv_memory_requests, cfg.seed) for n in cfg.kv_memory_new_tokens]
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


SUITE_RUNS: dict[str, Callable[[SuiteContext, dict[str, Any]], None]] = {
    "plain_vs_hf": _plain_vs_hf,
    "spec_bs1": _spec_bs1,
    "long_tail": _long_tail,
    "prefix_sharing": _prefix_sharing,
    "groups_bs1": _groups_bs1,
    "kv_memory": _kv_memory,
    "host_time": _host_time,
}
