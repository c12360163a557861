"""`fastrl generate`: complete the prompts of a JSONL file with the engine."""

from __future__ import annotations

import sys
from typing import Any

import torch

from fastrl.commands.engine_setup import build_engine, resolve_model_dir
from fastrl.commands.generate_config import GenerateConfig
from fastrl.commands.prompts_io import PromptLine, read_prompts, write_jsonl
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import GenerateInput
from fastrl.engine.request import RequestOutput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.sampling.params import SamplingParams
from fastrl.telemetry.run_stats import write_run_plot, write_run_stats


def run_generate(cfg: GenerateConfig) -> list[dict[str, Any]]:
    """Load the model, generate for every prompt line and write the output file; returns the records."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model_dir = resolve_model_dir(cfg.model)
    lines = read_prompts(cfg.prompts)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    engine_config = EngineConfig(max_batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype)
    ema = cfg.ema_json or cfg.ema
    engine = build_engine(model, model_dir, cfg.strategy, cfg.drafter, engine_config, bandit=cfg.bandit, ema=ema)
    inputs = [to_generate_input(line, cfg, tokenizer) for line in lines]
    outputs = engine.generate(inputs, progress=cfg.progress)
    records = [_to_record(out, tokenizer) for out in outputs]
    write_jsonl(cfg.output, records)
    if cfg.stats_output:
        write_run_stats(cfg.stats_output, engine.round_stats, cfg.strategy, engine.policy)
    if cfg.plot_output:
        write_run_plot(cfg.plot_output, engine.round_stats, cfg.strategy, engine.policy)
    errors = [out.error for out in outputs if out.error]
    for error in errors:
        print(f"fastrl generate: {error}", file=sys.stderr)
    return records


def to_generate_input(line: PromptLine, cfg: GenerateConfig, tokenizer: Any) -> GenerateInput:
    """The engine input of one prompt line: its ids (tokenized text or given ids) and the sampling keys of `cfg`."""
    if line.prompt_ids is not None:
        ids = line.prompt_ids
    elif tokenizer is None:
        raise ValueError(
            f'{cfg.prompts}:{line.line_no}: "prompt" text needs a tokenizer, and {cfg.model or "the model"} has none; '
            'give "prompt_ids" instead'
        )
    else:
        ids = tokenizer(line.prompt)["input_ids"]
    seed = line.seed if line.seed is not None else cfg.seed + line.line_no - 1
    params = SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        seed=seed,
    )
    return GenerateInput(prompt_ids=ids, params=params, request_id=str(line.line_no))


def _to_record(out: RequestOutput, tokenizer: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "prompt_ids": out.prompt_ids,
        "token_ids": out.token_ids,
        "logprobs": out.logprobs,
        "finish_reason": out.finish_reason.value if out.finish_reason else None,
        "seed": out.seed,
        "accept_lengths": out.accept_lengths,
    }
    if tokenizer is not None:
        record["text"] = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    if out.error:
        record["error"] = out.error
    return record
