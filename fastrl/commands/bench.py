"""`fastrl bench`: print a table of decoding throughput and write it as JSON."""

from __future__ import annotations

import platform
from dataclasses import asdict
from typing import Any

import torch

from fastrl.assets_path import bundled_model_dir
from fastrl.bench.plain_vs_hf import bench_plain_vs_hf
from fastrl.bench.report import format_table, write_json
from fastrl.bench.workload import task_prompts
from fastrl.commands.bench_config import BenchConfig
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the plain-decoding comparison at each batch size; returns the JSON payload."""
    from transformers import AutoModelForCausalLM

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model_dir = cfg.model or str(bundled_model_dir())
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ValueError(f"fastrl bench draws task prompts and needs a tokenizer in {model_dir}")
    model = load_model(model_dir, device=cfg.device)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(cfg.device).eval()
    prompts = task_prompts(tokenizer, max(cfg.batch_sizes), cfg.seed)
    rows = []
    for bs in cfg.batch_sizes:
        row = bench_plain_vs_hf(
            model, hf_model, prompts, bs, cfg.new_tokens, cfg.repeats, tokenizer.pad_token_id or 0, cfg.device
        )
        rows.append(row)
        print(f"bs={bs}: fastrl {row.fastrl_tok_s:.0f} tok/s, HF {row.hf_tok_s:.0f} tok/s", flush=True)
    print(
        "\nplain decoding (greedy), tokens/s, median of "
        f"{cfg.repeats}; device {cfg.device}, {torch.get_num_threads()} threads\n"
        + format_table(
            ["batch", "new_tokens", "fastrl tok/s", "HF tok/s", "fastrl/HF"],
            [[r.batch_size, r.new_tokens, r.fastrl_tok_s, r.hf_tok_s, r.ratio] for r in rows],
        )
    )
    payload = {
        "benchmark": "plain_vs_hf",
        "model": model_dir,
        "device": cfg.device,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
    }
    write_json(cfg.output, payload)
    return payload
