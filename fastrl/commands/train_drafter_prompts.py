"""`fastrl train-drafter prompts=FILE`: fit the drafter to the policy's own responses to the prompts of a file
(chat-templated for chat models), rather than to bundled-task rollouts."""

from __future__ import annotations

import random
from typing import Any

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.commands.prompt_tokens import line_token_ids
from fastrl.commands.prompts_io import read_prompts
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.cotrain.accept_eval import AcceptResult
from fastrl.cotrain.offline import OfflineDrafterReport, fit_drafter
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.models.tokenizer import has_chat_template
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter


def file_prompt_ids(path: str, tokenizer: Any, chat_template: bool) -> list[list[int]]:
    """Token ids of every prompt of a prompts JSONL file: "prompt" text as one user turn through the tokenizer's
    chat template (when `chat_template` and the tokenizer has one), else tokenized as is; "messages" through the
    chat template; "prompt_ids" as given."""
    lines = read_prompts(path)
    if not lines:
        raise ValueError(f"train_drafter.prompts={path}: the file holds no prompts")
    chat = chat_template and has_chat_template(tokenizer)
    return [line_token_ids(line, tokenizer, chat, f"{path}:{line.line_no}") for line in lines]


def sample_responses(
    policy: CausalLM, prompts: list[list[int]], temperatures: list[float], cfg: TrainDrafterConfig, seed: int
) -> list[list[int]]:
    """Prompt + response ids of request i = prompt i % len(prompts) at temperatures[i // len(prompts) % len]: one
    pass over the prompts per temperature, all in one batched engine."""
    count = len(prompts) * len(temperatures)
    inputs = [
        GenerateInput(
            prompts[i % len(prompts)],
            SamplingParams(
                max_new_tokens=cfg.max_new_tokens,
                temperature=temperatures[i // len(prompts)],
                seed=seed * 100003 + i,
            ),
        )
        for i in range(count)
    ]
    engine = Engine(policy, engine_config(prompts, cfg.gen_batch_size, cfg))
    outs = engine.generate(inputs, progress=True)
    return [o.prompt_ids + o.token_ids for o in outs]


def engine_config(prompts: list[list[int]], batch_size: int, cfg: TrainDrafterConfig) -> EngineConfig:
    """An engine config whose KV cache holds the longest prompt plus max_new_tokens (not the model's whole context:
    SmolLM2's 8192 positions would cost 377 MB of float32 KV cache per slot)."""
    max_model_len = max(len(p) for p in prompts) + cfg.max_new_tokens + 1
    return EngineConfig(max_batch_size=batch_size, max_model_len=max_model_len, device=cfg.device)


def accept_length(
    policy: CausalLM,
    drafter: EagleDrafter,
    prompts: list[list[int]],
    strategy: str,
    temperature: float,
    cfg: TrainDrafterConfig,
) -> float:
    """Token-weighted mean tokens per request per speculative round (accepted drafts + 1) over `prompts`."""
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=temperature, seed=i))
        for i, p in enumerate(prompts)
    ]
    engine = Engine(policy, engine_config(prompts, 16, cfg), drafter=drafter, selector=FixedSelector(strategy))
    engine.generate(inputs)
    rows = sum(s.batch_size for s in engine.round_stats)
    return sum(sum(s.accepted_tokens) for s in engine.round_stats) / rows + 1.0 if rows else 0.0


def split_prompts(prompts: list[list[int]], cfg: TrainDrafterConfig) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) prompts after a seeded shuffle; the held-out part has eval_prompts of them."""
    if len(prompts) <= cfg.eval_prompts:
        raise ValueError(
            f"train_drafter.eval_prompts={cfg.eval_prompts} leaves no training prompts of the {len(prompts)} in "
            f"{cfg.prompts}"
        )
    order = list(range(len(prompts)))
    random.Random(cfg.seed).shuffle(order)
    held = [prompts[i] for i in order[: cfg.eval_prompts]]
    train = [prompts[i] for i in order[cfg.eval_prompts :]][: cfg.num_prompts]
    return train, held


def train_on_prompts(
    policy: CausalLM, drafter: EagleDrafter, tokenizer: Any, cfg: TrainDrafterConfig
) -> OfflineDrafterReport:
    """Sample the policy's responses to the file's prompts (each training prompt once per rollout temperature),
    restrict the drafter to the draft_vocab_size most frequent tokens of those rollouts (when > 0), fit `drafter` in
    place on their features, evaluate on held-out prompts and measure accept lengths there."""
    torch.manual_seed(cfg.seed)
    temperatures = list(cfg.rollout_temperatures) or [cfg.temperature]
    train_prompts, held_prompts = split_prompts(file_prompt_ids(cfg.prompts, tokenizer, cfg.chat_template), cfg)
    print(f"{len(train_prompts)} training prompts x temperatures {temperatures}, {len(held_prompts)} held out")
    train_ids = sample_responses(policy, train_prompts, temperatures, cfg, cfg.seed)
    eval_ids = sample_responses(policy, held_prompts, temperatures, cfg, cfg.seed + 1)
    epochs, train = fit_drafter(policy, drafter, train_ids, eval_ids, cfg)
    accept = []
    for temperature in (0.0, cfg.temperature):
        for strategy in cfg.accept_strategies:
            length = accept_length(policy, drafter, held_prompts[: cfg.accept_requests], strategy, temperature, cfg)
            accept.append(AcceptResult(strategy, temperature, length))
            print(f"accept length {strategy} T={temperature}: {length:.2f}", flush=True)
    return OfflineDrafterReport(epochs, accept, len(train), sum(s.num_targets for s in train))
