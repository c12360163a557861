"""The engine inputs of a prompts file's lines (ids, sampling keys, seeds, GRPO-style samples), and the EMA
controller's JSON file: what `fastrl generate` and `fastrl check-exact` read the same way."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fastrl.adaptive.ema_config import EmaConfig
from fastrl.commands.decode_config import DecodeConfig
from fastrl.commands.prompt_tokens import PromptLimits, line_token_ids
from fastrl.commands.prompts_io import PromptLine
from fastrl.engine.engine import GenerateInput
from fastrl.json_values import read_json
from fastrl.sampling.params import MAX_SEED, SamplingParams

SAMPLE_SEED_STRIDE = 1_000_003  # seeds of a line's samples: its seed + j * stride


def read_ema_json(path: str) -> EmaConfig:
    """The EMA controller's settings from an SGLang JSON file; ValueError naming ``ema_json`` and the file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"ema_json={path}: {_not_a_file(file)}")
    values = read_json(file, f"ema_json={path}")
    try:
        return EmaConfig.from_json(values if isinstance(values, dict) else path)
    except (TypeError, ValueError) as err:
        raise ValueError(f"ema_json={path}: {err}") from None


def _not_a_file(file: Path) -> str:
    """Why ``file``, which is no regular file, cannot be read as one."""
    if file.is_dir():
        return "is a directory"
    return "is not a regular file" if file.exists() else "file not found"


def to_generate_inputs(
    line: PromptLine, cfg: DecodeConfig, tokenizer: Any, limits: PromptLimits
) -> list[GenerateInput]:
    """The `cfg.n` engine inputs of one prompt line (a GRPO-style group: one prompt, n seeds). Sample 0 has the
    line's seed; sample j has seed + j * SAMPLE_SEED_STRIDE (mod 2**63). With n = 1 the request id is the line
    number, else "line/j". A prompt the policy cannot run (`limits`) is an error naming the line, before any work."""
    first = to_generate_input(line, cfg, tokenizer, limits)
    if cfg.n == 1:
        return [first]
    return [
        GenerateInput(
            first.prompt_ids,
            dataclasses.replace(first.params, seed=(first.params.seed + j * SAMPLE_SEED_STRIDE) % MAX_SEED),
            request_id=f"{first.request_id}/{j}",
        )
        for j in range(cfg.n)
    ]


def to_generate_input(line: PromptLine, cfg: DecodeConfig, tokenizer: Any, limits: PromptLimits) -> GenerateInput:
    """The engine input of one prompt line: its ids (see ``line_token_ids``, checked against `limits`) and the
    sampling keys of `cfg`; without a "seed" of its own the line's seed is `cfg.seed` + its index among the prompt
    lines (blank lines do not count)."""
    where = f"{cfg.prompts}:{line.line_no}"
    ids = line_token_ids(line, tokenizer, cfg.chat_template, where, cfg.model or "the bundled model")
    limits.check(ids, where)
    seed = line.seed if line.seed is not None else (cfg.seed + line.index) % MAX_SEED
    params = SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        seed=seed,
    )
    return GenerateInput(prompt_ids=ids, params=params, request_id=str(line.line_no))
