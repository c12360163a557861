"""`fastrl bench`: print tables of decoding speed and write them as JSON."""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from fastrl.bench.report import json_text
from fastrl.commands.bench_config import SUITES, BenchConfig
from fastrl.commands.bench_suites import SUITE_RUNS, SuiteContext
from fastrl.commands.engine_setup import check_kv_memory, model_inputs, resolve_drafter, resolve_model_dir
from fastrl.commands.multirun import job_file, multirun_job
from fastrl.commands.output_guard import GuardedOutputs, OutputTarget, guard_outputs, write_text
from fastrl.engine.config import EngineConfig
from fastrl.models.checkpoint import load_model, read_config
from fastrl.models.config import ModelConfig
from fastrl.models.tokenizer import load_tokenizer


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the selected suites; returns the JSON payload. It is written to cfg.output after every suite (so an
    interrupted or failed run keeps the suites it finished, marked ``incomplete``); the output and the long-tail
    suite's side files beside it are checked and locked before any work."""
    model_dir = resolve_model_dir(cfg.model)
    check_sizes(cfg, read_config(model_dir))
    with guard_outputs(output_files(cfg), model_inputs(model_dir, cfg.drafter)) as targets:
        return _run_bench(cfg, model_dir, targets)


PROMPT_ROOM = 32
"""Tokens of prompt counted for each row of a size check (the workloads' prompts are shorter)."""
SIDE_BY_SIDE = 2
"""KV caches a suite holds at once in a size check: each times two runs of the same rows side by side."""


def check_sizes(cfg: BenchConfig, model: ModelConfig) -> None:
    """ValueError naming the key, before any work, when a suite's rows could not hold their KV caches in the memory
    available (``PROMPT_ROOM`` prompt tokens and the suite's new tokens a row, whole pages, ``SIDE_BY_SIDE``
    caches): a size of 10**5 or 10**9 ran for many minutes, growing, and ended in an out-of-memory or an error
    naming engine keys."""
    sizes = {
        "plain_vs_hf": ("bench.batch_sizes", max(cfg.batch_sizes), cfg.new_tokens),
        "long_tail": ("bench.long_tail_requests", cfg.long_tail_requests, cfg.long_tail_max_new_tokens),
        "prefix_sharing": (
            "bench.prefix_sharing_prompts x max(bench.prefix_sharing_group_sizes)",
            cfg.prefix_sharing_prompts * max(cfg.prefix_sharing_group_sizes),
            1,
        ),
        "kv_memory": ("bench.kv_memory_requests", cfg.kv_memory_requests, 1),
    }
    if "kv_memory" in cfg.suites and max(cfg.kv_memory_new_tokens) >= model.max_position_embeddings:
        raise ValueError(
            f"bench.kv_memory_new_tokens={list(cfg.kv_memory_new_tokens)}: {max(cfg.kv_memory_new_tokens)} leaves no "
            f"room for a prompt in the model's {model.max_position_embeddings} positions; give at most "
            f"{model.max_position_embeddings - 1}"
        )
    dtype = torch.float32  # the suites run the policy as it loads
    page = EngineConfig().page_size
    for suite, (key, rows, new_tokens) in sizes.items():
        if suite in cfg.suites:
            length = min(model.max_position_embeddings, PROMPT_ROOM + new_tokens)
            check_kv_memory(key, model, rows, dtype, cfg.device, SIDE_BY_SIDE * page * math.ceil(length / page))


def output_files(cfg: BenchConfig) -> dict[str, str]:
    """Every file the run writes, by name: ``output``, and with the long-tail suite the round costs and the bandit's
    and EMA's run stats and plots beside it, named after the output (``bench.json`` -> ``bench.round_costs.json``,
    ``bench.long_tail_bandit.json``), so two outputs in one directory keep their own. In a Hydra multirun each job
    writes its own files (``bench.job3.json``, ``bench.round_costs.job3.json``), which would otherwise be
    overwritten job after job."""
    output = Path(cfg.output)
    job = multirun_job()
    tag = "" if job is None else f".job{job}"
    files = {"output": job_file(cfg.output)}
    if "long_tail" in cfg.suites:
        files["round_costs"] = str(output.with_name(f"{output.stem}.round_costs{tag}.json"))
        for selector in ("bandit", "ema"):
            if selector in cfg.long_tail_selectors:
                stats = output.with_name(f"{output.stem}.long_tail_{selector}{tag}")
                files[f"long_tail_{selector}"] = f"{stats}.json"
                files[f"long_tail_{selector}_plot"] = f"{stats}.png"
    return files


def _run_bench(cfg: BenchConfig, model_dir: Path, targets: GuardedOutputs) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ValueError(f"fastrl bench tokenizes its prompts and needs a tokenizer in {model_dir}")
    model = load_model(model_dir, device=cfg.device)
    drafter = None
    if {"spec_bs1", "long_tail", "groups_bs1"} & set(cfg.suites):  # a bad drafter before any suite runs
        drafter = resolve_drafter(cfg.drafter, model_dir, model, needed=True)
    payload: dict[str, Any] = {
        "model": cfg.model or str(model_dir),
        "model_dir": str(model_dir),
        "workload": cfg.workload,
        "device": cfg.device,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "suites": [s for s in SUITES if s in cfg.suites],
    }
    done: list[str] = []
    ctx = SuiteContext(cfg, model_dir, model, tokenizer, drafter, targets)
    try:
        for suite in payload["suites"]:
            SUITE_RUNS[suite](ctx, payload)
            done.append(suite)
            if suite != payload["suites"][-1] and targets["output"].regular:
                _write(targets["output"], payload | {"incomplete": f"finished {done}; the run goes on"})
    except BaseException as err:  # Ctrl-C or a failing suite: what finished is kept
        if done:
            why = "interrupted" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
            _write(targets["output"], payload | {"incomplete": f"finished {done}; stopped: {why}"})
            print(f"fastrl bench: the finished suites {done} are in {targets['output'].given}", file=sys.stderr)
        raise
    _write(targets["output"], payload)
    return payload


def _write(target: OutputTarget, payload: dict[str, Any]) -> None:
    write_text(target, json_text(payload))
